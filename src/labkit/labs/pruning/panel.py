"""Section 6 of notebook 04: what its panel runs (a pruned, maybe recovered, copy of the fine-tuned model)."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field

from ... import measure, results, train
from ...config import RunConfig
from ...env import env_report, profile
from ...errors import ConfigError
from ...inference import accuracy, example_batch, latencies
from ...messages import wrap
from ...techniques import pruning
from ...validate import is_int
from .channels import recover
from .common import fine_tuned, nonzero_params

METHODS = ("unstructured", "structured")


@dataclass
class PruneRun:
    """One panel run: a pruned (and maybe recovered) copy of the fine-tuned model, measured."""

    config: dict
    method: str
    amount: float
    recovery_steps: int
    sparsity: float
    num_params: int
    nonzero_params: int
    latency_s: float
    test_accuracy: float
    model_size_bytes: int
    dense_params: int
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        """The run as one row of the panel's table; ``params_removed``: channels removed or weights zeroed."""
        row = {k: v for k, v in asdict(self).items() if k not in ("config", "warnings")}
        return {**row, "seed": self.config.get("seed"), "params_removed": 1 - self.nonzero_params / self.dense_params}

    def __str__(self) -> str:
        return wrap(f"{self.method} at {self.amount:.0%}, {self.recovery_steps} recovery steps: {self.sparsity:.0%} "
                    f"zeros, {self.nonzero_params:,} nonzero of {self.num_params:,} parameters, latency "
                    f"{self.latency_s * 1e3:.3g} ms, test accuracy {self.test_accuracy:.1%}")


def panel_run(cfg: RunConfig, method: str = "unstructured", amount: float = 0.5, recovery_steps: int = 0,
              on_step=None, progress: bool = False) -> PruneRun:
    """Prune the fine-tuned model of ``cfg`` (unstructured: masks kept while recovering), fine-tune it
    ``recovery_steps`` steps (0: none), and measure it."""
    if method not in METHODS:
        raise ConfigError("method", method, f"one of {list(METHODS)}")
    amount = pruning.check_amount(amount)
    if not is_int(recovery_steps) or recovery_steps < 0:
        raise ConfigError("recovery_steps", recovery_steps, "an integer >= 0 (0: no recovery fine-tune)")
    untimed = profile().warmup_steps + train.PROFILING_STEPS
    if 0 < recovery_steps <= untimed:
        raise ConfigError("recovery_steps", recovery_steps,
                          f"0 or more than {untimed} (the run's untimed warm-up and profiling steps)")
    model, result = fine_tuned(cfg, progress=progress)
    x = example_batch(cfg)
    if method == "structured":
        pruned = pruning.prune_channels(model, amount, x[:2])
    else:
        pruned = pruning.l1_unstructured(copy.deepcopy(model), amount, permanent=False)
    warnings = list(result.warnings)
    if recovery_steps:
        warnings += recover(pruned, cfg, recovery_steps, on_step=on_step).warnings
    pruning.make_permanent(pruned)
    return PruneRun(config=cfg.to_dict(), method=method, amount=amount, recovery_steps=recovery_steps,
                    sparsity=pruning.sparsity(pruned).overall, num_params=measure.count_parameters(pruned)[0],
                    nonzero_params=nonzero_params(pruned), latency_s=latencies([pruned], x)[0],
                    test_accuracy=accuracy(pruned, cfg, "test"), model_size_bytes=measure.model_size_bytes(pruned),
                    warnings=sorted(set(warnings)), dense_params=measure.count_parameters(model)[0])


def panel_estimate(cfg: RunConfig) -> str | None:
    """The panel's time line, from the cached fine-tune of ``cfg`` (None when it is not cached)."""
    key = results.cache_key(cfg, env_report(cfg.device))
    path = results.results_dir() / f"{key}.json"
    if not path.exists() or not (results.results_dir() / f"{key}.pt").exists():
        return None
    cached = results.RunResult.from_dict(json.loads(path.read_text()))
    return (f"Estimated time: a few seconds to prune and measure, plus about {cached.step_time_s * 1e3:.0f} ms per "
            f"recovery step (the cached fine-tune's step time on this machine).")

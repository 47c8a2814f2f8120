"""Section 4 of notebook 05: frozen stages whose BatchNorm layers stay in training mode are not frozen."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import models, results, train
from ...config import RunConfig
from ...env import env_report, profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...result import RunResult
from ...runsetup import set_up
from ...techniques.freezing import LEVELS, freeze, frozen_stages, is_frozen_batchnorm


@dataclass
class BatchNormDemo(LabResult):
    """`batchnorm_demo`'s rows: frozen with BatchNorm kept in eval mode (first), and with requires_grad_(False) only."""

    shown = ("variant", "frozen_weight_change", "running_mean_change", "feature_change_fraction", "accuracy")
    level: str = "head_only"

    @worded
    def finding(self) -> str:
        good, bad = self.frame.iloc[0], self.frame.iloc[1]
        acc = compare(*(Measured.accuracy(row["accuracy"], int(row["test_size"])) for row in (bad, good)))
        return (f"With requires_grad_(False) alone the frozen BatchNorm running means moved by up to "
                f"{bad['running_mean_change']:.3g} and the frozen body's output by "
                f"{bad['feature_change_fraction']:.1%} (kept in eval mode: {good['running_mean_change']:g} and "
                f"{good['feature_change_fraction']:.1%}); accuracy {bad['accuracy']:.1%} against "
                f"{good['accuracy']:.1%} ({acc.difference * 100:+.1f} points, {acc.verdict}).")


def _bn_demo_run(cfg: RunConfig, level: str, batchnorm_eval: bool, progress: bool) -> dict:
    s = set_up(cfg)
    freeze(s.model, level, batchnorm_eval=batchnorm_eval)
    stages = dict(models.named_stages(s.model))
    names = frozen_stages(s.model, level)
    batchnorms = [m for name in names for m in stages[name].modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    means = [bn.running_mean.clone() for bn in batchnorms]
    weights = [p.detach().clone() for name in names for p in stages[name].parameters()]
    trainer = train.Trainer(cfg.replace(freeze=None), model=s.model)
    probe = s.batch().images

    def body_output() -> torch.Tensor:
        was = trainer.model.training
        trainer.model.eval()
        with torch.no_grad():
            h, now = probe, dict(models.named_stages(trainer.model))
            for name in names:
                h = now[name](h)
        trainer.model.train(was)
        return h.float()

    before = body_output()
    result = trainer.run(progress=progress)
    after = body_output()
    now = dict(models.named_stages(trainer.model))
    frozen_now = [p.detach() for name in names for p in now[name].parameters()]
    return {
        "result": result.to_dict(),
        "running_mean_change": max((float((bn.running_mean.cpu() - m.cpu()).abs().max())
                                    for bn, m in zip(batchnorms, means, strict=True)), default=0.0),
        "feature_change": float((after - before).norm() / before.norm()),
        "frozen_weight_change": max((float((a.cpu() - b.cpu()).abs().max())
                                     for a, b in zip(frozen_now, weights, strict=True)), default=0.0),
        "kept_in_eval": all(is_frozen_batchnorm(bn) for bn in batchnorms),
    }


def batchnorm_demo(cfg: RunConfig, level: str = "head_only", refresh: bool = False,
                   progress: bool = True) -> BatchNormDemo:
    """Freeze ``cfg``'s model at ``level`` twice, as labkit does and with ``requires_grad_(False)`` alone, fine-tune
    both and measure how far the frozen running statistics and features moved. Cached."""
    if level in (None, "none") or level not in LEVELS:
        raise ConfigError("level", level, f"a level that freezes something: one of {list(LEVELS[1:])}")
    if not models.has_batchnorm(models.build(cfg.model, 2, pretrained=False)[0]):
        raise ConfigError("model", cfg.model, "a model with BatchNorm layers")
    rows = []
    env = env_report(cfg.device)
    for variant, keep in (("BatchNorm kept in eval mode (labkit)", True), ("requires_grad_(False) only", False)):
        key = f"{results.cache_key(cfg.replace(freeze=level), env)}-bn-demo-{'eval' if keep else 'train'}"
        record = results.cached_record(key, lambda keep=keep: _bn_demo_run(cfg, level, keep, progress), refresh)
        result = RunResult.from_dict(record["result"])
        rows.append({"variant": variant, "running_mean_change": record["running_mean_change"],
                     "feature_change_fraction": record["feature_change"],
                     "frozen_weight_change": record["frozen_weight_change"], "accuracy": result.accuracy,
                     "step_time_s": result.step_time_s, "test_size": profile().test_size, "error": result.error})
    return BatchNormDemo(pd.DataFrame(rows), level=level)

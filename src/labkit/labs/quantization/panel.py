"""Notebook 06, section 5: the panel's run, one model quantized by one method, against its fp32 self."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

from ... import display, measure
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...inference import accuracy, example_batch, latencies
from ...messages import wrap
from ...validate import is_int
from . import workload
from .methods import TABLE_METHODS, build
from .workload import CALIBRATION_BATCHES, VIT, calibration_batches, extra_steps, fine_tuned


@dataclass
class QuantRun:
    """One panel run: one model quantized by one method, measured against its fp32 self."""

    config: dict
    model: str
    method: str
    calibration_batches: int
    model_size_bytes: int
    fp32_size_bytes: int
    cpu_latency_s: float
    fp32_cpu_latency_s: float
    test_accuracy: float
    fp32_test_accuracy: float
    threads: int
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        """The run as one table row."""
        row = {k: v for k, v in asdict(self).items() if k not in ("config", "warnings")}
        row["size_vs_fp32"] = self.model_size_bytes / self.fp32_size_bytes
        row["cpu_speedup"] = self.fp32_cpu_latency_s / self.cpu_latency_s
        return row

    def __str__(self) -> str:
        return wrap(f"{self.model} {self.method}: file {display.quantity('model_size_bytes', self.model_size_bytes)} "
                    f"({self.model_size_bytes / self.fp32_size_bytes:.0%} of fp32), CPU latency "
                    f"{display.number(self.cpu_latency_s * 1e3)} ms "
                    f"({self.fp32_cpu_latency_s / self.cpu_latency_s:.2f}x fp32's "
                    f"speed, {self.threads} threads), test accuracy {self.test_accuracy:.1%} (fp32 "
                    f"{self.fp32_test_accuracy:.1%})")


def panel_run(cfg: RunConfig, model: str = VIT, method: str = "int8_dynamic", calibration: int = CALIBRATION_BATCHES,
              on_step=None, progress: bool = False) -> QuantRun:
    """Quantize a fine-tuned model by one method on the CPU and measure it against its fp32 self.

    Args:
        cfg: gives the random seed. model: a key of `workloads`. method: one of `TABLE_METHODS`.
        calibration: calibration batches (static int8). on_step: unused (the panel's hook). progress: bars.
    """
    choices = workload.workloads()
    if model not in choices:
        raise ConfigError("model", model, f"one of {list(choices)}")
    if method not in TABLE_METHODS:
        raise ConfigError("method", method, f"one of {list(TABLE_METHODS)}")
    if not is_int(calibration) or calibration < 1:
        raise ConfigError("calibration", calibration, "a positive integer (calibration batches)")
    cfg = choices[model].replace(seed=cfg.seed)
    fp32, result = fine_tuned(cfg, progress=progress)
    fp32 = copy.deepcopy(fp32).cpu().eval()
    built = build(fp32, method, cfg, calibration_batches(cfg, calibration))
    if built.model is None:
        raise ConfigError("method", method, f"a method that runs on this machine's CPU: {built.reason}")
    x = example_batch(cfg, profile().latency_batch, device=torch.device("cpu"))
    fp32_s, quant_s = latencies([fp32, built.model], x)
    return QuantRun(config=cfg.to_dict(), model=cfg.model, method=method, calibration_batches=calibration,
                    model_size_bytes=measure.model_size_bytes(built.model),
                    fp32_size_bytes=measure.model_size_bytes(fp32), cpu_latency_s=quant_s, fp32_cpu_latency_s=fp32_s,
                    test_accuracy=accuracy(built.model, cfg, "test"), fp32_test_accuracy=accuracy(fp32, cfg, "test"),
                    threads=torch.get_num_threads(), warnings=list(result.warnings))


def panel_estimate(cfg: RunConfig) -> str:
    """The panel's time line (the fine-tunes are cached after the notebook's first run).

    Args:
        cfg: the panel's base config.
    """
    return ("Estimated time: a few seconds once both fine-tunes are cached (the notebook's first run does that); "
            f"int8_qat fine-tunes {extra_steps()} more steps first, fp16 on a CPU without fp16 arithmetic is slow.")

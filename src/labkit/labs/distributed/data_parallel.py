"""Notebook 07, section 1: ``nn.DataParallel`` (one process, threads, a main GPU) against DDP (a process per GPU).

With two or more GPUs the two are measured at the same global batch; with fewer nothing is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ... import display, machine, models, train
from ...config import RunConfig
from ...env import resolve_device
from ...messages import worded
from ...result import RunResult
from .jobs import launch, time_verdict

# A figure repeated in forum threads and blog posts about DataParallel, with no measurement behind it that we could
# cite: not measured here, and never shown as if it were. PyTorch's documentation recommends DDP instead.
CLAIMED_DP_DDP = {"setup": "4 x V100", "DataParallel_hours": 8.0, "DDP_hours": 1.5}
TABLE_COLUMNS = ("method", "gpus", "step_time_s", "throughput", "peak_memory_bytes", "accuracy")


def _mib(nbytes: float) -> str:
    return display.quantity("peak_memory_bytes", nbytes)


def data_parallel_fit(cfg: RunConfig, progress: bool = True) -> RunResult:
    """``fit(cfg)`` with the model in ``nn.DataParallel`` in this process: one process, every visible GPU.

    Without GPUs the wrapper just calls the model (no replicas).

    Args:
        cfg: the run. progress: show the bar.
    """
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, train.run_splits(cfg)["train"].num_classes, pretrained=cfg.pretrained)[0]
    return train.fit(cfg, model=torch.nn.DataParallel(model), progress=progress)


@dataclass
class DataParallelComparison:
    """DataParallel against DDP on this machine's GPUs (`dp_vs_ddp`); ``frame`` is None with fewer than two."""

    gpus: int
    frame: pd.DataFrame | None

    @worded
    def finding(self) -> str:
        """One line: what was measured, or why nothing was."""
        if self.frame is None:
            where = f"this machine has {self.gpus}" if self.gpus < 2 else "this run is on the CPU"
            return f"DataParallel against DDP needs at least 2 GPUs; {where}: nothing measured here."
        dp, ddp = self.frame.iloc[0], self.frame.iloc[1]
        claim = CLAIMED_DP_DDP["DataParallel_hours"] / CLAIMED_DP_DDP["DDP_hours"]
        return (f"On {self.gpus} GPUs: DDP {ddp.throughput / dp.throughput:.2f}x DataParallel's throughput "
                f"({time_verdict(ddp, dp)}); GPU 0's peak memory {_mib(dp.peak_memory_bytes)} with DataParallel, "
                f"{_mib(ddp.peak_memory_bytes)} per GPU with DDP (the claim that circulates: {claim:.1f}x on "
                f"{CLAIMED_DP_DDP['setup']}).")

    def table(self):
        """The measured rows as a table for Jupyter; None (nothing shown) without a measurement."""
        return None if self.frame is None else display.table(self.frame, list(TABLE_COLUMNS))


def dp_vs_ddp(cfg: RunConfig, progress: bool = True) -> DataParallelComparison:
    """Measure DataParallel and DDP on every GPU here at the same global batch (two or more GPUs).

    The DDP job runs first (torchrun starts fresh processes), DataParallel after it, in this process.

    Args:
        cfg: the run. progress: show the bars.
    """
    gpus = machine.here().gpu_count
    if gpus < 2 or resolve_device(cfg.device).type != "cuda":
        return DataParallelComparison(gpus, None)
    ddp = launch(cfg, nproc=gpus, progress=progress)
    dp = data_parallel_fit(cfg, progress=progress)
    rows = [{"method": name, "gpus": gpus, "step_time_s": r.step_time_s, "step_time_p10_s": r.step_time_p10_s,
             "step_time_p90_s": r.step_time_p90_s, "throughput": r.throughput, "peak_memory_bytes": r.peak_memory_bytes,
             "accuracy": r.accuracy} for name, r in (("DataParallel", dp), ("DDP", ddp))]
    return DataParallelComparison(gpus, pd.DataFrame(rows))

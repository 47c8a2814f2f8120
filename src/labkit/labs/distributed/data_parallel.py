"""Notebook 07, section 1: ``nn.DataParallel`` against DDP, where there are two or more GPUs."""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd
import torch

from ... import display, machine, train
from ...config import RunConfig
from ...env import resolve_device
from ...labresult import LabResult
from ...launcher import launch
from ...messages import worded
from ...result import RunResult
from ...runsetup import set_up
from .jobs import step_times

# A figure repeated in forum threads and blog posts about DataParallel, with no measurement behind it that we could
# cite: not measured here, and never shown as if it were. PyTorch's documentation recommends DDP instead.
CLAIMED_DP_DDP = dict(setup="4 x V100", DataParallel_hours=8.0, DDP_hours=1.5)


def data_parallel_fit(cfg: RunConfig, progress: bool = True) -> RunResult:
    """``fit(cfg)`` with the model in ``nn.DataParallel`` over every visible GPU (without GPUs: the model itself)."""
    return train.fit(cfg, model=torch.nn.DataParallel(set_up(cfg).model), progress=progress)


@dataclass
class DataParallelComparison(LabResult):
    shown = ("method", "gpus", "step_time_s", "throughput", "peak_memory_bytes", "accuracy")
    gpus: int = 0

    @worded
    def finding(self) -> str:
        if self.frame is None:
            where = f"this machine has {self.gpus}" if self.gpus < 2 else "this run is on the CPU"
            return f"DataParallel against DDP needs at least 2 GPUs; {where}: nothing measured here."
        dp, ddp = self.frame.iloc[0], self.frame.iloc[1]
        mib = display.quantity
        return (f"On {self.gpus} GPUs: DDP {ddp.throughput / dp.throughput:.2f}x DataParallel's throughput "
                f"({step_times(ddp, dp).verdict}); GPU 0's peak memory {mib('peak_memory_bytes', dp.peak_memory_bytes)}"
                f" with DataParallel, {mib('peak_memory_bytes', ddp.peak_memory_bytes)} per GPU with DDP (the claim "
                f"that circulates: {CLAIMED_DP_DDP['DataParallel_hours'] / CLAIMED_DP_DDP['DDP_hours']:.1f}x on "
                f"{CLAIMED_DP_DDP['setup']}).")

    def table(self):
        return None if self.frame is None else super().table()

    def _repr_html_(self) -> str:
        return super()._repr_html_() if self.frame is not None else f"<p>{html.escape(str(self.finding()))}</p>"

    def text(self) -> str:
        return super().text() if self.frame is not None else str(self.finding())


def dp_vs_ddp(cfg: RunConfig, progress: bool = True) -> DataParallelComparison:
    """DataParallel and DDP on every GPU here at the same global batch (two or more GPUs)."""
    gpus = machine.here().gpu_count
    if gpus < 2 or resolve_device(cfg.device).type != "cuda":
        return DataParallelComparison(None, gpus=gpus)
    ddp = launch(cfg, nproc=gpus, progress=progress)
    dp = data_parallel_fit(cfg, progress=progress)
    rows = [dict(method=name, gpus=gpus, step_time_s=r.step_time_s, step_time_p10_s=r.step_time_p10_s,
                 step_time_p90_s=r.step_time_p90_s, throughput=r.throughput, peak_memory_bytes=r.peak_memory_bytes,
                 accuracy=r.accuracy) for name, r in (("DataParallel", dp), ("DDP", ddp))]
    return DataParallelComparison(pd.DataFrame(rows), gpus=gpus)

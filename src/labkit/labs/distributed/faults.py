"""Notebook 07, section 5: a rank made to fail on purpose, and how the job ends."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from ...config import RunConfig
from ...errors import DistributedError
from ...labresult import LabResult
from ...launcher import launch
from ...messages import worded
from ...techniques import distributed


@dataclass
class FaultDemo(LabResult):
    shown = ("fail_how", "rank_named", "exit_code", "elapsed_s", "timeout_s")
    error: DistributedError | None = None

    @property
    def elapsed_s(self) -> float:
        return float(self.frame.elapsed_s.iloc[0])

    @worded
    def finding(self) -> str:
        return f"The job named rank {self.error.rank}:\n  {self.error}"


def fault_demo(cfg: RunConfig, nproc: int = 2, fail_rank: int = 1, fail_step: int = 3, how: str = "raise",
               timeout_s: float = distributed.DEFAULT_TIMEOUT_S, progress: bool = True) -> FaultDemo:
    """Rank ``fail_rank`` made to raise, exit or hang after step ``fail_step``: how the job ends, and when."""
    start = time.perf_counter()
    try:
        launch(cfg, nproc=nproc, fail_rank=fail_rank, fail_step=fail_step, fail_how=how, timeout_s=timeout_s,
               progress=progress)
    except DistributedError as error:  # the job's own time: a cached failure comes back at once
        row = dict(fail_how=how, rank_named=error.rank, exit_code=error.exit_code,
                   elapsed_s=error.elapsed_s or time.perf_counter() - start, timeout_s=timeout_s)
        return FaultDemo(pd.DataFrame([row]), error=error)
    raise DistributedError(f"rank {fail_rank} was told to fail after step {fail_step}, yet the job finished")

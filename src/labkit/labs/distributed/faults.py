"""Notebook 07, section 5: a rank made to fail on purpose, and how the job ends (by torchrun, or by the timeout)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...config import RunConfig
from ...errors import DistributedError
from ...messages import worded
from ...techniques import distributed
from .jobs import launch


@dataclass
class FaultDemo:
    """A job with one rank failed on purpose (`fault_demo`)."""

    how: str
    error: DistributedError
    elapsed_s: float
    timeout_s: float

    @worded
    def finding(self) -> str:
        """How long the job took to end, and what it said."""
        return (f"fail_how={self.how!r}: the job ended after {self.elapsed_s:.1f} s (process-group timeout "
                f"{self.timeout_s:g} s), exit code {self.error.exit_code}, naming rank {self.error.rank}:\n"
                f"  {self.error}")


def fault_demo(cfg: RunConfig, nproc: int = 2, fail_rank: int = 1, fail_step: int = 3, how: str = "raise",
               timeout_s: float = distributed.DEFAULT_TIMEOUT_S, progress: bool = True) -> FaultDemo:
    """Make rank ``fail_rank`` raise, exit or hang after step ``fail_step``, and time how the job ends.

    Args:
        cfg: the run. nproc: processes. fail_rank, fail_step: which rank fails, after which step.
        how: ``raise``, ``exit`` or ``hang``. timeout_s: the process group's timeout. progress: show the bar.

    Example:
        >>> print(fault_demo(workload(), how="hang", timeout_s=5).finding())
    """
    start = time.perf_counter()
    try:
        launch(cfg, nproc=nproc, fail_rank=fail_rank, fail_step=fail_step, fail_how=how, timeout_s=timeout_s,
               progress=progress)
    except DistributedError as error:  # the job's own time: a cached failure comes back at once
        return FaultDemo(how, error, error.elapsed_s or time.perf_counter() - start, timeout_s)
    raise DistributedError(f"rank {fail_rank} was told to fail after step {fail_step}, yet the job finished")

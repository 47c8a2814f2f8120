"""Notebook 07, section 6: FSDP2 where a copy per GPU no longer fits."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ...capacity import training_memory
from ...config import RunConfig
from ...labresult import LabResult
from ...launcher import launch
from ...messages import worded
from ...ranks import jobs_frame, loss_gap
from ...techniques import distributed
from .jobs import step_times

FSDP_WORLD_SIZES = (2, 4, 8, 16)


@dataclass
class Sharding(LabResult):
    shown = ("strategy", "parameter_bytes", "optimizer_state_bytes", "peak_memory_bytes", "step_time_s", "comm_share")

    @worded
    def finding(self) -> str:
        ddp, fsdp = self.frame.iloc[0], self.frame.iloc[1]
        n, steps = int(fsdp.world_size), step_times(fsdp, ddp)
        return (f"Per rank, FSDP held {fsdp.parameter_bytes / ddp.parameter_bytes:.0%} of DDP's parameter bytes and "
                f"{fsdp.optimizer_state_bytes / ddp.optimizer_state_bytes:.0%} of its optimizer state (1/{n} = "
                f"{1 / n:.0%}); its steps took {steps.ratio:.2f}x DDP's ({steps.verdict}); the losses differ by at "
                f"most {loss_gap(ddp.losses, fsdp.losses):.1e}.")


def fsdp_comparison(cfg: RunConfig, nproc: int = 2, progress: bool = True) -> Sharding:
    """The same job with DDP (a whole copy per rank) and FSDP2 (1/N per rank)."""
    return Sharding(jobs_frame([launch(cfg, nproc=nproc, strategy=s, progress=progress)
                                for s in distributed.STRATEGIES]))


@dataclass
class Sizing(LabResult):
    shown = ("strategy", "gpus", "per_gpu_bytes", "fits")


def fsdp_sizing(num_params: float = 7e9, gpu_bytes: float = 16e9, precision: str = "fp32") -> Sizing:
    """Training memory per GPU with AdamW (no activations), whole (DDP) or sharded over N GPUs (FSDP)."""
    total = training_memory(num_params, precision=precision, optimizer="adamw")["total"]
    rows = [dict(strategy="DDP (a copy per GPU)", gpus=1, per_gpu_bytes=total, fits=total <= gpu_bytes)]
    rows += [dict(strategy="FSDP (1/N per GPU)", gpus=n, per_gpu_bytes=total / n, fits=total / n <= gpu_bytes)
             for n in FSDP_WORLD_SIZES]
    return Sizing(pd.DataFrame(rows))

"""Notebook 07, section 4: throughput against the number of processes, gradient buckets, and ``no_sync``."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ... import display
from ...config import RunConfig
from ...env import resolve_device
from ...labresult import LabResult
from ...launcher import launch, max_processes
from ...messages import worded
from ...ranks import jobs_frame, loss_gap
from ...techniques import distributed
from .jobs import step_times

NEAR_LINEAR = 0.85  # the efficiency from which the notebook calls scaling near-linear


def world_sizes(device_type: str, most: int = 8) -> tuple[int, ...]:
    """1, 2, 4, ... up to the processes this machine runs (at most ``most``)."""
    top, sizes = min(most, max_processes(device_type)), [1]
    while sizes[-1] * 2 <= top:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


@dataclass
class Scaling(LabResult):
    shown = ("world_size", "threads_per_rank", "step_time_s", "throughput", "efficiency", "comm_share",
             "launch_time_s")

    @worded
    def finding(self) -> str:
        base, last = self.frame.iloc[0], self.frame.iloc[-1]
        c = step_times(last, base)
        if c.direction < 0:
            verdict = "near-linear" if last.efficiency >= NEAR_LINEAR else "a real gain, less than linear"
        else:
            verdict = "slower than one process" if c.direction > 0 else f"no gain: {c.verdict}"
        comm = f"; all-reduces {last.comm_share:.0%} of a profiled step" if pd.notna(last.comm_share) else ""
        return (f"{int(last.world_size)} processes: {last.speedup:.2f}x one process's throughput, efficiency "
                f"{last.efficiency:.0%}: {verdict}{comm}.")


def scaling(cfg: RunConfig, sizes: tuple[int, ...] | None = None, progress: bool = True) -> Scaling:
    """Throughput against world size at the same global batch, speed-up and efficiency T1 / (N x TN)."""
    sizes = sizes or world_sizes(resolve_device(cfg.device).type)
    frame = jobs_frame([launch(cfg, nproc=n, progress=progress) for n in sizes])
    first = frame.iloc[0]
    frame["speedup"] = frame["throughput"] / first.throughput
    frame["efficiency"] = first.step_time_s / (frame["world_size"] * frame["step_time_s"])
    return Scaling(frame)


@dataclass
class Buckets(LabResult):
    shown = ("bucket_cap_mb", "allreduces_per_step", "allreduced_per_step_bytes", "step_time_s", "comm_share")

    @worded
    def finding(self) -> str:
        small, large = self.frame.iloc[0], self.frame.iloc[-1]
        ms = display.quantity
        return (f"{small.bucket_cap_mb:g} MB buckets: {small.allreduces_per_step:g} all-reduces a step, "
                f"{ms('step_time_s', small.step_time_s)}; {large.bucket_cap_mb:g} MB: {large.allreduces_per_step:g}, "
                f"{ms('step_time_s', large.step_time_s)}; the small buckets' steps: {step_times(small, large)}.")


def bucket_sweep(cfg: RunConfig, sizes=(0.25, distributed.DEFAULT_BUCKET_CAP_MB), nproc: int = 2,
                 progress: bool = True) -> Buckets:
    """The same job with DDP's gradient buckets at each size in MB."""
    return Buckets(jobs_frame([launch(cfg, nproc=nproc, bucket_cap_mb=size, progress=progress) for size in sizes]))


@dataclass
class Accumulation(LabResult):
    shown = ("grad_accum", "allreduces_per_step", "step_time_s", "final_loss")

    @worded
    def finding(self) -> str:
        plain, accumulated = self.frame.iloc[0], self.frame.iloc[1]
        a, b, k = plain.allreduces_per_step, accumulated.allreduces_per_step, accumulated.grad_accum
        verdict = "no_sync skipped the early micro-batches" if b <= a else "MORE: the early micro-batches synchronised"
        return (f"All-reduces per optimizer step: {a:g} at grad_accum=1, {b:g} at grad_accum={k} ({verdict}; "
                f"{a * k:g} without no_sync); the loss curves differ by at most "
                f"{loss_gap(plain.losses, accumulated.losses):.1e}.")


def accumulation(cfg: RunConfig, grad_accum: int = 2, nproc: int = 2, progress: bool = True) -> Accumulation:
    """The same job at ``grad_accum=1`` and at ``grad_accum``: all-reduces per optimizer step under no_sync."""
    return Accumulation(jobs_frame([launch(cfg.replace(grad_accum=k), nproc=nproc, progress=progress)
                                    for k in (1, grad_accum)]))

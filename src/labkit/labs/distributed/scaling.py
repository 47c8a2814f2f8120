"""Notebook 07, section 4: throughput against the number of processes, gradient buckets, and ``no_sync``.

Speed-up is the throughput against one process's; efficiency is T1 / (N x TN), T the time of one step of the
global batch. A difference in step time is called real only where the two jobs' p10-p90 spreads do not overlap.
"""

from __future__ import annotations

import pandas as pd

from ... import display
from ...config import RunConfig
from ...env import resolve_device
from ...messages import worded
from ...result import RunResult
from ...techniques import distributed
from .jobs import jobs_frame, launch, max_processes, time_verdict

NEAR_LINEAR = 0.85  # the efficiency from which the notebook calls scaling near-linear


def world_sizes(device_type: str, most: int = 8) -> tuple[int, ...]:
    """1, 2, 4, ... up to the processes this machine runs (at most ``most``).

    Args:
        device_type: ``cpu`` or ``cuda``. most: the largest world size wanted.
    """
    top = min(most, max_processes(device_type))
    sizes, n = [], 1
    while n <= top:
        sizes.append(n)
        n *= 2
    return tuple(sizes)


def scaling(cfg: RunConfig, sizes: tuple[int, ...] | None = None, progress: bool = True) -> pd.DataFrame:
    """Throughput against world size at the same global batch, with speed-up and efficiency T1 / (N x TN).

    Args:
        cfg: the run. sizes: the world sizes (default: `world_sizes`). progress: show the bars.
    """
    sizes = sizes or world_sizes(resolve_device(cfg.device).type)
    frame = jobs_frame([launch(cfg, nproc=n, progress=progress) for n in sizes])
    first = frame.iloc[0]
    frame["speedup"] = frame["throughput"] / first.throughput
    frame["efficiency"] = first.step_time_s / (frame["world_size"] * frame["step_time_s"])
    return frame


@worded
def scaling_finding(frame: pd.DataFrame) -> str:
    """One line: the largest world size against one process, and which outcome of the notebook's that was.

    Args:
        frame: `scaling`'s frame.
    """
    base, last = frame.iloc[0], frame.iloc[-1]
    verdict = time_verdict(last, base)
    if verdict == "faster":
        verdict = "near-linear" if last.efficiency >= NEAR_LINEAR else "a real gain, less than linear"
    elif verdict == "slower":
        verdict = "slower than one process"
    else:
        verdict = f"no gain: {verdict}"
    comm = f"; all-reduces {last.comm_share:.0%} of a profiled step" if pd.notna(last.comm_share) else ""
    return (f"{int(last.world_size)} processes: {last.speedup:.2f}x one process's throughput, efficiency "
            f"{last.efficiency:.0%}: {verdict}{comm}.")


@worded
def accumulation_finding(plain: RunResult, accumulated: RunResult) -> str:
    """One line: gradient all-reduces per optimizer step with and without gradient accumulation.

    Args:
        plain: a job at ``grad_accum=1``. accumulated: the same job with accumulation.
    """
    k = accumulated.config["grad_accum"]
    a = plain.distributed["ranks"][0]["allreduces_per_step"]
    b = accumulated.distributed["ranks"][0]["allreduces_per_step"]
    same = max(abs(x - y) for x, y in zip(plain.losses, accumulated.losses, strict=True))
    verdict = ("no_sync skipped the early micro-batches" if b <= a
               else "MORE: the early micro-batches synchronised too")
    return (f"All-reduces per optimizer step: {a:g} at grad_accum=1, {b:g} at grad_accum={k} ({verdict}; "
            f"{a * k:g} without no_sync); the loss curves differ by at most {same:.1e}.")


def bucket_sweep(cfg: RunConfig, sizes=(0.25, distributed.DEFAULT_BUCKET_CAP_MB), nproc: int = 2,
                 progress: bool = True) -> pd.DataFrame:
    """The same job with DDP's gradient buckets at each size in MB: all-reduces per step, step time.

    Args:
        cfg: the run. sizes: ``bucket_cap_mb`` values. nproc: processes. progress: show the bars.
    """
    return jobs_frame([launch(cfg, nproc=nproc, bucket_cap_mb=size, progress=progress) for size in sizes])


@worded
def bucket_finding(frame: pd.DataFrame) -> str:
    """One line: the smallest buckets against the largest, step times judged against their spreads.

    Args:
        frame: `bucket_sweep`'s frame.
    """
    small, large = frame.iloc[0], frame.iloc[-1]
    return (f"{small.bucket_cap_mb:g} MB buckets: {small.allreduces_per_step:g} all-reduces a step, "
            f"{display.number(small.step_time_s * 1e3)} ms; {large.bucket_cap_mb:g} MB: {large.allreduces_per_step:g}, "
            f"{display.number(large.step_time_s * 1e3)} ms; the small buckets were {time_verdict(small, large)}.")

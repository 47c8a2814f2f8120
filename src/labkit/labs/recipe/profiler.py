"""Section 4 of notebook 09: one training step under ``torch.profiler`` before and after mixed precision.

`profile_step` warms up, profiles one step of labkit's loop, groups the operators by kind of work (`op_kind`) and
writes a Chrome trace (chrome://tracing or https://ui.perfetto.dev).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ... import measure, train
from ...config import RunConfig
from ...data import cache_dir
from ...env import env_report, resolve_device
from ...messages import worded
from ...techniques.precision import low_precision_for, resolve_precision

PROFILE_TOP = 10  # operators in the profiler's table
TRACE_DIR = "traces"  # under the data cache: Chrome traces of the profiled steps


CASTS = "copies and casts"
OP_KINDS = (  # (kind, pattern on the operator's name, case ignored), first match wins
    ("matmul / convolution", r"conv|addmm|\bmm\b|aten::mm|bmm|matmul|linear|gemm|mkldnn"),
    (CASTS, r"aten::to$|_to_copy|aten::copy_|type_as|contiguous|clone"),
    ("normalization", r"norm"),
    ("optimizer", r"foreach|adam|optimizer|lerp|addcdiv|addcmul|sqrt|bitsandbytes|zero_"),
    ("elementwise / activation", r"relu|gelu|clamp|add|mul|sub|div|threshold|sigmoid|softmax|dropout|pool|mean|sum"),
)


def op_kind(name: str) -> str:
    """Which kind of work an operator is (`OP_KINDS`), else ``other``."""
    for kind, pattern in OP_KINDS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return kind
    return "other"


@dataclass
class ProfiledStep:
    """One training step under ``torch.profiler``.

    Attributes:
        precision: as resolved. ops: the top operators by self time. kinds: self time by `op_kind`.
        step_time_s: the profiled step, profiler overhead included. trace_path: a Chrome trace. device: its type.
    """

    precision: str
    ops: pd.DataFrame
    kinds: pd.DataFrame
    step_time_s: float
    trace_path: Path
    device: str


@contextlib.contextmanager
def quiet_native_output():
    """Drop what C++ writes to the process's stdout and stderr meanwhile.

    The profiler's library (Kineto) logs "profiler_start" and, on a CUDA build without a GPU, a harmless
    "gpuGetDeviceCount failed", which Jupyter would show as a red box.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def profiler_precision(cfg: RunConfig) -> str:
    """The mixed precision to profile against fp32: ``auto``'s, or where ``auto`` keeps fp32 (a P100, a CPU without
    native bf16) the one `low_precision_for` picks there: fp16 on a GPU (pre-Ampere GPUs emulate or refuse bf16).

    Args:
        cfg: the config whose device decides.
    """
    device = resolve_device(cfg.device)
    auto = resolve_precision("auto", device).name
    return auto if auto != "fp32" else low_precision_for(env_report(cfg.device))


def profile_step(cfg: RunConfig, precision: str | None = None, warmup_steps: int = 2,
                 top: int = PROFILE_TOP) -> ProfiledStep:
    """Train ``warmup_steps`` steps of ``cfg`` in ``precision``, then profile one more.

    Args:
        cfg: the config. precision: default ``cfg.precision``. warmup_steps: untimed steps first (the first
            steps allocate memory and pick kernels). top: operators kept in ``ops``.

    Example:
        >>> before = profile_step(cfg, "fp32"); before.kinds
    """
    cfg = cfg.replace(precision=precision or cfg.precision)
    trainer = train.Trainer(cfg)
    device = trainer.device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    batches = trainer.batches(warmup_steps + 1)
    for _ in range(warmup_steps):
        trainer.step(*next(batches))
    measure.synchronize(device)
    images, labels = next(batches)
    timer = measure.StepTimer(device)
    with quiet_native_output(), torch.profiler.profile(activities=activities) as prof:
        timer.start()
        trainer.step(images, labels)
        timer.stop()
        measure.synchronize(device)
    ops = pd.DataFrame(operator_rows(prof.key_averages(), device.type == "cuda"),
                       columns=["operator", "calls", "self_ms", "total_ms"])
    ops = ops[ops.self_ms > 0].sort_values("self_ms", ascending=False)
    ops["share"] = ops.self_ms / ops.self_ms.sum()
    ops["kind"] = ops.operator.map(op_kind)
    kinds = ops.groupby("kind", as_index=False).agg(self_ms=("self_ms", "sum"), operators=("operator", "count"))
    kinds["share"] = kinds.self_ms / kinds.self_ms.sum()
    trace = trace_folder() / f"{cfg.model}-bs{cfg.batch_size}-{trainer.precision.name}-{device.type}.json"
    with quiet_native_output():
        prof.export_chrome_trace(str(trace))
    return ProfiledStep(trainer.precision.name, ops.head(top).reset_index(drop=True),
                        kinds.sort_values("self_ms", ascending=False).reset_index(drop=True),
                        timer.times_s()[0], trace, device.type)


def operator_rows(events, on_gpu: bool) -> list[dict]:
    """One row per operator (``operator``, ``calls``, ``self_ms``, ``total_ms``) from ``prof.key_averages()``.

    On a GPU the time is the device's, read from the operators' rows only: the profiler also lists each kernel
    as a row of its own, whose time is already its operator's self device time (counted twice otherwise).

    Args:
        events: the profiler's averaged events. on_gpu: the step ran on a CUDA device.
    """
    if on_gpu:
        events = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]  # operators, not kernels
    return [{"operator": e.key, "calls": e.count,
             "self_ms": (e.self_device_time_total if on_gpu else e.self_cpu_time_total) / 1e3,
             "total_ms": (e.device_time_total if on_gpu else e.cpu_time_total) / 1e3} for e in events]


def trace_folder() -> Path:
    """Where the Chrome traces of profiled steps are written (under the data cache)."""
    folder = cache_dir() / TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def profile_pair(cfg: RunConfig, warmup_steps: int = 2) -> tuple[ProfiledStep, ProfiledStep]:
    """`profile_step` in fp32 and in `profiler_precision`."""
    return profile_step(cfg, "fp32", warmup_steps), profile_step(cfg, profiler_precision(cfg), warmup_steps)


def kinds_table(before: ProfiledStep, after: ProfiledStep) -> pd.DataFrame:
    """Self time by kind of operator in both steps: ``kind``, then ``<precision>_self_ms`` and ``<precision>_share``.

    Args:
        before, after: `profile_step`'s, in two precisions.
    """
    columns = ["kind", "self_ms", "share"]
    b, a = before.precision, after.precision
    both = before.kinds[columns].merge(after.kinds[columns], on="kind", how="outer", suffixes=("_b", "_a")).fillna(0.0)
    both = both.rename(columns={"self_ms_b": f"{b}_self_ms", "self_ms_a": f"{a}_self_ms", "share_b": f"{b}_share",
                                "share_a": f"{a}_share"})
    ordered = ["kind", f"{b}_self_ms", f"{a}_self_ms", f"{b}_share", f"{a}_share"]
    return both[ordered].sort_values(f"{b}_self_ms", ascending=False).reset_index(drop=True)


def kinds_frame(before: ProfiledStep, after: ProfiledStep) -> pd.DataFrame:
    """Both steps' self time by kind, long (``kind``, ``precision``, ``self_ms``, ``share``): a chart's rows."""
    return pd.concat([step.kinds.assign(precision=step.precision) for step in (before, after)], ignore_index=True)


@worded
def profile_finding(before: ProfiledStep, after: ProfiledStep) -> str:
    """One line: the two profiled steps' times, the largest kind of work in each, and the casts' share.

    Args:
        before, after: `profile_step`'s, in two precisions (one step each, profiler overhead included).
    """
    table = kinds_table(before, after).set_index("kind")
    b, a = before.precision, after.precision
    top_b, top_a = table[f"{b}_share"].idxmax(), table[f"{a}_share"].idxmax()
    casts = table.get(f"{b}_share").get(CASTS, 0.0), table.get(f"{a}_share").get(CASTS, 0.0)
    return (f"One profiled step ({before.device}): {b} {before.step_time_s * 1e3:.0f} ms, {a} "
            f"{after.step_time_s * 1e3:.0f} ms ({after.step_time_s / before.step_time_s:.2f}x); the largest kind of "
            f"work is {top_b} in {b} ({table.loc[top_b, f'{b}_share']:.0%}) and {top_a} in {a} "
            f"({table.loc[top_a, f'{a}_share']:.0%}); copies and casts {casts[0]:.0%} -> {casts[1]:.0%}.")

"""Section 4 of notebook 09: one training step of labkit's loop under ``torch.profiler``, in fp32 and in mixed
precision: its operators by kind of work (`op_kind`) and a Chrome trace (https://ui.perfetto.dev)."""

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
from torch.profiler import ProfilerActivity

from ... import measure, train
from ...config import RunConfig
from ...data import cache_dir
from ...env import env_report, resolve_device
from ...labresult import LabResult
from ...measure import compare
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
    """One profiled step: its resolved ``precision``, top operators (``ops``), self time by `op_kind` (``kinds``),
    time (profiler overhead included), Chrome trace and device type."""

    precision: str
    ops: pd.DataFrame
    kinds: pd.DataFrame
    step_time_s: float
    trace_path: Path
    device: str


@contextlib.contextmanager
def quiet_native_output():
    """Drop what C++ writes to stdout and stderr meanwhile: Kineto's "profiler_start" and, on a CUDA build without a
    GPU, "gpuGetDeviceCount failed", which Jupyter would show as a red box."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    with tempfile.TemporaryFile() as sink:
        for fd in (1, 2):
            os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)


def profiler_precision(cfg: RunConfig) -> str:
    """The mixed precision to profile against fp32: ``auto``'s, or where that is fp32 (a P100, a CPU without native
    bf16) `low_precision_for`'s: fp16 on a GPU."""
    device = resolve_device(cfg.device)
    auto = resolve_precision("auto", device).name
    return auto if auto != "fp32" else low_precision_for(env_report(cfg.device))


def profile_step(cfg: RunConfig, precision: str | None = None, warmup_steps: int = 2,
                 top: int = PROFILE_TOP) -> ProfiledStep:
    """Train ``warmup_steps`` untimed steps of ``cfg`` in ``precision``, then profile one more; ``top`` operators."""
    cfg = cfg.replace(precision=precision or cfg.precision)
    trainer = train.Trainer(cfg)
    device = trainer.device
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
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
    """One row per operator (``operator``, ``calls``, ``self_ms``, ``total_ms``) from ``prof.key_averages()``; on a
    GPU the device's time, from the operators' rows only (each kernel's row repeats its operator's time)."""
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


@dataclass
class StepProfiles(LabResult):
    """Two profiled steps, ``before`` (fp32) and ``after`` (mixed precision); ``frame``: self time by kind in both
    (``kind``, ``<precision>_self_ms``, ``<precision>_share``)."""

    before: ProfiledStep
    after: ProfiledStep

    def long(self) -> pd.DataFrame:
        """Both steps' self time by kind, long (``kind``, ``precision``, ``self_ms``, ``share``): a chart's rows."""
        return pd.concat([s.kinds.assign(precision=s.precision) for s in (self.before, self.after)], ignore_index=True)

    @worded
    def finding(self) -> str:
        table = self.frame.set_index("kind")
        before, after = self.before, self.after
        b, a = before.precision, after.precision
        top_b, top_a = table[f"{b}_share"].idxmax(), table[f"{a}_share"].idxmax()
        casts = table[f"{b}_share"].get(CASTS, 0.0), table[f"{a}_share"].get(CASTS, 0.0)
        time = compare(after.step_time_s, before.step_time_s, ("faster", "slower"))
        return (f"One profiled step ({before.device}): {b} {before.step_time_s * 1e3:.0f} ms, {a} "
                f"{after.step_time_s * 1e3:.0f} ms: {time}; the largest kind of work is {top_b} in {b} "
                f"({table.loc[top_b, f'{b}_share']:.0%}) and {top_a} in {a} ({table.loc[top_a, f'{a}_share']:.0%}); "
                f"copies and casts {casts[0]:.0%} -> {casts[1]:.0%}.")


def _kinds_table(before: ProfiledStep, after: ProfiledStep) -> pd.DataFrame:
    b, a = before.precision, after.precision
    both = before.kinds.merge(after.kinds, on="kind", how="outer", suffixes=(f"_{b}", f"_{a}")).fillna(0.0)
    both = both.rename(columns={f"{c}_{p}": f"{p}_{c}" for c in ("self_ms", "share") for p in (b, a)})
    ordered = ["kind", f"{b}_self_ms", f"{a}_self_ms", f"{b}_share", f"{a}_share"]
    return both[ordered].sort_values(f"{b}_self_ms", ascending=False).reset_index(drop=True)


def profile_pair(cfg: RunConfig, warmup_steps: int = 2) -> StepProfiles:
    """`profile_step` in fp32 and in `profiler_precision`."""
    before, after = profile_step(cfg, "fp32", warmup_steps), profile_step(cfg, profiler_precision(cfg), warmup_steps)
    return StepProfiles(_kinds_table(before, after), before=before, after=after)

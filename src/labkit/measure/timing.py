"""Time as it should be measured: warm-up excluded, GPU work synchronised before a clock is read (CUDA events),
the median and spread of the timed steps (`StepTimer`, `measure_latency`), and the usual mistakes timed on
purpose (`timing_pitfalls`)."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch


class StepTimer:
    """Times a sequence of steps. CUDA: events around each step, read after one synchronise.

    Example:
        >>> timer = StepTimer(torch.device("cpu"))
        >>> timer.start(); work(); timer.stop()
        >>> timer.times_s()
    """

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self._pending: list = []
        self._start = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end))
        else:
            self._pending.append(time.perf_counter() - self._start)

    def times_s(self) -> list[float]:
        """Every step's time in seconds (synchronises the GPU first)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [start.elapsed_time(end) / 1e3 for start, end in self._pending]
        return list(self._pending)


def spread(times_s: list[float]) -> tuple[float, float, float]:
    """(median, 10th percentile, 90th percentile) of ``times_s``; NaNs when empty."""
    if not times_s:
        nan = float("nan")
        return nan, nan, nan
    if len(times_s) == 1:
        return times_s[0], times_s[0], times_s[0]
    deciles = statistics.quantiles(times_s, n=10, method="inclusive")
    return statistics.median(times_s), deciles[0], deciles[-1]


def in_turns(calls: dict, repeats: int, device) -> dict:
    """Each of ``calls`` timed ``repeats`` times, one of each per round, so that a busy moment of the machine slows
    all alike: per key, the ``(median, p10, p90)`` seconds (`StepTimer`: a GPU is synchronised). Warm up first.

    Example:
        >>> in_turns({"a": f, "b": g}, repeats=10, device=torch.device("cpu"))["a"]
        (0.0102, 0.0099, 0.0110)
    """
    timers = {key: StepTimer(device) for key in calls}
    for _ in range(repeats):
        for key, call in calls.items():
            timers[key].start()
            call()
            timers[key].stop()
    return {key: spread(timer.times_s()) for key, timer in timers.items()}


def ratio_band(a, b) -> tuple[float, float]:
    """The range of ``a / b`` that two measured spreads allow: ``(a_low / b_high, a_high / b_low)``.

    Args:
        a, b: ``(low, high)`` pairs, e.g. two runs' ``(step_time_p10_s, step_time_p90_s)``.

    Example:
        >>> ratio_band((0.9, 1.1), (1.8, 2.2))
        (0.409..., 0.611...)
    """
    return a[0] / b[1], a[1] / b[0]


def separated(a, b) -> int | None:
    """Whether two measured spreads lie apart: -1 when ``a`` lies wholly below ``b``, 1 above, 0 when they overlap.

    None when either is missing (None, NaN) or has no width (one timing, or equal ones): there is no measured noise
    to call a difference real by.

    Args:
        a, b: ``(low, high)`` pairs, e.g. a run's ``(step_time_p10_s, step_time_p90_s)``.

    Example:
        >>> separated((0.9, 1.1), (1.3, 1.5)), separated((0.9, 1.4), (1.3, 1.5))
        (-1, 0)
    """
    values = [*a, *b]
    if any(v is None or v != v for v in values) or a[0] == a[1] or b[0] == b[1]:
        return None
    if a[1] < b[0]:
        return -1
    return 1 if a[0] > b[1] else 0


def synchronize(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    """Reset CUDA peak statistics only (keeps the cache, so the next step pays no new cudaMalloc)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def reset_memory(device: torch.device) -> None:
    """Start a clean CUDA measurement: collect garbage, empty the cache, reset peak statistics.

    On CPU there is nothing to reset: labkit's CPU peak comes from the memory tracker's own count.
    """
    if torch.device(device).type == "cuda":
        gc.collect()  # drop unreachable tensors so that empty_cache can return their blocks
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


_LIBRARIES_READY: set = set()


def warm_up_libraries(device: torch.device) -> None:
    """Have cuBLAS/cuBLASLt allocate their workspaces now (forward and backward threads), once per GPU and process.

    The first matrix multiply on a GPU allocates a workspace (several MiB, more on Hopper) that stays
    allocated for the life of the process. Read before it, a run's baseline would miss it and the
    first run of a session would report it as part of its own peak memory. On CPU: nothing to do.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key in _LIBRARIES_READY:
        return
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        try:
            a = torch.ones(16, 16, device=device, dtype=dtype, requires_grad=True)
            out = torch.nn.functional.linear(a, a, a[0]) @ a  # addmm (cuBLASLt), then mm (cuBLAS)
            # autograd runs the backward on a thread of its own, and cuBLAS keeps a workspace per thread:
            # warm that one up too, or a process's first fit counts it as its own.
            out.sum().backward()
        except RuntimeError:  # e.g. bf16 GEMMs on a GPU without bf16 support
            pass
    torch.cuda.synchronize(device)
    _LIBRARIES_READY.add(key)


@dataclass
class Latency:
    """Inference latency over ``repeats`` timed calls after ``warmup`` untimed ones."""

    median_s: float
    p10_s: float
    p90_s: float
    times_s: list = field(repr=False, default_factory=list)


@torch.no_grad()
def measure_latency(model: torch.nn.Module, inputs: torch.Tensor, warmup: int = 5, repeats: int = 20) -> Latency:
    """Median inference latency of ``model(inputs)`` in eval mode, warm-up excluded, GPU synchronised.

    Example:
        >>> lat = measure_latency(model, torch.randn(1, 3, 32, 32), warmup=5, repeats=50)
        >>> lat.median_s
    """
    was_training = model.training
    model.eval()
    timer = StepTimer(inputs.device)
    for _ in range(warmup):
        model(inputs)
    synchronize(inputs.device)
    for _ in range(repeats):
        timer.start()
        model(inputs)
        timer.stop()
    model.train(was_training)
    times = timer.times_s()
    median, p10, p90 = spread(times)
    return Latency(median, p10, p90, times)


@dataclass
class TimingPitfalls:
    """The same call timed four ways, to show why warm-up and synchronisation matter.

    Attributes:
        first_call_s: the very first call (includes one-off costs: allocation, kernel selection).
        warm_median_s: median over ``repeats`` calls after warm-up, synchronised: the right number.
        unsynced_median_s: median read from the host clock without synchronising. On a GPU this
            measures only the kernel *launch*, not the work; on CPU there is nothing to synchronise.
        device: where it ran.
    """

    first_call_s: float
    warm_median_s: float
    unsynced_median_s: float
    device: str
    repeats: int
    warm_p10_s: float = math.nan  # the spread (10th-90th percentile) of the synchronised readings
    warm_p90_s: float = math.nan
    unsynced_p10_s: float = math.nan  # and of the unsynchronised ones
    unsynced_p90_s: float = math.nan

    @property
    def cold_vs_warm(self) -> float:
        return self.first_call_s / self.warm_median_s

    @property
    def unsynced_vs_synced(self) -> float:
        return self.unsynced_median_s / self.warm_median_s

    def to_frame(self):
        """The three readings as a DataFrame (``method``, ``time_s``) for `labkit.plots.bar`."""
        return pd.DataFrame({"method": ["first call", "warm, synchronised", "warm, not synchronised"],
                             "time_s": [self.first_call_s, self.warm_median_s, self.unsynced_median_s]})


def timing_pitfalls(fn: Callable[[], object], device: torch.device, warmup: int = 3,
                    repeats: int = 10) -> TimingPitfalls:
    """Time ``fn`` cold, then warm with and without synchronising, alternately (one of each per repeat), so that
    on a busy machine both readings see the same load.

    Example:
        >>> tp = timing_pitfalls(lambda: model(x).sum().backward(), torch.device("cpu"))
        >>> tp.cold_vs_warm
    """
    device = torch.device(device)
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - start
    for _ in range(warmup):
        fn()
    timer, unsynced = StepTimer(device), []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        unsynced.append(time.perf_counter() - start)  # deliberately wrong on a GPU: no synchronise
        synchronize(device)
        timer.start()
        fn()
        timer.stop()
    (warm, warm_p10, warm_p90), (plain, plain_p10, plain_p90) = spread(timer.times_s()), spread(unsynced)
    return TimingPitfalls(first, warm, plain, device.type, repeats, warm_p10, warm_p90, plain_p10, plain_p90)

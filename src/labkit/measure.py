"""How labkit measures: step timers, peak memory and its breakdown, FLOPs, model size, latency.

Rules every number follows: warm-up is excluded; GPU work is synchronised before a time is read
(CUDA events); peak memory comes from the allocator (``max_memory_allocated``), never from the
cache (``memory_reserved``), and on CPU from an exact accounting of live tensors.
"""

from __future__ import annotations

import gc
import io
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch

from .result import MEMORY_CATEGORIES

# ---------------------------------------------------------------------------------------------
# Time


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
    """Have cuBLAS/cuBLASLt allocate their workspaces now, once per GPU and process.

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
            a = torch.ones(16, 16, device=device, dtype=dtype)
            torch.nn.functional.linear(a, a, a[0])  # addmm: the cuBLASLt path
            a @ a  # mm: the cuBLAS path
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


@torch.no_grad()
def inference_peak_bytes(model: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Peak memory of one no-grad forward of ``model(inputs)`` in eval mode: the model's parameters and buffers
    plus the most the forward allocated at once (activations, temporaries; the input is not counted).

    CUDA: ``max_memory_allocated`` over the forward, above what was allocated before it. CPU: torch's
    MemTracker counts the live tensors. Pruning masks count (they are buffers), and so do the weights a
    pruning hook recomputes in every forward.

    Example:
        >>> inference_peak_bytes(model, torch.randn(64, 3, 32, 32)) / 2**20
    """
    was_training = model.training
    model.eval()
    seen, model_bytes = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            model_bytes += t.untyped_storage().nbytes()
    try:
        if inputs.device.type == "cuda":
            torch.cuda.synchronize(inputs.device)
            before = torch.cuda.memory_allocated(inputs.device)
            torch.cuda.reset_peak_memory_stats(inputs.device)
            model(inputs)
            torch.cuda.synchronize(inputs.device)
            return model_bytes + int(torch.cuda.max_memory_allocated(inputs.device)) - before
        tracker = _memory_tracker_class()()  # torch's MemTracker, made to accept frozen parameters
        tracker.track_external(model)
        with tracker:
            model(inputs)
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()), {})
        return int(peak.get("Total", model_bytes))
    finally:
        model.train(was_training)


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


def timing_pitfalls(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 10) -> TimingPitfalls:
    """Time ``fn`` cold, warm+synchronised and warm+unsynchronised (host clock only).

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
    synchronize(device)
    unsynced = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        unsynced.append(time.perf_counter() - start)  # deliberately wrong on a GPU: no synchronise
        synchronize(device)
    timer = StepTimer(device)
    for _ in range(repeats):
        timer.start()
        fn()
        timer.stop()
    return TimingPitfalls(first, spread(timer.times_s())[0], spread(unsynced)[0], device.type, repeats)


# ---------------------------------------------------------------------------------------------
# Memory

_CATEGORY_OF = {
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "other",
    "Other": "other",
}


@dataclass
class MemoryBreakdown:
    """Memory of one training step by category, in bytes.

    Attributes:
        peak_by_category: each category's own peak during the step (activations peak at the end of
            the forward pass, optimizer state during ``step()``; these peaks happen at different moments).
        at_peak: the composition at the moment of the total peak (may show few activations).
        total_peak_bytes: the highest total of tracked tensors during the step.
        note: why the breakdown is missing, if it is.
    """

    peak_by_category: dict = field(default_factory=dict)
    at_peak: dict = field(default_factory=dict)
    total_peak_bytes: int | None = None
    note: str | None = None


def _memory_tracker_class():
    from torch.distributed._tools.mem_tracker import MemTracker

    class _CategoryPeakTracker(MemTracker):
        """MemTracker that also keeps each category's own running peak, per device."""

        def __init__(self):
            super().__init__()
            self.category_peaks: dict = {}

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            # torch's tracker puts a gradient hook on every parameter, and a frozen one (requires_grad=False,
            # notebook 05) refuses it with a RuntimeError: mark frozen parameters as hooked already. They get
            # no gradient, so there is nothing for a hook to count.
            handles = getattr(self, "_param_to_grad_hook_handles", None)
            if handles is not None:
                for param in module.parameters():
                    if not param.requires_grad and handles.get(param, None) is None:
                        handles[param] = (_NoHook(), _NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state) -> None:  # called after every tracked op
            super()._update_peak_stats(peak_state)
            for dev, snap in self._curr_mem_snap.items():
                peaks = self.category_peaks.setdefault(dev, {})
                for ref, nbytes in snap.items():
                    key = getattr(ref, "value", ref)
                    if nbytes > peaks.get(key, 0):
                        peaks[key] = nbytes

    return _CategoryPeakTracker


class _NoHook:
    """The stand-in hook handle of a frozen parameter in the memory tracker: nothing to remove."""

    def remove(self) -> None:
        pass


_active_tracker = None


def new_micro_batch() -> None:
    """Tell the memory tracker (if one is active) that the model is about to run again in this step.

    torch's MemTracker refuses a second forward of the same module in one tracking context, which
    gradient accumulation does; clearing its per-module stats between micro-batches is what it asks
    for, and leaves the per-category and total peaks intact.
    """
    if _active_tracker is not None:
        _active_tracker.reset_mod_stats()


def _by_category(raw: dict) -> dict:
    out = dict.fromkeys(MEMORY_CATEGORIES, 0)
    for key, nbytes in raw.items():
        name = getattr(key, "value", key)
        if name in _CATEGORY_OF:
            out[_CATEGORY_OF[name]] += int(nbytes)
    return out


def _same_device(a, b: torch.device) -> bool:
    a = torch.device(a)
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    if a.index is not None and b.index is not None:
        return a.index == b.index
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def track_step_memory(step: Callable[[], object], model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer, device: torch.device | str = "cpu") -> MemoryBreakdown:
    """Run ``step()`` once under torch's MemTracker and return the memory breakdown on ``device``.

    Works on CPU and CUDA. Parameters include buffers; ``other`` holds the temporaries of the backward
    pass and of ``optimizer.step()``. Tensors on other devices (AdamW's CPU step counters when training
    on a GPU) are left out. If the tracker fails (it is a private torch API), the step still runs,
    untracked, and ``note`` says why.
    """
    device = torch.device(device)
    try:
        tracker = _memory_tracker_class()()
        tracker.track_external(model, optimizer)
    except Exception as exc:  # noqa: BLE001 - the tracker is optional; we report why it is missing
        step()
        return MemoryBreakdown(note=f"memory breakdown unavailable ({type(exc).__name__}: {exc})")
    global _active_tracker
    _active_tracker = tracker
    try:
        with tracker:
            step()
    except Exception as exc:  # noqa: BLE001 - a failure of the tracker must not end the run
        if isinstance(exc, (ArithmeticError, MemoryError)) or "out of memory" in str(exc).lower():
            raise  # the step itself failed: that is the run's error, not the tracker's
        optimizer.zero_grad(set_to_none=True)
        step()
        return MemoryBreakdown(note=f"memory breakdown unavailable ({type(exc).__name__}: {exc})")
    finally:
        _active_tracker = None
    raw_peak = next((snap for dev, snap in tracker.get_tracker_snapshot("peak").items()
                     if _same_device(dev, device)), {})
    raw_category_peaks = next((peaks for dev, peaks in tracker.category_peaks.items()
                               if _same_device(dev, device)), {})
    at_peak = _by_category(raw_peak)
    peaks = _by_category(raw_category_peaks)
    # MemTracker files everything allocated inside optimizer.step() as optimizer state, including the
    # step's temporaries (foreach buffers). Keep "optimizer_state" for the persistent state, which we
    # can count exactly, and move the temporaries to "other".
    # bitsandbytes' paged state lives in CUDA unified memory behind CPU tensors: the tracker files it under
    # the CPU, so it is added back here, on the GPU it belongs to.
    state = optimizer_state_bytes(optimizer, device)
    paged = optimizer_state_bytes(optimizer, device, paged_only=True)
    for split in (peaks, at_peak):
        temporaries = max(0, split["optimizer_state"] - (state - paged))
        split["optimizer_state"] += paged - temporaries
        split["other"] = max(split["other"], temporaries) if split is peaks else split["other"] + temporaries
    return MemoryBreakdown(peak_by_category=peaks, at_peak=at_peak,
                           total_peak_bytes=int(raw_peak.get("Total", sum(at_peak.values()))))


def _state_device(value: torch.Tensor) -> torch.device:
    """Where a state tensor's memory is: a bitsandbytes paged tensor is a CPU tensor over CUDA unified memory."""
    if getattr(value, "is_paged", False):
        return torch.device("cuda", getattr(value, "page_deviceid", None))
    return value.device


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, device: torch.device | str | None = None,
                          paged_only: bool = False) -> int:
    """Bytes of the optimizer's persistent state tensors (e.g. AdamW's exp_avg and exp_avg_sq) on ``device``.

    Tensors shared between parameters (bitsandbytes' quantisation maps) count once. bitsandbytes' paged
    state counts on the GPU it is paged for; ``paged_only`` counts only that. Sharded (FSDP) state counts
    this rank's shard.
    """
    seen, total = set(), 0
    for state in optimizer.state.values():
        for value in state.values():
            if not torch.is_tensor(value) or (paged_only and not getattr(value, "is_paged", False)):
                continue
            if hasattr(value, "to_local"):  # a sharded (FSDP) state: this rank holds its local shard
                value = value.to_local()
            if device is not None and not _same_device(_state_device(value), torch.device(device)):
                continue
            if value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                total += value.untyped_storage().nbytes()
    return total


def allocated_now(device: torch.device) -> int:
    """Bytes in live tensors on a CUDA device right now (0 on CPU, where labkit counts per step)."""
    return int(torch.cuda.memory_allocated(device)) if torch.device(device).type == "cuda" else 0


def cuda_peak_memory(device: torch.device) -> tuple[int, int]:
    """(max_memory_allocated, max_memory_reserved) since the last `reset_memory`."""
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


# ---------------------------------------------------------------------------------------------
# FLOPs, size, parameters


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs of running ``step()`` once (matmuls and convolutions, forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


# Dense datasheet peaks in FLOP/s by GPU and the dtype of the matmuls. "fp32" is plain FP32 (CUDA
# cores); "tf32" is float32 with TF32 tensor cores (Ampere+). Sparsity figures are not used. Where a
# PCIe card differs from the SXM one, the PCIe row is matched first ("Tesla V100-PCIE-16GB").
PEAK_FLOPS = {
    "T4": {"fp32": 8.1e12, "fp16": 65e12},
    "P100 PCIE": {"fp32": 9.3e12, "fp16": 18.7e12},
    "P100": {"fp32": 10.6e12, "fp16": 21.2e12},
    "V100 PCIE": {"fp32": 14e12, "fp16": 112e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12},
    "L4": {"fp32": 30.3e12, "tf32": 60e12, "fp16": 121e12, "bf16": 121e12},
    "A10": {"fp32": 31.2e12, "tf32": 62.5e12, "fp16": 125e12, "bf16": 125e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
    "H100 PCIE": {"fp32": 51e12, "tf32": 378e12, "fp16": 756e12, "bf16": 756e12},
    "H100 NVL": {"fp32": 60e12, "tf32": 418e12, "fp16": 835e12, "bf16": 835e12},
    "H100": {"fp32": 67e12, "tf32": 494e12, "fp16": 989e12, "bf16": 989e12},
    "H200": {"fp32": 67e12, "tf32": 494e12, "fp16": 989e12, "bf16": 989e12},
}


def peak_flops(gpu_name: str | None, precision: str, tf32: bool = False) -> float | None:
    """Datasheet peak FLOP/s of ``gpu_name`` for ``precision`` (fp32/fp16/bf16); None when unknown.

    Example:
        >>> peak_flops("Tesla T4", "fp16")
        65000000000000.0
    """
    if not gpu_name:
        return None
    key = "tf32" if precision == "fp32" and tf32 else precision
    tokens = gpu_name.upper().replace("-", " ").split()  # "Tesla P100-PCIE-16GB" -> [..., "P100", "PCIE", ...]
    for name, table in PEAK_FLOPS.items():  # more specific rows come first
        if all(part in tokens for part in name.split()):
            return table.get(key, table["fp32"] if key == "tf32" else None)
    return None


def model_size_bytes(model: torch.nn.Module) -> int:
    """Size of the serialised ``state_dict`` (what ``torch.save`` writes), in bytes."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


def _weights_in(p: torch.Tensor) -> int:
    # bitsandbytes packs two 4-bit weights into a byte and keeps the real shape in the tensor's quant_state
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    return math.prod(shape) if shape is not None else p.numel()


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts; a 4-bit weight counts its real number of weights."""
    total = sum(_weights_in(p) for p in model.parameters())
    trainable = sum(_weights_in(p) for p in model.parameters() if p.requires_grad)
    return total, trainable


def accuracy_noise(accuracy: float, test_size: int) -> float:
    """The smallest accuracy difference between two runs that is not test-set noise (about 95 % confidence).

    Two accuracies measured on ``test_size`` images each differ by chance with a standard error of about
    sqrt(2 p (1 - p) / test_size); twice that is the threshold. It ignores seed-to-seed variation of the
    training itself, so it is a lower bound.
    """
    p = min(max(float(accuracy), 1 / test_size), 1 - 1 / test_size)
    return 2 * math.sqrt(2 * p * (1 - p) / test_size)

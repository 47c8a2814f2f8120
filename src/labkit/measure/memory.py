"""Peak memory from the allocator (``max_memory_allocated``), never the cache, and on a CPU an exact count of live
tensors; the breakdown by category of one step (`track_step_memory`), optimizer state, inference peaks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..result import MEMORY_CATEGORIES


@torch.no_grad()
def inference_peak_bytes(model: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Peak memory of one no-grad forward of ``model(inputs)`` in eval mode, its parameters and buffers included.

    That is the model's parameters and buffers plus the most the forward allocated at once (activations,
    temporaries; the input is not counted). CUDA: ``max_memory_allocated`` over the forward, above what was
    allocated before it. CPU: torch's MemTracker counts the live tensors. Pruning masks count (they are
    buffers), and so do the weights a pruning hook recomputes in every forward.

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


def with_untracked(breakdown: MemoryBreakdown, category: str, size: int, what: str) -> MemoryBreakdown:
    """``breakdown`` with ``size`` bytes that lived through the whole step but that the tracker cannot see (allocated
    before it started, outside the model and optimizer it registers) added to ``category``, and said in its note."""
    if not size or breakdown.total_peak_bytes is None:
        return breakdown
    add = lambda parts: {**parts, category: parts.get(category, 0) + size}  # noqa: E731
    note = f"{what} ({size} bytes) added: allocated before the step, unseen by the tracker"
    return MemoryBreakdown(add(breakdown.peak_by_category), add(breakdown.at_peak), breakdown.total_peak_bytes + size,
                           "; ".join(n for n in (breakdown.note, note) if n))


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


def reserved_now(device: torch.device) -> int:
    """Bytes the CUDA caching allocator holds on a device right now (0 on CPU)."""
    return int(torch.cuda.memory_reserved(device)) if torch.device(device).type == "cuda" else 0


def _attached(value, depth: int = 2):
    """Tensors a quantized weight carries as attributes: bitsandbytes' ``quant_state`` (absmax, nested), ``SCB``."""
    if depth < 0 or not hasattr(value, "__dict__"):
        return
    for item in vars(value).values():
        if isinstance(item, torch.Tensor):
            yield item
        elif type(item).__name__ == "QuantState":
            yield from _attached(item, depth - 1)


def tensor_bytes(model: torch.nn.Module, device: torch.device | str) -> int:
    """Bytes of ``model``'s own tensors on ``device``: parameters, buffers and what quantized weights carry.

    Each storage counted once (tied weights share one). A run's peak counts these whatever device the model
    started on: read before the model moved, the memory already there is not the run's, but its model is.

    Args:
        model: any module. device: where to count.
    """
    device, seen, total = torch.device(device), set(), 0
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for p in model.parameters() for t in _attached(p)]
    for tensor in tensors:
        if not _same_device(tensor.device, device) or tensor.untyped_storage().data_ptr() in seen:
            continue
        seen.add(tensor.untyped_storage().data_ptr())
        total += tensor.untyped_storage().nbytes()
    return total


def cuda_peak_memory(device: torch.device) -> tuple[int, int]:
    """(max_memory_allocated, max_memory_reserved) since the last `reset_memory`."""
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))

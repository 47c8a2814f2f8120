"""The largest batch whose training step fits in a memory budget (`batch_search`, `find_max_batch_size`), or on
a GPU without a budget does not run out of memory, with the back-off of `labkit.techniques.oom_backoff`.

With ``budget_bytes`` (required on a CPU) a batch fits when the measured peak memory of one full
training step (forward, backward, optimizer step with its state; ``cfg``'s precision, optimizer and
``grad_accum``) is at most the budget. On CUDA without a budget a batch fits when the real step does
not run out of memory. Sizes are multiples of ``cfg.grad_accum`` (the search runs over micro-batch
sizes), at least 2 per micro-batch for models with BatchNorm. All probes share one model; inputs are
synthetic, so the result is not bounded by the training set's size.
"""

from __future__ import annotations

import time

from ..config import RunConfig
from ..env import resolve_device
from ..errors import ConfigError
from ..techniques.oom_backoff import DEFAULT_LIMIT, BatchSearch, Probe, index_safe_limit, search_batch_size
from ..units import mib
from ..validate import check_positive_int, is_int, is_number
from .steps import _StepProbe


def batch_search(cfg: RunConfig, budget_bytes: float | None = None, start: int | None = None,
                 limit: int | None = None) -> BatchSearch:
    """Find the largest batch size whose training step fits (see the module docstring), keeping every size tried.

    Args:
        cfg: the run to size.
        budget_bytes: the memory to stay within, in bytes (e.g. ``256 * 2**20``); None on CUDA: the GPU's.
        start: the first size tried (default ``cfg.batch_size``); sizes double from there, then bisect.
        limit: the largest size tried (default: 65,536 = ``DEFAULT_LIMIT``, and on CUDA at most the batch whose
            largest activation has 2**31 - 1 elements, past which 32-bit-indexed kernels fail); a result equal to
            it: more may fit (``BatchSearch.limit_reason`` says why the search stopped there).

    Returns:
        A `BatchSearch`: ``best``, and ``tried`` (``to_frame()`` for a table of sizes and measured peaks).

    Example:
        >>> search = batch_search(cfg, budget_bytes=64 * 2**20)
        >>> search.best, search.to_frame()
    """
    device = resolve_device(cfg.device)
    if budget_bytes is None:
        if device.type != "cuda":
            raise ConfigError("budget_bytes", None, "a number of bytes when training on a CPU",
                              "A CPU has no device memory limit to find (a step that does not fit in RAM "
                              "does not fail cleanly, it swaps or gets killed); labkit counts the step's "
                              "tensors instead, so pass the memory to stay within, e.g. budget_bytes=256 * 2**20")
    elif not is_number(budget_bytes) or budget_bytes <= 0:
        raise ConfigError("budget_bytes", budget_bytes, "None (CUDA only) or a number of bytes > 0")
    grad_accum = cfg.grad_accum
    if limit is not None:
        check_positive_int("limit", limit)
    if start is not None and (not is_int(start) or start < 1 or start % grad_accum):
        raise ConfigError("start", start, f"a positive multiple of grad_accum={grad_accum}")
    started = time.perf_counter()
    probe = _StepProbe(cfg)
    state = probe.state_bytes
    if limit is None:
        elements = probe.activation_elements_per_sample() if device.type == "cuda" else None
        limit, limit_reason = default_limit(device.type, elements, grad_accum)
    else:
        limit_reason = "the limit asked for"
    if budget_bytes is not None and budget_bytes < state["total"]:
        raise ConfigError("budget_bytes", budget_bytes,
                          f"at least the model's own {state['total']} bytes ({mib(state['total'], '.1f')}): "
                          f"parameters {state['parameters']} + gradients {state['gradients']} + "
                          f"{cfg.optimizer} state {state['optimizer_state']}, before a single sample",
                          "Raise the budget, or use a smaller model or an optimizer with less state (sgd)")
    min_micro, max_micro = probe.min_micro_batch, limit // grad_accum
    if max_micro < min_micro:
        raise ConfigError("limit", limit, f"at least the smallest batch, {probe.min_batch_size} samples")
    if start is None:
        start_micro = min(max(cfg.batch_size // grad_accum, min_micro), max_micro)
    else:
        start_micro = start // grad_accum
        if not min_micro <= start_micro <= max_micro:
            raise ConfigError("start", start, f"between {probe.min_batch_size} and limit={limit}")

    def fits(micro: int):
        mem = probe.measure(micro * grad_accum)
        return budget_bytes is None or mem.peak_bytes <= budget_bytes, mem.peak_bytes

    found = search_batch_size(fits, start=start_micro, limit=max_micro, minimum=min_micro)
    tried = [Probe(p.batch_size * grad_accum, p.fits, p.peak_bytes) for p in found.tried]
    if found.best == 0:
        smallest = probe.min_batch_size
        why = (f" ({cfg.model} has BatchNorm, which needs 2 samples per micro-batch, x grad_accum={grad_accum})"
               if min_micro > 1 else f" (grad_accum={grad_accum})")
        if budget_bytes is not None:
            peak = next((p.peak_bytes for p in tried if p.batch_size == smallest), None)
            need = f"{peak} bytes ({mib(peak, '.1f')})" if peak is not None else "more"
            raise ConfigError("budget_bytes", budget_bytes,
                              f"enough for the smallest batch: {smallest} samples{why} need {need}",
                              "Raise the budget, use bf16/fp16, or a smaller model")
        raise ConfigError("batch_size", smallest, f"a batch that fits in GPU memory, but not even the smallest, "
                                                  f"{smallest} samples{why}, does",
                          "Free memory held by earlier runs (del res.model; gc.collect(); "
                          "torch.cuda.empty_cache()), use bf16/fp16, or a smaller model")
    return BatchSearch(best=found.best * grad_accum, tried=tried, limit=max_micro * grad_accum,
                       budget_bytes=None if budget_bytes is None else int(budget_bytes), state_bytes=state,
                       device=str(probe.device), elapsed_s=time.perf_counter() - started, limit_reason=limit_reason)


def default_limit(device_type: str, elements_per_sample: int | None, grad_accum: int = 1) -> tuple[int, str]:
    """The largest batch a search tries on ``device_type``, and why: `DEFAULT_LIMIT`, or on CUDA the 32-bit limit.

    Args:
        device_type: ``cuda`` or ``cpu`` (CPU kernels index with 64 bits).
        elements_per_sample: elements of the step's largest activation for one sample (needed on CUDA).
        grad_accum: micro-batches per step.
    """
    default = (DEFAULT_LIMIT // grad_accum * grad_accum, f"labkit's default limit, {DEFAULT_LIMIT:,} samples")
    if device_type != "cuda":
        return default
    if elements_per_sample is None:
        raise ConfigError("elements_per_sample", None, "the largest activation's elements per sample on CUDA")
    safe = index_safe_limit(elements_per_sample, grad_accum)
    if safe >= default[0]:
        return default
    return safe, (f"32-bit indexing: the largest activation has {elements_per_sample:,} elements per sample, and "
                  f"CUDA kernels that index with 32 bits take at most 2**31 - 1 elements, so {safe:,} samples")


def find_max_batch_size(cfg: RunConfig, budget_bytes: float | None = None, start: int | None = None,
                        limit: int | None = None) -> int:
    """The largest batch size whose training step fits in ``budget_bytes`` (CPU: required) or in the GPU.

    See `batch_search` (which also returns every size tried and its measured peak) for the details.

    Args:
        cfg: the run to size (model, precision, optimizer, grad_accum).
        budget_bytes: memory to stay within, in bytes; None on CUDA: as large as runs without an out-of-memory error.
        start: first size tried (default ``cfg.batch_size``).
        limit: largest size tried (default 65,536).

    Example:
        >>> labkit.find_max_batch_size(labkit.RunConfig(device="cpu"), budget_bytes=256 * 2**20)
        582
    """
    return batch_search(cfg, budget_bytes=budget_bytes, start=start, limit=limit).best

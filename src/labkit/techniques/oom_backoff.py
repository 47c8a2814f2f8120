"""Out-of-memory back-off, the mechanism behind "the largest batch that fits": try a size, and on an
out-of-memory error free the memory and try a smaller one; double, then bisect to the exact largest.

`search_batch_size` takes any ``fits(size)`` function; `labkit.capacity.batch_search` gives it one
that runs a real training step (the idea of accelerate's ``find_executable_batch_size``).

The search doubles from ``start`` until a size fails or ``limit`` is reached (``limit`` itself is tried), then
bisects between the last size that fit and the first that failed to the exact largest one. If ``start`` fails,
it bisects between ``minimum - 1`` and ``start``. It assumes that a size fits when any larger one does (memory
grows with the batch). An out-of-memory error from ``fits``, or a library's size limit (see `is_out_of_memory`),
counts as "does not fit": memory is freed and the search backs off. Any other error propagates.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd
import torch

from ..errors import ConfigError
from ..validate import check_positive_int

DEFAULT_LIMIT = 2**16  # the largest batch a search tries unless told otherwise: 65,536 samples
# Many CUDA kernels index a tensor with 32-bit integers: past 2**31 - 1 elements they raise (canUse32BitIndexMath)
# or, in some library kernels, misbehave. On a large GPU a batch search reaches that size before memory runs out.
INDEX_LIMIT_ELEMENTS = 2**31 - 1


def index_safe_limit(elements_per_sample: int, grad_accum: int = 1) -> int:
    """The largest batch whose largest activation stays within 32-bit indexing (`INDEX_LIMIT_ELEMENTS`).

    Args:
        elements_per_sample: elements of the step's largest activation for one sample (e.g. a ResNet-18's first
            convolution at 224x224: 64 x 112 x 112 = 802,816).
        grad_accum: micro-batches per step; the limit holds per micro-batch, so the batch is a multiple of it.

    Example:
        >>> index_safe_limit(802_816)
        2674
    """
    check_positive_int("elements_per_sample", elements_per_sample)
    check_positive_int("grad_accum", grad_accum)
    return INDEX_LIMIT_ELEMENTS // elements_per_sample * grad_accum


def largest_activation_elements(model: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Elements of the largest tensor any module of ``model`` outputs for ``inputs``, per sample (no gradients).

    Args:
        model: the model. inputs: a batch of its inputs (the first dimension is the batch).
    """
    largest = [0]

    def record(_module, _args, output):
        for tensor in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(tensor, torch.Tensor):
                largest[0] = max(largest[0], tensor.numel())

    handles = [module.register_forward_hook(record) for module in model.modules()]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return max(1, -(-largest[0] // inputs.shape[0]))


class Probe(NamedTuple):
    """One batch size a search tried: whether it fits, and the step's measured peak (None if not measured)."""

    batch_size: int
    fits: bool
    peak_bytes: int | None = None


@dataclass
class BatchSearch:
    """What a batch-size search found and how.

    Attributes:
        best: the largest batch size that fits (0: none does).
        tried: every `Probe` in the order tried: ``(batch_size, fits, peak_bytes)``.
        limit: the largest size the search would try; ``best == limit`` means larger ones may fit too.
        budget_bytes: the memory budget (None: fit means "no out-of-memory error").
        state_bytes: the model's own memory before any sample (parameters, gradients, optimizer state, total).
        device: where the probes ran; elapsed_s: how long the search took.
        limit_reason: why ``limit`` is what it is (labkit's default, 32-bit indexing on CUDA, or asked for).
    """

    best: int
    tried: list = field(default_factory=list)
    limit: int = DEFAULT_LIMIT
    budget_bytes: int | None = None
    state_bytes: dict = field(default_factory=dict)
    device: str = "cpu"
    elapsed_s: float = math.nan
    limit_reason: str | None = None

    @property
    def hit_limit(self) -> bool:
        return self.best >= self.limit

    def to_frame(self):
        """The probes as a DataFrame (``step``, ``batch_size``, ``fits``, ``peak_bytes``), in the order tried."""
        frame = pd.DataFrame(self.tried, columns=list(Probe._fields))
        frame.insert(0, "step", range(1, len(frame) + 1))
        return frame


# What a GPU library says when a batch is too large for it without an out-of-memory error: cuBLAS or cuDNN could
# not allocate their workspace, a kernel indexes with 32 bits (2**31 elements at most), a launch has too many
# blocks. On a large GPU (an H200's 139 GiB) a search reaches these before it runs out of memory.
TOO_LARGE = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
             "cudnn_status_not_supported", "32-bit index", "32bitindexmath", "invalid configuration argument",
             "input tensor must fit into 32-bit")


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an error that means "this batch is too large here": out of memory, or a size limit of a library.

    That is ``torch.OutOfMemoryError``, a ``MemoryError``, or a RuntimeError saying "out of memory" (older CUDA
    builds), "can't allocate memory" (the CPU allocator), or a size limit of cuBLAS, cuDNN or a 32-bit-indexed
    kernel (`TOO_LARGE`). Any other error is a bug to see, not a size to back off from.
    """
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    message = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(text in message for text in TOO_LARGE)


def free_memory() -> None:
    """Collect garbage and return cached GPU blocks, after an out-of-memory error."""
    gc.collect()  # the failed step's tensors may sit in reference cycles of its traceback
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _try(fits: Callable, size: int) -> tuple[bool, int | None]:
    out_of_memory = False
    try:
        outcome = fits(size)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        out_of_memory = True
    if out_of_memory:  # outside the except block, so that the traceback (and its tensors) is gone
        free_memory()
        return False, None
    if isinstance(outcome, tuple):
        ok, peak = outcome
        return bool(ok), None if peak is None else int(peak)
    return bool(outcome), None


def search_batch_size(fits: Callable[[int], object], start: int = 1, limit: int = DEFAULT_LIMIT,
                      minimum: int = 1) -> BatchSearch:
    """The largest integer size in ``[minimum, limit]`` for which ``fits(size)`` holds: double, then bisect.

    Args:
        fits: ``fits(size)`` returns True/False or a ``(fits, peak_bytes)`` pair, or raises an out-of-memory error.
        start: the first size tried.
        limit: the largest size tried.
        minimum: the smallest size allowed (e.g. 2 for BatchNorm); smaller sizes are never tried.

    Returns:
        A `BatchSearch`; ``best`` is 0 when not even ``minimum`` fits.

    Example:
        >>> search_batch_size(lambda b: b <= 100, start=8, limit=1024).best
        100
    """
    if not callable(fits):
        raise ConfigError("fits", fits, "a function fits(batch_size) -> bool")
    check_positive_int("minimum", minimum)
    check_positive_int("start", start, minimum)
    check_positive_int("limit", limit, start)
    tried: list[Probe] = []

    def probe(size: int) -> bool:
        ok, peak = _try(fits, size)
        tried.append(Probe(size, ok, peak))
        return ok

    fitting, failing = minimum - 1, None  # largest size known to fit (minimum - 1: none yet), smallest known to fail
    size = start
    while True:
        if not probe(size):
            failing = size
            break
        fitting = size
        if size >= limit:
            break
        size = min(2 * size, limit)
    if failing is not None:
        while failing - fitting > 1:
            middle = (fitting + failing) // 2
            if probe(middle):
                fitting = middle
            else:
                failing = middle
    return BatchSearch(best=fitting if fitting >= minimum else 0, tried=tried, limit=limit)

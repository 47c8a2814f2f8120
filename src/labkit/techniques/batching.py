"""Batch size: the largest batch that fits, what memory a batch needs, and what changes with it.

Notebook 02's engine, one call per experiment:

- `find_max_batch_size` / `batch_search`: the largest batch whose training step fits in a memory budget
  (or, on a GPU without a budget, does not run out of memory): double, then bisect.
- `step_memory`, `memory_model`, `estimate_memory`, `fit_linear_memory`: memory of one training step
  is about ``fixed + bytes_per_sample * batch_size``; measure it, fit it, predict it.
- `scale_lr`: the linear (Goyal et al. 2017) and square-root learning-rate scaling rules.
- `batch_sweep`: one run per batch size, with epoch time and inference time next to `sweep`'s columns.
- `accumulation_gap`, `accumulation_table`, `without_batchnorm`: gradient accumulation gives the
  gradient of the whole batch, except where BatchNorm normalises each micro-batch on its own.
- `sync_context`: under DDP, skip the gradient all-reduce on all but the last micro-batch.

Every memory number here comes from one measured training step (`labkit.measure.track_step_memory`,
and the allocator's peak on CUDA), the same measurement `labkit.fit` reports as ``peak_memory_bytes``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import measure
from ..config import RunConfig, is_int, is_number
from ..env import PROFILES, profile
from ..errors import ConfigError, LabkitError
from ..result import MEMORY_CATEGORIES

DEFAULT_LIMIT = 2**16  # the largest batch a search tries unless told otherwise: 65,536 samples
LR_RULES = ("linear", "sqrt")
BATCHNORM_MODES = ("train", "eval", "none")
# `memory_model` measures micro-batches of 16, 32, 64, ... samples until the growth per sample of two
# successive pairs agrees within 0.5 %, and stops at 512 (see `memory_model` for why small sizes mislead).
LADDER_START = 16
LADDER_MAX = 512
SLOPE_TOLERANCE = 0.005

_NO_CONTEXT = contextlib.nullcontext()  # reusable: the training step allocates no context per micro-batch


# ---------------------------------------------------------------------------------------------
# The search


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
    """

    best: int
    tried: list = field(default_factory=list)
    limit: int = DEFAULT_LIMIT
    budget_bytes: int | None = None
    state_bytes: dict = field(default_factory=dict)
    device: str = "cpu"
    elapsed_s: float = math.nan

    @property
    def hit_limit(self) -> bool:
        return self.best >= self.limit

    def to_frame(self):
        """The probes as a DataFrame (``step``, ``batch_size``, ``fits``, ``peak_bytes``), in the order tried."""
        import pandas as pd

        frame = pd.DataFrame(self.tried, columns=list(Probe._fields))
        frame.insert(0, "step", range(1, len(frame) + 1))
        return frame


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an out-of-memory error: ``torch.OutOfMemoryError``, a RuntimeError saying "out of memory"
    (older CUDA builds) or "can't allocate memory" (the CPU allocator), or a ``MemoryError``."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    message = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message)


def free_memory() -> None:
    """Collect garbage and return cached GPU blocks, after an out-of-memory error."""
    gc.collect()  # the failed step's tensors may sit in reference cycles of its traceback
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _check_positive_int(name: str, value, minimum: int = 1) -> None:
    if not is_int(value) or value < minimum:
        raise ConfigError(name, value, f"an integer >= {minimum}")


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

    Doubles from ``start`` until a size fails or ``limit`` is reached (``limit`` itself is tried), then
    bisects between the last size that fit and the first that failed to the exact largest one. If
    ``start`` fails, bisects between ``minimum - 1`` and ``start``. Assumes that a size fits when any
    larger one does (memory grows with the batch). An out-of-memory error from ``fits`` (see
    `is_out_of_memory`) counts as "does not fit": memory is freed and the search backs off. Any
    other error propagates.

    Args:
        fits: ``fits(size)`` returns True/False, or a ``(fits, peak_bytes)`` pair, or raises an
            out-of-memory error.
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
    _check_positive_int("minimum", minimum)
    _check_positive_int("start", start, minimum)
    _check_positive_int("limit", limit, start)
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


# ---------------------------------------------------------------------------------------------
# One measured training step


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def state_bytes(model: nn.Module, cfg: RunConfig, device: torch.device | str = "cpu") -> dict:
    """The memory training needs before a single sample, computed (not measured) from the model.

    ``parameters`` (with buffers), ``gradients`` (one per trainable parameter), ``optimizer_state``
    (AdamW: two moments per trainable parameter, plus a 4-byte step counter per tensor when training on
    the CPU, where the counters live; SGD: one momentum buffer when ``momentum > 0``; 8-bit AdamW: about
    2 bytes per parameter, 32-bit state for tensors below ``min_8bit_size``) and ``total``, computed by
    `labkit.techniques.memory.model_training_memory`.

    Example:
        >>> state_bytes(model, cfg)["total"]
    """
    from .memory import model_training_memory  # the one bytes-per-parameter accounting (8-bit optimizers too)

    own = model_training_memory(model, "fp32", cfg.optimizer, device=device, momentum=cfg.momentum > 0)
    parts = {"parameters": own["weights"], "gradients": own["gradients"], "optimizer_state": own["optimizer_state"]}
    return {**parts, "total": sum(parts.values())}


@dataclass
class StepMemory:
    """Memory of one training step at one batch size.

    Attributes:
        batch_size: samples in the step.
        peak_bytes: the step's peak, as `labkit.fit` reports ``peak_memory_bytes``: tracked tensors on
            the CPU, the allocator's ``max_memory_allocated`` on CUDA.
        by_category: the composition at the moment of the peak (parameters, gradients, optimizer_state,
            activations, other); on CUDA, allocator bytes the tracker does not see (library workspaces)
            are counted in ``other``, so that the categories add up to ``peak_bytes``.
        breakdown: the raw `labkit.measure.MemoryBreakdown` (each category's own peak too).
    """

    batch_size: int
    peak_bytes: int
    by_category: dict
    breakdown: measure.MemoryBreakdown = field(repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(self.by_category.values())


class _StepProbe:
    """One model and optimizer, built once, that run single measured training steps of ``cfg`` at any
    batch size on synthetic inputs of the dataset's shape (so sizes are not bounded by the training set).

    The optimizer state is created before the first measured step and kept, so each measured step is a
    steady-state step, like the one `labkit.fit` measures: AdamW's moments are alive during the forward
    and backward passes too, which makes the peak larger than in the very first step.
    """

    def __init__(self, cfg: RunConfig):
        from .. import train

        # The trainer's own batch size only has to be valid (the probes choose theirs), and the starting
        # weights do not change memory: random ones skip loading a checkpoint and its warnings.
        self.trainer = train.Trainer(cfg.replace(batch_size=2 * cfg.grad_accum, evaluate=False, pretrained=False))
        self.cfg, self.device, self.model = cfg, self.trainer.device, self.trainer.model
        self.min_micro_batch = 2 if has_batchnorm(self.model) else 1
        self.min_batch_size = self.min_micro_batch * cfg.grad_accum
        split = self.trainer.train_split
        self.image_shape, self.num_classes = tuple(split.images.shape[1:]), split.num_classes
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.state_bytes = state_bytes(self.model, cfg, self.device)
        self._has_state = False

    def _inputs(self, batch_size: int):
        images = torch.randint(0, 256, (batch_size, *self.image_shape), dtype=torch.uint8, generator=self.generator)
        labels = torch.randint(0, self.num_classes, (batch_size,), generator=self.generator)
        return images, labels

    def _create_state(self) -> None:
        # A GradScaler (fp16) skips steps whose gradients overflow, and a skipped step creates no state:
        # step until the state exists (the scaler lowers its scale after each skip).
        for _ in range(10):
            self.trainer.step(*self._inputs(self.min_batch_size))
            if self.trainer.optimizer.state:
                break
        self._has_state = True

    def check(self, batch_size) -> None:
        cfg = self.cfg
        if not is_int(batch_size) or batch_size < self.min_batch_size or batch_size % cfg.grad_accum:
            reason = f"a multiple of grad_accum={cfg.grad_accum}, at least {self.min_batch_size}"
            if self.min_micro_batch > 1:
                reason += f" ({cfg.model} has BatchNorm: at least 2 samples per micro-batch)"
            raise ConfigError("batch_size", batch_size, reason)

    def measure(self, batch_size: int) -> StepMemory:
        """One measured training step of ``batch_size`` samples (forward, backward, optimizer step)."""
        self.check(batch_size)
        trainer, device = self.trainer, self.device
        images, labels = self._inputs(batch_size)
        trainer.optimizer.zero_grad(set_to_none=True)
        try:
            if not self._has_state:
                self._create_state()
            measure.reset_memory(device)  # CUDA: a clean cache and peak, as a fresh run would see
            breakdown = measure.track_step_memory(lambda: trainer.step(images, labels), self.model,
                                                  trainer.optimizer, device)
        except BaseException:
            # Leave the probe usable after an out-of-memory error: no half-accumulated gradients, and a
            # fresh GradScaler (a failed step may have left it between unscale_ and update).
            from .precision import grad_scaler

            trainer.optimizer.zero_grad(set_to_none=True)
            trainer.scaler = grad_scaler(trainer.precision, device)
            raise
        if device.type == "cuda":
            measure.synchronize(device)
            peak = max(0, int(torch.cuda.max_memory_allocated(device)) - trainer.baseline_bytes)
        else:
            peak = breakdown.total_peak_bytes
        if peak is None:
            raise LabkitError(f"the step's memory could not be measured: {breakdown.note}")
        by_category = {k: int(breakdown.at_peak.get(k, 0)) for k in MEMORY_CATEGORIES}
        by_category["other"] += max(0, peak - sum(by_category.values()))
        return StepMemory(batch_size, int(peak), by_category, breakdown)


def step_memory(cfg: RunConfig, batch_size: int) -> StepMemory:
    """Measure the memory of one training step of ``cfg`` at ``batch_size`` (CPU and CUDA).

    A steady-state step (the optimizer state already exists, as in every step after the first) with
    ``cfg``'s model, precision, optimizer and ``grad_accum``, on synthetic inputs of the dataset's shape.
    ``peak_bytes`` is what `labkit.fit` reports as ``peak_memory_bytes`` for this batch size.

    Args:
        cfg: the run (its ``batch_size`` is ignored).
        batch_size: samples in the step; a multiple of ``cfg.grad_accum``.

    Example:
        >>> mem = step_memory(cfg, 128)
        >>> mem.peak_bytes, mem.by_category["activations"]
    """
    return _StepProbe(cfg).measure(batch_size)


# ---------------------------------------------------------------------------------------------
# The largest batch


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def batch_search(cfg: RunConfig, budget_bytes: float | None = None, start: int | None = None,
                 limit: int | None = None) -> BatchSearch:
    """Find the largest batch size whose training step fits, and keep every size tried.

    With ``budget_bytes`` (required on a CPU) a batch fits when the measured peak memory of one full
    training step (forward, backward, optimizer step with its state; ``cfg``'s precision, optimizer and
    ``grad_accum``) is at most the budget. On CUDA without a budget a batch fits when the real step does
    not run out of memory. Sizes are multiples of ``cfg.grad_accum`` (the search runs over micro-batch
    sizes), at least 2 per micro-batch for models with BatchNorm. All probes share one model; inputs are
    synthetic, so the result is not bounded by the training set's size.

    Args:
        cfg: the run to size.
        budget_bytes: the memory to stay within, in bytes (e.g. ``256 * 2**20``); None on CUDA: the GPU's.
        start: the first size tried (default ``cfg.batch_size``); sizes double from there, then bisect.
        limit: the largest size tried (default 65,536 = ``DEFAULT_LIMIT``); a result equal to it means
            larger batches may fit too.

    Returns:
        A `BatchSearch`: ``best``, and ``tried`` (``to_frame()`` for a table of sizes and measured peaks).

    Example:
        >>> search = batch_search(cfg, budget_bytes=64 * 2**20)
        >>> search.best, search.to_frame()
    """
    from ..env import resolve_device

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
    limit = DEFAULT_LIMIT if limit is None else limit
    _check_positive_int("limit", limit)
    if start is not None and (not is_int(start) or start < 1 or start % grad_accum):
        raise ConfigError("start", start, f"a positive multiple of grad_accum={grad_accum}")
    started = time.perf_counter()
    probe = _StepProbe(cfg)
    state = probe.state_bytes
    if budget_bytes is not None and budget_bytes < state["total"]:
        raise ConfigError("budget_bytes", budget_bytes,
                          f"at least the model's own {state['total']} bytes ({_mib(state['total'])}): "
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
            need = f"{peak} bytes ({_mib(peak)})" if peak is not None else "more"
            raise ConfigError("budget_bytes", budget_bytes,
                              f"enough for the smallest batch: {smallest} samples{why} need {need}",
                              "Raise the budget, use bf16/fp16, or a smaller model")
        raise ConfigError("batch_size", smallest, f"a batch that fits in GPU memory, but not even the smallest, "
                                                  f"{smallest} samples{why}, does",
                          "Free memory held by earlier runs (del res.model; gc.collect(); "
                          "torch.cuda.empty_cache()), use bf16/fp16, or a smaller model")
    return BatchSearch(best=found.best * grad_accum, tried=tried, limit=max_micro * grad_accum,
                       budget_bytes=None if budget_bytes is None else int(budget_bytes), state_bytes=state,
                       device=str(probe.device), elapsed_s=time.perf_counter() - started)


def find_max_batch_size(cfg: RunConfig, budget_bytes: float | None = None, start: int | None = None,
                        limit: int | None = None) -> int:
    """The largest batch size whose training step fits in ``budget_bytes`` (CPU: required) or in the GPU.

    See `batch_search` (which also returns every size tried and its measured peak) for the details.

    Args:
        cfg: the run to size (model, precision, optimizer, grad_accum).
        budget_bytes: memory to stay within, in bytes; None on CUDA: as large as runs without an
            out-of-memory error.
        start: first size tried (default ``cfg.batch_size``); limit: largest (default 65,536).

    Example:
        >>> labkit.find_max_batch_size(labkit.RunConfig(device="cpu"), budget_bytes=256 * 2**20)
        582
    """
    return batch_search(cfg, budget_bytes=budget_bytes, start=start, limit=limit).best


# ---------------------------------------------------------------------------------------------
# Memory as a function of the batch size


class LinearMemory(NamedTuple):
    """``peak = fixed_bytes + bytes_per_sample * batch_size``, and how well that line fits (``r2``)."""

    fixed_bytes: float
    bytes_per_sample: float
    r2: float


def fit_linear_memory(batch_sizes: Iterable, peak_bytes: Iterable) -> LinearMemory:
    """Least-squares line through measured peaks: (fixed bytes, bytes per sample, R^2).

    Pairs with a missing peak (None/NaN: a failed run of a sweep) are left out.

    Args:
        batch_sizes: the batch sizes (e.g. a sweep's ``batch_size`` column).
        peak_bytes: their measured peaks (e.g. its ``peak_memory_bytes`` column).

    Example:
        >>> fixed, per_sample, r2 = fit_linear_memory(df.batch_size, df.peak_memory_bytes)
    """
    import numpy as np

    x = np.asarray(list(batch_sizes), dtype=float)
    y = np.asarray(list(peak_bytes), dtype=float)
    if x.shape != y.shape:
        raise ConfigError("peak_bytes", f"{y.size} values", f"one per batch size ({x.size} batch sizes)")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if np.unique(x).size < 2:
        raise ConfigError("batch_sizes", x.tolist(), "at least two different batch sizes with a measured peak")
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(((y - (intercept + slope * x)) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else math.nan)
    return LinearMemory(float(intercept), float(slope), float(r2))


_KEYS = (*MEMORY_CATEGORIES, "total")


@dataclass
class MemoryModel:
    """Memory of a training step as a function of the batch size, from measured steps.

    ``predict`` interpolates linearly between the measured sizes, per category, and beyond the largest
    follows the line through the last two: ``fixed_bytes + bytes_per_sample * batch_size``.

    Attributes:
        batch_sizes: the measured sizes; measured: their compositions (categories + ``total``).
        fixed_bytes, bytes_per_sample: that line's intercept and slope, per category and ``total``.
        grad_accum, min_batch_size: the sizes ``predict`` accepts (multiples of grad_accum, at least this).
        note: a caveat about the fit, if any.
    """

    batch_sizes: list
    measured: list
    fixed_bytes: dict
    bytes_per_sample: dict
    grad_accum: int = 1
    min_batch_size: int = 1
    note: str | None = None

    @classmethod
    def from_steps(cls, steps: list[StepMemory], grad_accum: int, min_batch_size: int,
                   note: str | None = None) -> MemoryModel:
        steps = sorted(steps, key=lambda s: s.batch_size)
        measured = [{**s.by_category, "total": s.total_bytes} for s in steps]
        (x0, m0), (x1, m1) = [(s.batch_size, m) for s, m in zip(steps[-2:], measured[-2:], strict=True)]
        slope = {k: (m1[k] - m0[k]) / (x1 - x0) for k in _KEYS}
        fixed = {k: m1[k] - slope[k] * x1 for k in _KEYS}
        return cls([s.batch_size for s in steps], measured, fixed, slope, grad_accum, min_batch_size, note)

    def predict(self, batch_size: int) -> dict:
        """Predicted bytes at ``batch_size``, by category plus ``total``.

        Example:
            >>> memory_model(cfg).predict(1024)["total"]
        """
        if not is_int(batch_size) or batch_size < self.min_batch_size or batch_size % self.grad_accum:
            raise ConfigError("batch_size", batch_size,
                              f"a multiple of grad_accum={self.grad_accum}, at least {self.min_batch_size}")
        sizes = self.batch_sizes
        index = next((i for i in range(1, len(sizes)) if batch_size <= sizes[i]), len(sizes) - 1)
        (x0, m0), (x1, m1) = (sizes[index - 1], self.measured[index - 1]), (sizes[index], self.measured[index])
        out = {k: max(0, round(m0[k] + (m1[k] - m0[k]) * (batch_size - x0) / (x1 - x0))) for k in MEMORY_CATEGORIES}
        out["total"] = sum(out.values())
        return out

    def to_frame(self):
        """One row per measured batch size: the categories and ``total`` in bytes."""
        import pandas as pd

        return pd.DataFrame([{"batch_size": b, **m} for b, m in zip(self.batch_sizes, self.measured, strict=True)])


def _slopes_agree(steps: list[StepMemory]) -> bool:
    (x0, y0), (x1, y1), (x2, y2) = [(s.batch_size, s.total_bytes) for s in steps]
    first, second = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    return abs(second - first) <= SLOPE_TOLERANCE * max(abs(second), 1.0)


def memory_model(cfg: RunConfig, batch_sizes: Iterable[int] | None = None) -> MemoryModel:
    """Measure training steps of ``cfg`` at a few batch sizes and fit memory per category against the size.

    Which moment of the step is the peak depends on the batch size: with a few samples it is the
    optimizer step (parameters + gradients + optimizer state + its temporaries), with many it is the
    start of the backward pass, when all activations are alive. A line through two small sizes therefore
    predicts large batches badly. By default this measures the smallest valid batch and micro-batches of
    16, 32, 64, ... samples (times ``grad_accum``) until the growth per sample of two successive pairs
    agrees within 0.5 % (at most 512 per micro-batch), and fits the line through the last two.

    Args:
        cfg: the run (model, precision, optimizer, grad_accum; its batch_size is ignored).
        batch_sizes: measure exactly these sizes instead (at least two; multiples of ``grad_accum``).

    Returns:
        A `MemoryModel`: ``predict(batch_size)``, ``bytes_per_sample``, ``fixed_bytes``.

    Example:
        >>> mm = memory_model(cfg)
        >>> mm.bytes_per_sample["activations"], mm.predict(2048)["total"]
    """
    probe = _StepProbe(cfg)
    grad_accum = cfg.grad_accum
    note = None
    if batch_sizes is not None:
        sizes = sorted(set(batch_sizes)) if isinstance(batch_sizes, Iterable) else []
        if len(sizes) < 2:
            raise ConfigError("batch_sizes", batch_sizes, "at least two different batch sizes")
        for size in sizes:
            probe.check(size)
        steps = [probe.measure(size) for size in sizes]
    else:
        steps = [probe.measure(probe.min_batch_size)]
        ladder, micro = [], max(LADDER_START, probe.min_micro_batch)
        while True:
            ladder.append(probe.measure(micro * grad_accum))
            if len(ladder) >= 3 and _slopes_agree(ladder[-3:]):
                break
            if micro >= LADDER_MAX:
                note = (f"memory per sample was still changing at {micro * grad_accum} samples; "
                        "predictions for larger batches are less certain")
                break
            micro *= 2
        steps += ladder
    return MemoryModel.from_steps(steps, grad_accum, probe.min_batch_size, note)


def _model_key(cfg: RunConfig) -> RunConfig:
    return cfg.replace(batch_size=cfg.grad_accum, max_steps=None, epochs=1, evaluate=False, lr_warmup_steps=0)


_memory_models: dict = {}


def estimate_memory(cfg: RunConfig, batch_size: int | None = None) -> dict:
    """Predicted memory of one training step of ``cfg`` at ``batch_size``, in bytes by category plus ``total``.

    Uses `memory_model` (a few measured steps, fitted once per config and kept for the session), so
    asking for many batch sizes costs one fit. Memory grows linearly with the batch size once
    activations dominate; the prediction for sizes beyond the measured ones follows that line.

    Args:
        cfg: the run (model, precision, optimizer, grad_accum).
        batch_size: the batch to predict for (default ``cfg.batch_size``).

    Example:
        >>> labkit.estimate_memory(cfg, batch_size=256)
        {'parameters': 1185792, 'gradients': 5160, 'optimizer_state': 2364012, 'activations': ..., 'total': ...}
    """
    batch_size = cfg.batch_size if batch_size is None else batch_size
    key = _model_key(cfg)
    if key not in _memory_models:
        _memory_models[key] = memory_model(cfg)
    return _memory_models[key].predict(batch_size)


# ---------------------------------------------------------------------------------------------
# Learning rate, accumulation, DDP


def scale_lr(cfg: RunConfig, base_batch_size: int, rule: str = "linear") -> RunConfig:
    """``cfg`` with its learning rate rescaled from the batch size it was tuned for to ``cfg.batch_size``.

    ``linear``: lr x (batch_size / base_batch_size), the rule of Goyal et al. 2017 for SGD (use it with a
    warm-up, ``lr_warmup_steps``). ``sqrt``: lr x sqrt(batch_size / base_batch_size), which keeps the
    gradient noise constant and suits Adam-style optimizers better.

    Args:
        cfg: the run; ``cfg.lr`` is the learning rate that works at ``base_batch_size``.
        base_batch_size: the batch size ``cfg.lr`` was chosen for.
        rule: ``linear`` or ``sqrt``.

    Example:
        >>> scale_lr(cfg.replace(batch_size=256), base_batch_size=64).lr  # 4x cfg.lr
    """
    if rule not in LR_RULES:
        raise ConfigError("rule", rule, "'linear' (SGD, Goyal et al. 2017) or 'sqrt' (Adam-style optimizers)")
    _check_positive_int("base_batch_size", base_batch_size)
    ratio = cfg.batch_size / base_batch_size
    return cfg.replace(lr=cfg.lr * (ratio if rule == "linear" else math.sqrt(ratio)))


def sync_context(model: nn.Module, last_micro_batch: bool):
    """``model.no_sync()`` on all but the last micro-batch of an accumulated step, else a no-op context.

    DistributedDataParallel all-reduces gradients in every backward pass; during accumulation only the
    last one needs it. DDP decides during the forward pass, so wrap forward and backward.

    Example:
        >>> with sync_context(model, last_micro_batch=i == grad_accum - 1):
        ...     loss = model(x).sum(); loss.backward()
    """
    no_sync = getattr(model, "no_sync", None)
    if no_sync is None or last_micro_batch:
        return _NO_CONTEXT
    return no_sync()


def without_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` by ``nn.Identity`` (in place) and return it.

    Example:
        >>> model = without_batchnorm(models.build("small_cnn", 10)[0])
    """
    if isinstance(model, nn.modules.batchnorm._BatchNorm):
        return nn.Identity()
    for name, child in model.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, nn.Identity())
        else:
            without_batchnorm(child)
    return model


@dataclass
class AccumulationGap:
    """How far accumulated gradients are from the whole batch's: largest absolute difference, and
    relative to the largest gradient entry."""

    accum_steps: int
    batchnorm: str
    max_abs_diff: float
    max_abs_grad: float

    @property
    def relative(self) -> float:
        return self.max_abs_diff / self.max_abs_grad if self.max_abs_grad else math.nan


def _accumulation_gap(cfg: RunConfig, accum_steps: int, batchnorm: str) -> AccumulationGap:
    from .. import data, models, train
    from ..env import profile, resolve_device, set_tf32

    if batchnorm not in BATCHNORM_MODES:
        raise ConfigError("batchnorm", batchnorm, "'train' (as in training), 'eval' (running statistics) or "
                                                  "'none' (BatchNorm layers removed)")
    if not is_int(accum_steps) or accum_steps < 1 or cfg.batch_size % accum_steps:
        raise ConfigError("accum_steps", accum_steps, f"a divisor of batch_size={cfg.batch_size} "
                                                      "(each micro-batch is batch_size / accum_steps samples)")
    device = resolve_device(cfg.device)
    set_tf32(cfg.tf32)  # TF32 would add its own rounding (~1e-3) to the comparison
    prof = profile()
    train_size = cfg.train_size or prof.train_size
    if cfg.batch_size > train_size:
        raise ConfigError("batch_size", cfg.batch_size, f"at most train_size={train_size} (the training set's size)")
    split = train._splits(cfg.dataset, train_size, prof.val_size, prof.test_size)["train"]
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)[0]
    micro = cfg.batch_size // accum_steps
    if batchnorm == "none":
        model = without_batchnorm(model)
    elif batchnorm == "train" and micro < 2 and has_batchnorm(model):
        raise ConfigError("accum_steps", accum_steps, f"at most batch_size / 2 = {cfg.batch_size // 2}: BatchNorm "
                                                      "in train mode needs at least 2 samples per micro-batch")
    model = model.to(device).eval()  # dropout off: only the grouping of the samples differs
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(batchnorm == "train")
    x = data.to_model_input(split.images[:cfg.batch_size], split, device)
    y = split.labels[:cfg.batch_size].to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}  # BatchNorm's running statistics too
    params = [p for p in model.parameters() if p.requires_grad]

    def gradients(chunks: int) -> list[torch.Tensor]:
        model.load_state_dict(start)
        model.zero_grad(set_to_none=True)
        for micro_x, micro_y in zip(x.chunk(chunks), y.chunk(chunks), strict=True):
            (F.cross_entropy(model(micro_x), micro_y) / chunks).backward()
        return [p.grad.detach().clone() for p in params]

    whole, accumulated = gradients(1), gradients(accum_steps)
    diff = max(float((a - b).abs().max()) for a, b in zip(whole, accumulated, strict=True))
    largest = max(float(g.abs().max()) for g in whole)
    return AccumulationGap(accum_steps, batchnorm, diff, largest)


def accumulation_gap(cfg: RunConfig, accum_steps: int, batchnorm: str = "train") -> float:
    """Largest absolute difference between the gradients of one batch and of the same batch accumulated
    over ``accum_steps`` micro-batches (each loss divided by ``accum_steps``), from the same weights.

    Without BatchNorm, or with BatchNorm in eval mode (running statistics), the two are the same sum
    in a different order: the gap is float rounding (~1e-7 in fp32). With BatchNorm in train mode each
    micro-batch is normalised with its own mean and variance, so the gradients really differ. The
    batch is ``cfg.batch_size`` samples of the training set; computed in fp32 with dropout off.

    Args:
        cfg: the model, dataset, batch size, seed and device.
        accum_steps: micro-batches; must divide ``cfg.batch_size``.
        batchnorm: ``train``, ``eval`` or ``none`` (BatchNorm replaced by identity, see `without_batchnorm`).

    Example:
        >>> accumulation_gap(cfg, 4, batchnorm="none"), accumulation_gap(cfg, 4, batchnorm="train")
        (7.5e-09, 0.41)
    """
    return _accumulation_gap(cfg, accum_steps, batchnorm).max_abs_diff


def accumulation_table(cfg: RunConfig, accum_steps: int):
    """`accumulation_gap` for BatchNorm in train mode, in eval mode and removed, as a DataFrame.

    Columns: ``batchnorm``, ``accum_steps``, ``micro_batch_size``, ``max_abs_grad_diff``, ``max_abs_grad``,
    ``relative_diff`` (the gap over the largest gradient entry).

    Example:
        >>> accumulation_table(cfg, accum_steps=4)
    """
    import pandas as pd

    rows = []
    for mode in BATCHNORM_MODES:
        gap = _accumulation_gap(cfg, accum_steps, mode)
        rows.append({"batchnorm": mode, "accum_steps": accum_steps, "micro_batch_size": cfg.batch_size // accum_steps,
                     "max_abs_grad_diff": gap.max_abs_diff, "max_abs_grad": gap.max_abs_grad,
                     "relative_diff": gap.relative})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# The sweep


class _InferenceTimer:
    """Times predicting the test split at a batch size; one model (random weights: latency does not
    depend on their values), built on first use."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self._ready = None

    def _setup(self):
        from .. import data, models, train
        from ..env import profile, resolve_device, set_tf32
        from .precision import resolve_precision

        cfg, prof = self.cfg, profile()
        device = resolve_device(cfg.device)
        set_tf32(cfg.tf32)
        test = train._splits(cfg.dataset, cfg.train_size or prof.train_size, prof.val_size, prof.test_size)["test"]
        model = models.build(cfg.model, test.num_classes, pretrained=False)[0]
        memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
        model = model.to(device, memory_format=memory_format)
        precision = resolve_precision(cfg.precision, device)
        return device, test, model, precision, data

    def measure(self, batch_size: int) -> dict:
        from ..env import profile
        from .precision import autocast

        if self._ready is None:
            self._ready = self._setup()
        device, test, model, precision, data = self._ready
        prof = profile()
        batch = min(batch_size, len(test))
        x = data.to_model_input(test.images[:batch], test, device, self.cfg.channels_last)
        with autocast(precision, device):
            latency = measure.measure_latency(model, x, warmup=max(1, prof.warmup_steps), repeats=prof.repeats)
        batches = math.ceil(len(test) / batch)
        return {"inference_batch_latency_s": latency.median_s, "inference_time_s": latency.median_s * batches,
                "inference_per_sample_s": latency.median_s / batch}


def batch_sweep(cfg: RunConfig, batch_sizes: Iterable[int] | None = None, lr_scaling: bool | str = False,
                base_batch_size: int | None = None, epochs: int | None = None, refresh: bool = False,
                progress: bool = True):
    """Train ``cfg`` once per batch size for the same number of epochs and compare time, memory and accuracy.

    Runs go through `labkit.results.run_configs`: cached (reruns are instant, an interrupted sweep loses
    no finished run), and a failed run becomes a row with its ``error``. Rows have `labkit.sweep`'s
    columns plus:

    - ``steps_per_epoch``: optimizer steps per epoch (train_size // batch_size);
    - ``epoch_time_s``: median step time x steps per epoch (warm-up and profiling steps excluded);
    - ``lr``, ``lr_scaling``, ``base_batch_size``: the learning rate each run used and how it was scaled;
    - ``inference_time_s``: time to predict the test split in batches of that size (median latency of
      one batch x number of batches, the last one counted as full), ``inference_per_sample_s`` and
      ``inference_batch_latency_s`` (also cached).

    Args:
        cfg: the base run (``max_steps`` is dropped: runs are epoch-based).
        batch_sizes: the sizes (default: the profile's ``batch_sizes``).
        lr_scaling: False (same lr for all), True or ``"linear"``, or ``"sqrt"`` (see `scale_lr`).
        base_batch_size: the batch size ``cfg.lr`` was tuned for (default ``cfg.batch_size``).
        epochs: epochs per run (default: the profile's ``sweep_epochs``).
        refresh: rerun even when cached results exist; progress: show progress bars.

    Example:
        >>> df = batch_sweep(cfg, lr_scaling="sqrt")
        >>> df[["batch_size", "lr", "epoch_time_s", "peak_memory_bytes", "accuracy"]]
    """
    import pandas as pd

    from .. import results
    from ..env import env_report, profile

    prof = profile()
    batch_sizes = list(prof.batch_sizes if batch_sizes is None else batch_sizes)
    if not batch_sizes:
        raise ConfigError("batch_sizes", batch_sizes, "a non-empty list of batch sizes, e.g. [16, 32, 64]")
    rules = {False: None, True: "linear", "linear": "linear", "sqrt": "sqrt"}
    if not isinstance(lr_scaling, (bool, str)) or lr_scaling not in rules:
        raise ConfigError("lr_scaling", lr_scaling, "False, True (= 'linear'), 'linear' or 'sqrt'")
    rule = rules[lr_scaling]
    base = cfg.batch_size if base_batch_size is None else base_batch_size
    _check_positive_int("base_batch_size", base)
    epochs = prof.sweep_epochs if epochs is None else epochs
    configs = []
    for size in batch_sizes:  # every config is validated before anything runs
        run_cfg = cfg.replace(batch_size=size, max_steps=None, epochs=epochs)
        configs.append(scale_lr(run_cfg, base, rule) if rule else run_cfg)
    runs = results.run_configs(configs, refresh=refresh, progress=progress)
    train_size = cfg.train_size or prof.train_size
    timer = _InferenceTimer(cfg)
    rows = []
    for run_cfg, result in zip(configs, runs, strict=True):
        row = results.to_row(result)
        steps_per_epoch = train_size // run_cfg.batch_size
        row.update(lr_scaling=rule or "none", base_batch_size=base if rule else None,
                   steps_per_epoch=steps_per_epoch, epoch_time_s=result.step_time_s * steps_per_epoch)
        inference = dict.fromkeys(("inference_batch_latency_s", "inference_time_s", "inference_per_sample_s"),
                                  math.nan)
        if result.ok:
            key = f"{results.cache_key(run_cfg, env_report(run_cfg.device))}-inference"
            inference = results.cached_record(key, lambda size=run_cfg.batch_size: timer.measure(size), refresh)
        row.update(inference)
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# What the notebook reads off the results


def prediction_table(cfg: RunConfig, fit_sizes: tuple[int, int] = (16, 32), check_sizes: Iterable[int] = (64, 128, 256)):
    """Predict peak memory from two small measured batches, then measure larger ones to check.

    The prediction is the line ``fixed + bytes_per_sample x batch`` through ``fit_sizes``; each size
    in ``check_sizes`` is then measured with one real training step (`step_memory`).

    Returns:
        A long DataFrame, two rows per checked size: ``batch_size``, ``kind`` (``"predicted from a
        and b"`` or ``"measured"``), ``peak_memory_bytes``; and ``error`` (predicted / measured - 1) on
        the predicted rows.

    Example:
        >>> table = prediction_table(cfg); plots.line(table, x="batch_size", y="peak_memory_bytes", hue="kind")
    """
    import pandas as pd

    model = memory_model(cfg, batch_sizes=tuple(fit_sizes))
    label = f"predicted from {fit_sizes[0]} and {fit_sizes[1]}"
    rows = []
    for size in check_sizes:
        predicted = model.predict(size)["total"]
        measured = step_memory(cfg, size).total_bytes
        rows.append({"batch_size": size, "kind": label, "peak_memory_bytes": predicted,
                     "error": predicted / measured - 1})
        rows.append({"batch_size": size, "kind": "measured", "peak_memory_bytes": measured, "error": None})
    return pd.DataFrame(rows)


def prediction_finding(table) -> str:
    """How far the two-point prediction was from the measurement at each checked size."""
    predicted = table[table["kind"] != "measured"]
    parts = [f"{row.error:+.1%} at batch {row.batch_size}" for row in predicted.itertuples()]
    worst = predicted["error"].abs().max()
    return (f"{predicted['kind'].iloc[0].capitalize()}: off by {', '.join(parts)} against the measured peaks "
            f"(worst {worst:.1%}).")


def accuracy_noise(accuracy: float, test_size: int) -> float:
    """The smallest accuracy difference between two runs that is not test-set noise (about 95 % confidence).

    Two accuracies measured on ``test_size`` images each differ by chance with a standard error of about
    sqrt(2 p (1 - p) / test_size); twice that is the threshold. It ignores seed-to-seed variation of the
    training itself, so it is a lower bound.
    """
    p = min(max(float(accuracy), 1 / test_size), 1 - 1 / test_size)
    return 2 * math.sqrt(2 * p * (1 - p) / test_size)


def _test_size(frame) -> int:
    run_profile = PROFILES.get(frame["profile"].iloc[0]) if "profile" in frame else None
    return (run_profile or profile()).test_size


def _verdict(ok: bool | None) -> str:
    return {True: "reproduced", False: "refuted", None: "inconclusive"}[ok]


def seed_claims(df) -> pd.DataFrame:  # noqa: F821 - pandas is imported lazily, as in the rest of this module
    """Test four common claims about batch size against a `batch_sweep` frame, with the live numbers.

    1. peak memory grows linearly with the batch (least-squares R^2 >= 0.98);
    2. training time per epoch falls as the batch grows (largest batch under 0.8x the smallest's);
    3. inference time (predicting the test split) barely moves (slowest / fastest <= 1.5);
    4. a middle batch generalises best (best accuracy neither at the smallest nor the largest batch,
       and the spread larger than one test sample per batch size, else inconclusive).

    Returns:
        A DataFrame: ``claim``, ``measured`` (a sentence with the numbers), ``verdict``.

    Example:
        >>> seed_claims(batch_sweep(cfg))
    """
    import pandas as pd

    ok = df[df["error"].isna()].sort_values("batch_size") if "error" in df else df.sort_values("batch_size")
    if ok["batch_size"].nunique() < 3:
        raise ConfigError("df", f"{ok['batch_size'].nunique()} successful batch sizes",
                          "a batch_sweep frame with at least 3 successful batch sizes")
    first, last = ok.iloc[0], ok.iloc[-1]
    line = fit_linear_memory(ok["batch_size"], ok["peak_memory_bytes"])
    rows = [{
        "claim": "memory grows linearly with the batch size",
        "measured": (f"peak = {line.fixed_bytes / 2**20:.1f} MiB + {line.bytes_per_sample / 1024:.0f} KiB x batch, "
                     f"R^2 = {line.r2:.4f}"),
        "verdict": _verdict(line.r2 >= 0.98),
    }]
    ratio = last["epoch_time_s"] / first["epoch_time_s"]
    fastest = ok.loc[ok["epoch_time_s"].idxmin()]
    measured = (f"{first['epoch_time_s']:.2f} s per epoch at batch {first['batch_size']}, "
                f"{last['epoch_time_s']:.2f} s at {last['batch_size']} ({ratio:.2f}x)")
    verdict = _verdict(ratio < 0.8)
    if fastest["batch_size"] != last["batch_size"] and last["epoch_time_s"] > 1.1 * fastest["epoch_time_s"]:
        measured += f"; fastest {fastest['epoch_time_s']:.2f} s at batch {fastest['batch_size']}, slower beyond"
        verdict = f"partly: falls up to batch {fastest['batch_size']}, then rises" if ratio < 0.8 else verdict
    rows.append({"claim": "training time per epoch falls as the batch grows", "measured": measured,
                 "verdict": verdict})
    slowest, fastest = ok["inference_time_s"].max(), ok["inference_time_s"].min()
    rows.append({
        "claim": "inference time barely moves with the batch size",
        "measured": (f"test-split inference from {fastest * 1e3:.1f} to {slowest * 1e3:.1f} ms across batch sizes "
                     f"({slowest / fastest:.2f}x)"),
        "verdict": _verdict(slowest / fastest <= 1.5),
    })
    best = ok.loc[ok["accuracy"].idxmax()]
    edge = max(first["accuracy"], last["accuracy"])
    noise = accuracy_noise(best["accuracy"], _test_size(ok))
    inside = first["batch_size"] < best["batch_size"] < last["batch_size"]
    rows.append({
        "claim": "a middle batch size generalises best",
        "measured": (f"best accuracy {best['accuracy']:.1%} at batch {best['batch_size']} "
                     f"(range {ok['accuracy'].min():.1%}-{ok['accuracy'].max():.1%}; differences under "
                     f"{noise:.1%} are within one run's test-set noise)"),
        # A middle winner counts only when it beats both ends by more than the noise of one run.
        "verdict": _verdict(False if not inside else (True if best["accuracy"] - edge > noise else None)),
    })
    return pd.DataFrame(rows)


LR_SETTINGS = ("same lr", "scaled", "scaled + warm-up")


def compare_lr_scaling(cfg: RunConfig, warmup_steps: int, rule: str = "linear", base_batch_size: int | None = None,
                       batch_sizes: Iterable[int] | None = None, refresh: bool = False, progress: bool = True):
    """Three `batch_sweep`s: the same lr at every batch size, lr scaled by ``rule``, and scaled with a warm-up.

    Args:
        cfg: the base run; ``cfg.lr`` is the lr tuned for ``base_batch_size`` (default ``cfg.batch_size``).
        warmup_steps: optimizer steps of linear lr warm-up in the third sweep (fewer than any run's steps).
        rule: ``"linear"`` (Goyal et al. 2017, derived for SGD) or ``"sqrt"`` (often better for Adam).

    Returns:
        The three frames concatenated, with an ``lr_setting`` column (`LR_SETTINGS`).

    Example:
        >>> df = compare_lr_scaling(cfg, warmup_steps=4)
        >>> plots.line(df, x="batch_size", y="accuracy", hue="lr_setting")
    """
    import pandas as pd

    if not is_int(warmup_steps) or warmup_steps < 1:
        raise ConfigError("warmup_steps", warmup_steps, "a positive integer (optimizer steps of lr warm-up)")
    common = dict(batch_sizes=batch_sizes, base_batch_size=base_batch_size, refresh=refresh, progress=progress)
    frames = {
        LR_SETTINGS[0]: batch_sweep(cfg, lr_scaling=False, **common),
        LR_SETTINGS[1]: batch_sweep(cfg, lr_scaling=rule, **common),
        LR_SETTINGS[2]: batch_sweep(cfg.replace(lr_warmup_steps=warmup_steps), lr_scaling=rule, **common),
    }
    return pd.concat([frame.assign(lr_setting=name) for name, frame in frames.items()], ignore_index=True)


def lr_scaling_finding(df) -> str:
    """Which lr setting gave the best accuracy at each batch size, from `compare_lr_scaling`'s frame."""
    ok = df[df["error"].isna()] if "error" in df else df
    lines = []
    for batch_size, group in ok.groupby("batch_size"):
        best = group["accuracy"].max()
        noise = accuracy_noise(best, _test_size(group))
        top = [row.lr_setting for row in group.itertuples() if best - row.accuracy <= noise]
        behind = [row.lr_setting for row in group.itertuples() if best - row.accuracy > noise]
        scores = ", ".join(f"{row.lr_setting} {row.accuracy:.1%} (lr {row.lr:.2g})" for row in group.itertuples())
        if len(top) == 1:
            verdict = f"best: {top[0]}"
        elif not behind:
            verdict = f"no clear winner (all within {noise:.1%}, the test-set noise)"
        else:
            verdict = f"{' and '.join(top)} tie within the test-set noise ({noise:.1%}), ahead of {' and '.join(behind)}"
        lines.append(f"batch {batch_size}: {scores}; {verdict}.")
    return "\n".join(lines)


def run_with_lr_scaling(cfg: RunConfig, lr_scaling: bool | str = False, base_batch_size: int = 64, on_step=None,
                        refresh: bool = False):
    """`labkit.results.cached_fit` with ``cfg.lr`` scaled from ``base_batch_size`` when ``lr_scaling`` is set.

    For a panel whose controls choose the batch size and whether the lr follows it.

    Args:
        lr_scaling: False (lr as given), True or ``"linear"``, or ``"sqrt"`` (see `scale_lr`).
        base_batch_size: the batch size ``cfg.lr`` was tuned for (notebook 00's baseline: 64).

    Example:
        >>> res = run_with_lr_scaling(cfg.replace(batch_size=256), lr_scaling="linear")   # lr x4
    """
    from ..results import cached_fit

    if lr_scaling is not False:
        cfg = scale_lr(cfg, base_batch_size, rule="linear" if lr_scaling is True else lr_scaling)
    return cached_fit(cfg, refresh=refresh, on_step=on_step)


def accumulation_finding(df) -> str:
    """What gradient accumulation did to peak memory and step time, from a sweep over ``grad_accum``."""
    ok = df[df["error"].isna()] if "error" in df else df
    ok = ok.sort_values("grad_accum")
    base = ok.iloc[0]
    parts = [f"grad_accum={row.grad_accum} (micro-batch {row.batch_size // row.grad_accum}): peak "
             f"{row.peak_memory_bytes / 2**20:.1f} MiB ({row.peak_memory_bytes / base['peak_memory_bytes']:.2f}x), "
             f"step {row.step_time_s * 1e3:.1f} ms ({row.step_time_s / base['step_time_s']:.2f}x)"
             for row in ok.iloc[1:].itertuples()]
    return (f"Against grad_accum={base['grad_accum']} (peak {base['peak_memory_bytes'] / 2**20:.1f} MiB, step "
            f"{base['step_time_s'] * 1e3:.1f} ms), same batch of {base['batch_size']}:\n" + "\n".join(parts))

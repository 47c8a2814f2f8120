"""How much fits: training memory computed per parameter, measured per step, predicted per batch size,
and the largest batch within a budget.

- `training_memory`, `model_training_memory`: the bytes-per-parameter accounting (weights, gradients,
  optimizer state, master weights), for any parameter count or exactly for a real model.
- `step_memory`: one measured training step at a batch size (the measurement `labkit.fit` reports as
  ``peak_memory_bytes``); `memory_model`, `estimate_memory`, `fit_linear_memory`: memory is about
  ``fixed + bytes_per_sample * batch_size``; measure it, fit it, predict it.
- `batch_search` / `find_max_batch_size`: the largest batch whose training step fits in a memory budget
  (or, on a GPU without a budget, does not run out of memory), with the back-off of
  `labkit.techniques.oom_backoff`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from torch import nn

from . import measure, models, train
from .config import RunConfig
from .env import resolve_device
from .errors import ConfigError, LabkitError
from .result import MEMORY_CATEGORIES
from .techniques.oom_backoff import DEFAULT_LIMIT, BatchSearch, Probe, search_batch_size
from .techniques.optimizers import BNB_BLOCK_SIZE, BNB_QMAP_BYTES, MIN_8BIT_SIZE
from .techniques.precision import grad_scaler
from .units import mib
from .validate import check_positive_int, is_int, is_number

# `memory_model` measures micro-batches of 16, 32, 64, ... samples until the growth per sample of two
# successive pairs agrees within 0.5 %, and stops at 512 (see `memory_model` for why small sizes mislead).
LADDER_START = 16
LADDER_MAX = 512
SLOPE_TOLERANCE = 0.005


# ---------------------------------------------------------------------------------------------
# Bytes per parameter

WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
CALCULATOR_OPTIMIZERS = ("adamw", "sgd", "adamw8bit", "paged_adamw8bit")
COMPONENTS = ("weights", "gradients", "optimizer_state", "master_weights")


def _eight_bit_state_bytes(sizes: list[int], min_8bit_size: int) -> int:
    total, any_8bit = 0, False
    for n in sizes:
        if n < min_8bit_size:
            total += 8 * n  # two fp32 moments
        else:
            any_8bit = True
            total += 2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK_SIZE)  # two uint8 moments, an fp32 absmax per block each
    return total + (BNB_QMAP_BYTES if any_8bit else 0)


def training_memory(num_params: int | float, precision: str = "fp32", optimizer: str = "adamw",
                    master_weights: bool | None = None, trainable_params: int | float | None = None,
                    tensor_sizes: Iterable[int] | None = None, min_8bit_size: int = MIN_8BIT_SIZE,
                    momentum: bool = True) -> dict:
    """Bytes of training memory that do not depend on the batch: the standard per-parameter accounting.

    Components (activations are extra and grow with the batch):

    - ``weights``: 4 bytes per parameter in fp32, 2 in fp16/bf16.
    - ``gradients``: one per trainable parameter, in the weights' dtype.
    - ``master_weights``: an fp32 copy of the trainable weights when the weights are half precision
      (``master_weights=None`` means yes for fp16/bf16): the optimizer updates the copy, and the half
      weights are rounded from it. ``master_weights=False`` is "pure" half-precision training.
    - ``optimizer_state``: AdamW two moments in the dtype of the weights it updates (8 bytes per
      trainable parameter for fp32 or master weights, 4 for pure half weights); SGD one momentum buffer
      (none when ``momentum=False``); 8-bit AdamW (``adamw8bit``, ``paged_adamw8bit``) two uint8 moments
      plus an fp32 absmax per 256-value block for each (2 + 8/256 = 2.03 bytes per parameter) and 2 KiB
      of shared quantisation maps; tensors with fewer than ``min_8bit_size`` elements keep fp32 moments
      (8 bytes), which only ``tensor_sizes`` can account for (without it every tensor counts as large).
      Paged state has the same size; it can be paged out to CPU memory.

    Two conventions for "mixed precision": ``torch.autocast`` (what labkit's ``precision="bf16"`` runs)
    keeps the weights, gradients and optimizer state in fp32 and only computes in half precision, so
    describe it here as ``precision="fp32"`` (4 + 4 + 8 = 16 bytes per parameter with AdamW; autocast
    saves activation memory, not these). The classic recipe (Micikevicius et al. 2018) and the ZeRO paper
    keep fp16 weights and gradients plus an fp32 master copy: 2 + 2 + (4 + 8) = 16 bytes per parameter
    (ZeRO counts the master copy as optimizer state, "12 bytes"): the same total, split differently.
    Not counted: AdamW's per-tensor step counters (4 bytes each) and allocator overhead.

    Args:
        num_params: the model's parameters (a count; 7e9 is fine).
        precision: dtype of the stored weights: ``fp32``, ``fp16`` or ``bf16``.
        optimizer: ``adamw``, ``sgd``, ``adamw8bit`` or ``paged_adamw8bit``.
        master_weights: keep an fp32 master copy (default: yes for half-precision weights, never for fp32).
        trainable_params: parameters that get gradients and optimizer state (default all).
        tensor_sizes: element counts of the trainable tensors, for the exact 8-bit accounting.
        min_8bit_size: bitsandbytes' threshold (default 4096).
        momentum: SGD keeps a momentum buffer (labkit's default momentum is 0.9).

    Returns:
        A dict of bytes: ``weights``, ``gradients``, ``optimizer_state``, ``master_weights``, ``total``.

    Example:
        >>> training_memory(7e9, optimizer="adamw")["total"] / 1e9   # fp32 + AdamW: 16 bytes/param
        112.0
        >>> training_memory(7e9, "bf16", "adamw")                   # 2 + 2 + 8 + 4 = 16 bytes/param
    """
    if not is_number(num_params) or num_params <= 0:
        raise ConfigError("num_params", num_params, "a number of parameters > 0 (e.g. 7e9)")
    if precision not in WEIGHT_BYTES:
        raise ConfigError("precision", precision, f"one of {list(WEIGHT_BYTES)} (the dtype of the stored weights)",
                          "torch.autocast keeps fp32 weights: describe an autocast run as 'fp32'")
    if optimizer not in CALCULATOR_OPTIMIZERS:
        raise ConfigError("optimizer", optimizer, f"one of {list(CALCULATOR_OPTIMIZERS)}")
    if master_weights not in (None, True, False):
        raise ConfigError("master_weights", master_weights, "None (the default for the precision), True or False")
    if precision == "fp32" and master_weights:
        raise ConfigError("master_weights", master_weights, "None or False with precision='fp32'",
                          "fp32 weights are their own master copy")
    trainable = num_params if trainable_params is None else trainable_params
    if not is_number(trainable) or not 0 <= trainable <= num_params:
        raise ConfigError("trainable_params", trainable_params, f"None or a number from 0 to num_params={num_params:g}")
    if not is_int(min_8bit_size) or min_8bit_size < 0:
        raise ConfigError("min_8bit_size", min_8bit_size, "an integer >= 0")
    if not isinstance(momentum, bool):
        raise ConfigError("momentum", momentum, "True or False")
    if optimizer != "sgd" and momentum is not True:
        raise ConfigError("momentum", momentum, "True (the default) unless optimizer='sgd'",
                          f"{optimizer} has no momentum setting")
    sizes = None
    if tensor_sizes is not None:
        sizes = list(tensor_sizes)
        if not all(is_int(n) and n >= 0 for n in sizes) or sum(sizes) != trainable:
            raise ConfigError("tensor_sizes", f"{len(sizes)} sizes summing to {sum(sizes) if all(map(is_int, sizes)) else '?'}",
                              f"element counts (integers >= 0) of the trainable tensors, summing to {trainable:g}")
    half = WEIGHT_BYTES[precision] == 2
    master = half if master_weights is None else master_weights
    weight_bytes = WEIGHT_BYTES[precision]
    updated_bytes = 4 if (master or not half) else weight_bytes  # dtype of the weights the optimizer updates
    if optimizer == "adamw":
        state = 2 * updated_bytes * trainable
    elif optimizer == "sgd":
        state = updated_bytes * trainable if momentum else 0
    elif sizes is not None:
        state = _eight_bit_state_bytes(sizes, min_8bit_size)
    else:
        state = (2 * trainable + 2 * 4 * math.ceil(trainable / BNB_BLOCK_SIZE) + BNB_QMAP_BYTES) if trainable else 0
    out = {"weights": weight_bytes * num_params, "gradients": weight_bytes * trainable,
           "optimizer_state": state, "master_weights": 4 * trainable if master else 0}
    out = {k: int(round(v)) for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def model_training_memory(model: nn.Module, precision: str = "fp32", optimizer: str = "adamw",
                          master_weights: bool | None = None, device: torch.device | str = "cpu",
                          min_8bit_size: int = MIN_8BIT_SIZE, momentum: bool = True) -> dict:
    """`training_memory` for a real model, exact to the byte: what labkit's memory breakdown should measure.

    Uses the model's trainable tensor sizes (exact 8-bit accounting), adds its buffers (BatchNorm running
    statistics) to ``weights`` as labkit's ``parameters`` category does, and torch AdamW's 4-byte step
    counter per tensor when training on the CPU (on a GPU they stay on the CPU and are not GPU memory).

    Example:
        >>> model_training_memory(model, optimizer="adamw8bit")["optimizer_state"]
    """
    trainable = [p.numel() for p in model.parameters() if p.requires_grad]
    num_params = sum(p.numel() for p in model.parameters())
    out = training_memory(num_params, precision, optimizer, master_weights, trainable_params=sum(trainable),
                          tensor_sizes=trainable, min_8bit_size=min_8bit_size, momentum=momentum)
    out["weights"] += sum(b.numel() * b.element_size() for b in model.buffers())
    if optimizer == "adamw" and torch.device(device).type == "cpu":
        out["optimizer_state"] += 4 * len(trainable)
    out["total"] = sum(out[k] for k in COMPONENTS)
    return out


# ---------------------------------------------------------------------------------------------
# One measured training step


def state_bytes(model: nn.Module, cfg: RunConfig, device: torch.device | str = "cpu") -> dict:
    """The memory training needs before a single sample, computed (not measured) from the model.

    ``parameters`` (with buffers), ``gradients`` (one per trainable parameter), ``optimizer_state``
    (AdamW: two moments per trainable parameter, plus a 4-byte step counter per tensor when training on
    the CPU, where the counters live; SGD: one momentum buffer when ``momentum > 0``; 8-bit AdamW: about
    2 bytes per parameter, 32-bit state for tensors below ``min_8bit_size``) and ``total``, computed by
    `model_training_memory`.

    Example:
        >>> state_bytes(model, cfg)["total"]
    """
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
        # The trainer's own batch size only has to be valid (the probes choose theirs), and the starting
        # weights do not change memory: random ones skip loading a checkpoint and its warnings.
        self.trainer = train.Trainer(cfg.replace(batch_size=2 * cfg.grad_accum, evaluate=False, pretrained=False))
        self.cfg, self.device, self.model = cfg, self.trainer.device, self.trainer.model
        self.min_micro_batch = 2 if models.has_batchnorm(self.model) else 1
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
    check_positive_int("limit", limit)
    if start is not None and (not is_int(start) or start < 1 or start % grad_accum):
        raise ConfigError("start", start, f"a positive multiple of grad_accum={grad_accum}")
    started = time.perf_counter()
    probe = _StepProbe(cfg)
    state = probe.state_bytes
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

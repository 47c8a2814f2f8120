"""One measured training step at a batch size (`step_memory`, the measurement `labkit.fit` reports as
``peak_memory_bytes``) and the memory a model's state holds before any step (`state_bytes`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .. import data, measure, models, train
from ..config import RunConfig
from ..errors import ConfigError, LabkitError
from ..result import MEMORY_CATEGORIES
from ..techniques.oom_backoff import largest_activation_elements
from ..techniques.precision import autocast, grad_scaler
from ..validate import is_int
from .accounting import model_training_memory


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

    def activation_elements_per_sample(self) -> int:
        """Elements of the largest activation of one sample (a forward at the smallest batch, under autocast)."""
        trainer = self.trainer
        images, _ = self._inputs(self.min_micro_batch)
        x = data.to_model_input(images, trainer.train_split, self.device, self.cfg.channels_last, self.cfg.image_size)
        with autocast(trainer.precision, self.device):
            return largest_activation_elements(self.model, x)

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

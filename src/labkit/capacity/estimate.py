"""Memory is about ``fixed + bytes_per_sample * batch_size``: measure it (`memory_model`), fit it
(`fit_linear_memory`), predict it (`estimate_memory`).

Which moment of the step is the peak depends on the batch size: with a few samples it is the
optimizer step (parameters + gradients + optimizer state + its temporaries), with many it is the
start of the backward pass, when all activations are alive. A line through two small sizes therefore
predicts large batches badly. By default `memory_model` measures the smallest valid batch and micro-batches of
16, 32, 64, ... samples (times ``grad_accum``) until the growth per sample of two successive pairs
agrees within 0.5 % (at most 512 per micro-batch), and fits the line through the last two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..config import RunConfig
from ..errors import ConfigError
from ..result import MEMORY_CATEGORIES
from ..validate import is_int
from .steps import StepMemory, _StepProbe

# `memory_model` measures micro-batches of 16, 32, 64, ... samples until the growth per sample of two
# successive pairs agrees within 0.5 %, and stops at 512 (see `memory_model` for why small sizes mislead).
LADDER_START = 16


LADDER_MAX = 512


SLOPE_TOLERANCE = 0.005


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

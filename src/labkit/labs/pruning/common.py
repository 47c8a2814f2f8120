"""What every section of notebook 04 shares: the fine-tuned model, FLOPs, nonzero counts, and timing noise."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ... import measure, results
from ...config import RunConfig
from ...env import Profile, profile
from ...inference import LATENCY_BATCH, LATENCY_ROUNDS, _splits, accuracy, example_batch, latencies

__all__ = ["LATENCY_BATCH", "LATENCY_ROUNDS", "_splits", "accuracy", "example_batch", "fine_tuned", "forward_flops",
           "latencies", "latencies_with_band", "latency_band", "nonzero_params", "points"]


def points(difference: float, sign: bool = False, digits: int = 1) -> str:
    """An accuracy difference in percentage points: 0.012 -> "1.2 points".

    Args:
        difference: a difference of two accuracies (fractions).
        sign: always write the sign.
        digits: decimals.
    """
    return f"{difference * 100:{'+' if sign else ''}.{digits}f} points"


def fine_tuned(cfg: RunConfig, progress: bool = True) -> tuple[nn.Module, object]:
    """The model ``cfg`` fine-tunes, and its `RunResult`: trained once, then read from the cache.

    Args:
        cfg: the fine-tune (notebook 00's baseline).
        progress: show a progress bar while it trains.

    Example:
        >>> model, result = fine_tuned(labkit.config.baseline())
    """
    return results.cached_model(cfg, progress=progress)


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward of ``x`` (matmuls and convolutions), as `labkit.measure.count_flops` counts them.

    Args:
        model: the model (run in eval mode, then put back).
        x: the batch.
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        flops = measure.count_flops(lambda: model(x))
    model.train(was_training)
    return flops


def nonzero_params(model: nn.Module) -> int:
    """The parameters of ``model`` that are not zero.

    Args:
        model: the model.
    """
    return sum(int((p.detach() != 0).sum()) for p in model.parameters())


def latency_band(model: nn.Module, x: torch.Tensor, prof: Profile | None = None) -> tuple[float, float]:
    """The 10th and 90th percentile of ``model``'s single-call latencies on ``x``, each over their median.

    Args:
        model: the reference model (the dense one).
        x: the batch it is timed on.
        prof: the profile (its ``repeats``, at least 8 calls; default: the active one).
    """
    prof = prof or profile()
    lat = measure.measure_latency(model, x, warmup=1, repeats=max(8, prof.repeats))
    return lat.p10_s / lat.median_s, lat.p90_s / lat.median_s


def latencies_with_band(models: list[nn.Module], x: torch.Tensor, prof: Profile | None = None,
                        reference: int = 0) -> tuple[list[float], tuple[float, float]]:
    """`latencies` of ``models`` (timed in turns), and the noise band of a ratio to the reference model's.

    The band spans the reference's call-to-call spread (`latency_band`) and a copy of it timed in the same
    turns (its median over the reference's): a ratio inside it is noise.

    Args:
        models: the models to compare.
        x: the batch.
        prof: the profile (default: the active one).
        reference: the index of the model the ratios are taken to.
    """
    prof = prof or profile()
    *times, again = latencies([*models, copy.deepcopy(models[reference])], x, prof)
    low, high = latency_band(models[reference], x, prof)
    repeat = again / times[reference]
    return times, (min(low, repeat), max(high, repeat))

"""What notebook 04's sections share: the fine-tuned model, FLOPs, nonzero counts and latencies with their noise."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ... import measure, results
from ...env import profile
from ...inference import latencies


def points(difference: float, sign: bool = False, digits: int = 1) -> str:
    """An accuracy difference in percentage points: 0.012 -> "1.2 points"."""
    return f"{difference * 100:{'+' if sign else ''}.{digits}f} points"


def fine_tuned(cfg, progress: bool = True) -> tuple[nn.Module, object]:
    """The model ``cfg`` fine-tunes, and its `RunResult`: trained once, then read from the cache."""
    return results.cached_model(cfg, progress=progress)


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward of ``x`` in eval mode (`labkit.measure.count_flops`)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        flops = measure.count_flops(lambda: model(x))
    model.train(was_training)
    return flops


def nonzero_params(model: nn.Module) -> int:
    return sum(int((p.detach() != 0).sum()) for p in model.parameters())


def timed(models: list[nn.Module], x: torch.Tensor, reference: int = 0) -> dict:
    """``models``' median latencies on ``x`` timed in turns (``latency_s``), each with the reference model's relative
    call-to-call spread, widened to hold a copy of it timed in the same turns (``latency_p10_s``/``_p90_s``)."""
    prof = profile()
    *times, again = latencies([*models, copy.deepcopy(models[reference])], x, prof)
    lat = measure.measure_latency(models[reference], x, warmup=1, repeats=max(8, prof.repeats))
    repeat = again / times[reference]
    low, high = min(lat.p10_s / lat.median_s, repeat), max(lat.p90_s / lat.median_s, repeat)
    return {"latency_s": times, "latency_p10_s": [t * low for t in times], "latency_p90_s": [t * high for t in times]}

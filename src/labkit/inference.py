"""Inference on a trained model: its accuracy on a split, a batch as it sees it, latencies timed in turns.

Shared by the notebooks that change a trained model and compare it with the original (04 pruning,
06 quantization, 08 LoRA's merge). A language model is timed as `LogitsOnly` on a batch of `prompt_ids`.
"""

from __future__ import annotations

import copy
import statistics

import torch
from torch import nn

from . import data, evaluation, measure, train
from .config import RunConfig
from .env import Profile, profile, resolve_device
from .errors import ConfigError
from .techniques.precision import resolve_precision

LATENCY_BATCH = 64


class LogitsOnly(nn.Module):
    """A causal language model called on input ids alone, returning its logits (what `latencies` times)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def prompt_ids(cfg: RunConfig, rows: int, split: str = "test") -> torch.Tensor:
    """``rows`` examples of a language-model split as one rectangular batch of ids, cut to the shortest of them
    (a small split repeats): the same tokens for every model timed.

    Args:
        cfg: the run (its dataset). rows: the batch's rows. split: ``test`` or ``val``.
    """
    data_split = _splits(cfg)[split]
    chosen = [data_split[i % len(data_split)]["input_ids"] for i in range(rows)]
    width = min(len(ids) for ids in chosen)
    return torch.stack([ids[:width] for ids in chosen])


def model_device(model: nn.Module) -> torch.device:
    """Where ``model`` runs: the device of its first parameter or buffer; the CPU when it has neither.

    A statically quantized model keeps its weights in packed CPU objects, which are neither.
    """
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _splits(cfg: RunConfig) -> dict:
    return train.run_splits(cfg, training=False)


def accuracy(model: nn.Module, cfg: RunConfig, split: str = "val") -> float:
    """Accuracy of ``model`` on the ``val`` (choices: sensitivity, ratios) or ``test`` split (the final word)."""
    if split not in ("val", "test"):
        raise ConfigError("split", split, "'val' (for choosing) or 'test' (for reporting)")
    device = model_device(model)
    precision = resolve_precision("fp32", device)
    return evaluation.evaluate(model, _splits(cfg)[split], cfg, device, precision)


def example_batch(cfg: RunConfig, batch_size: int = LATENCY_BATCH, device=None) -> torch.Tensor:
    """``batch_size`` test images as the model sees them, on ``device`` (default: the run's)."""
    test = _splits(cfg)["test"]
    images = test.images[:batch_size]
    if len(images) < batch_size:  # a tiny test split: repeat it
        images = images.repeat((batch_size + len(images) - 1) // len(images), 1, 1, 1)[:batch_size]
    device = resolve_device(cfg.device) if device is None else device
    return data.to_model_input(images, test, device, cfg.channels_last, cfg.image_size)


# Rounds of timing, every other one in reverse order: a model timed first in a round tends to run a few percent
# faster than one timed later (caches, clocks), so each model takes each place equally often.
LATENCY_ROUNDS = 4


def latencies(models: list[nn.Module], x: torch.Tensor, prof: Profile | None = None, cpu: bool = False) -> list[float]:
    """Median inference latency of each model on ``x``, measured in turns (a few calls of each, round after round).

    Turns make a slow spell of the machine (another process, a clock change) hit every model alike; every other
    round runs in reverse order, so that no model gains from its place in the round.

    Args:
        models: the models to compare.
        x: the batch (on the device they run on).
        prof: the profile (its ``repeats`` calls per model in all; default: the active one).
        cpu: time CPU copies of the models (when they live on a GPU: fewer calls, a CPU is slow).
    """
    prof = prof or profile()
    warmup = max(2, prof.warmup_steps)
    if cpu and x.device.type != "cpu":  # a full-size model on a cloud VM's CPU: seconds per call
        models, x = [copy.deepcopy(m).cpu() for m in models], x.cpu()
        calls, warmup = 1, 1
    else:
        calls = max(2, prof.repeats // LATENCY_ROUNDS)
    times: list[list[float]] = [[] for _ in models]
    for model in models:  # warm-up, untimed
        measure.measure_latency(model, x, warmup=warmup, repeats=1)
    order = list(range(len(models)))
    for round_index in range(LATENCY_ROUNDS):
        for i in order if round_index % 2 == 0 else order[::-1]:
            times[i] += measure.measure_latency(models[i], x, warmup=0, repeats=calls).times_s
    return [statistics.median(t) for t in times]



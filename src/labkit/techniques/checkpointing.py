"""Gradient (activation) checkpointing, the mechanism: what ``RunConfig(checkpointing=...)`` does.

A model's blocks run in checkpointed segments under ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``: each segment keeps only its input, and its activations are recomputed in the
backward pass. Losses, gradients and BatchNorm running statistics equal the un-checkpointed model's (the
recomputation updates scratch copies of the statistics; torch alone would update them twice per step). Without
gradients (evaluation under ``torch.no_grad``) the model runs as usual. The module structure and the state_dict
do not change; ``apply_checkpointing(model, False)`` restores the plain forward. Notebook 03's measurements of
what it saves and costs are in `labkit.labs.memory_savers`.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import models
from ..errors import ConfigError
from ..validate import is_int

_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


class _KeepBatchNormStats:
    """Context for a checkpoint's recomputation: BatchNorm layers update scratch copies of their running
    statistics, which are dropped afterwards.

    Recomputing a segment runs its forward a second time, in train mode, and every BatchNorm layer in it
    would update ``running_mean``/``running_var`` (and ``num_batches_tracked``) again: twice per step in
    all (torch does nothing about it). Turning the update off instead (``track_running_stats=False``) is
    not possible: BatchNorm then saves different tensors and torch's checkpoint raises a CheckpointError.
    """

    def __init__(self, batchnorms: list[nn.Module]):
        self.batchnorms = batchnorms
        self._kept: list[dict] = []

    def __enter__(self):
        self._kept = []
        for bn in self.batchnorms:
            kept = {name: bn._buffers[name] for name in _BN_BUFFERS if bn._buffers.get(name) is not None}
            self._kept.append(kept)
            for name, tensor in kept.items():
                bn._buffers[name] = tensor.clone()
        return self

    def __exit__(self, *exc):
        for bn, kept in zip(self.batchnorms, self._kept, strict=True):
            bn._buffers.update(kept)
        self._kept = []
        return False


class Segment:
    """Consecutive blocks run as one checkpointed unit."""

    def __init__(self, names: list[str], stages: list[nn.Module], model: nn.Module):
        registered = {id(m) for m in model.modules()}
        # A stage may be a view built by `named_stages` (e.g. a ResNet's stem, a Sequential of conv1, bn1,
        # relu, maxpool): call its children, which are the model's own modules, not the view.
        self.calls = []
        for stage in stages:
            self.calls.extend([stage] if id(stage) in registered else list(stage.children()))
        self.names = names
        self.batchnorms = [m for stage in stages for m in stage.modules()
                           if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def run(self, x: torch.Tensor) -> torch.Tensor:
        for call in self.calls:
            x = call(x)
        return x

    def contexts(self):
        return contextlib.nullcontext(), _KeepBatchNormStats(self.batchnorms)


class _CheckpointedForward:
    """The forward a checkpointed model runs: its blocks in checkpointed segments, then its head."""

    def __init__(self, model: nn.Module, segments: list[Segment]):
        self.model = model
        self.segments = segments

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        model = self.model
        if not torch.is_grad_enabled():  # evaluation: nothing is stored for a backward pass anyway
            return type(model).forward(model, x)
        for segment in self.segments:
            x = checkpoint(segment.run, x, use_reentrant=False, context_fn=segment.contexts)
        return models.forward_head(model, x)


def checkpoint_blocks(model: nn.Module | str) -> list[str]:
    """The blocks of ``model`` that checkpointing can wrap: every stage before the head, in forward order.

    small_cnn: ``stem, block1, block2, block3``; ResNets: ``stem, layer1 .. layer4``; ShuffleNetV2:
    ``stem, stage2, stage3, stage4, conv5``. The stem counts: in a CNN it works at full resolution and
    often holds the largest activations. A model labkit cannot split raises `ConfigError`.

    Example:
        >>> checkpoint_blocks("small_cnn")
        ['stem', 'block1', 'block2', 'block3']
    """
    return models.block_names(model)


def checkpoint_segments(model: nn.Module | str, checkpointing: bool | int) -> list[list[str]]:
    """How ``checkpointing`` groups ``model``'s blocks into checkpointed segments (``[]`` when off).

    ``True`` puts every block in its own segment; an int ``k`` splits the ``n`` blocks into ``k`` runs of
    consecutive blocks, as even as possible with the longer runs first.

    Args:
        model: a model from `labkit.models.build`, or a model name.
        checkpointing: False, True or 1 .. number of blocks.

    Example:
        >>> checkpoint_segments("small_cnn", 2)
        [['stem', 'block1'], ['block2', 'block3']]
    """
    if checkpointing is False:
        return []
    try:
        names = checkpoint_blocks(model)
    except ConfigError as exc:
        name = model if isinstance(model, str) else type(models.unwrap(model)).__name__
        raise ConfigError(
            "checkpointing", checkpointing,
            f"False for a {name}: labkit splits only the models of labkit.models.build "
            f"({', '.join(models.available())}) into blocks",
            "For a model of your own, call torch.utils.checkpoint.checkpoint(block, x, "
            "use_reentrant=False) on its blocks in its forward",
        ) from exc
    n = len(names)
    label = model if isinstance(model, str) else getattr(models.unwrap(model), "labkit_name", "this model")
    if checkpointing is True:
        segments = n
    elif is_int(checkpointing) and 1 <= checkpointing <= n:
        segments = int(checkpointing)
    else:
        raise ConfigError("checkpointing", checkpointing,
                          f"False, True or 1 to {n}: {label} has {n} blocks ({', '.join(names)}), and a "
                          "segment holds at least one")
    sizes = [n // segments + (1 if i < n % segments else 0) for i in range(segments)]
    groups, start = [], 0
    for size in sizes:
        groups.append(names[start:start + size])
        start += size
    return groups


def apply_checkpointing(model: nn.Module, checkpointing: bool | int) -> nn.Module:
    """Run ``model``'s blocks in checkpointed segments (in place); what ``RunConfig(checkpointing=...)`` does.

    Args:
        model: a model from `labkit.models.build` (DDP/compile wrappers are looked through).
        checkpointing: False, True (every block its own segment) or the number of segments (`checkpoint_segments`).

    Returns:
        ``model``, with ``model.labkit_checkpoint_segments`` listing the segments' block names.

    Example:
        >>> model = apply_checkpointing(models.build("small_cnn", 10)[0], checkpointing=2)
        >>> model.labkit_checkpoint_segments
        [['stem', 'block1'], ['block2', 'block3']]
    """
    m = models.unwrap(model)
    groups = checkpoint_segments(m, checkpointing)
    m.__dict__.pop("forward", None)
    m.labkit_checkpoint_segments = groups
    if groups:
        stages = dict(models.named_stages(m))
        m.forward = _CheckpointedForward(m, [Segment(g, [stages[name] for name in g], m) for g in groups])
    return model

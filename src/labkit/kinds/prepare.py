"""What a run's fields do to its model before training (`prepare_model`: LoRA adapters, checkpointing, freezing),
and the check on a model handed to the loop (`given_weights`)."""

from __future__ import annotations

import torch

from .. import models
from ..config import RunConfig
from ..errors import ConfigError
from ..techniques.freezing import freeze
from ..techniques.lora import add_lora, lora_layers
from .language import LanguageKind
from .vision import VisionKind


def kind_for(cfg: RunConfig, data=None, tokenizer=None):
    """The kind that runs ``cfg``: `LanguageKind` for a language model, else `VisionKind` (``data`` and ``tokenizer``:
    what was passed to `labkit.fit` beside the config).

    Example:
        >>> kind_for(labkit.RunConfig(model="tiny_llama", dataset="digits_sort")).name
        'language'
    """
    if models.is_language_model(cfg.model):
        return LanguageKind(data, tokenizer)
    if data is not None or tokenizer is not None:
        raise ConfigError("data", type(data if data is not None else tokenizer).__name__,
                          "None for a vision model: its own images come as a folder (dataset='path/to/folder')")
    return VisionKind()


def given_weights(model: torch.nn.Module, cfg: RunConfig) -> models.WeightsInfo:
    """Check that a model handed to `Trainer` is the one ``cfg`` names; its weights are "given". A learner's own
    model (``cfg.model`` a hub id, a directory, ``torchvision:NAME``) may be any module: ``cfg.model`` names it."""
    inner = models.unwrap(model)
    name = getattr(inner, "labkit_name", None)
    if name != cfg.model and cfg.model not in models.available() + models.language_models():
        inner.labkit_name = cfg.model
    elif name != cfg.model:
        raise ConfigError("model", type(model).__name__,
                          f"a model built by labkit.models.build({cfg.model!r}, ...) (or a copy of one), since "
                          f"cfg.model={cfg.model!r}; this one is {name!r}")
    return models.WeightsInfo("given")


def _add_lora(model: torch.nn.Module, cfg: RunConfig) -> None:
    """``cfg.lora_rank``'s adapters; a model that already has LoRA layers of that rank (QLoRA's 4-bit base, built by
    hand) keeps them."""
    existing = {layer.rank for layer in lora_layers(model).values()}
    if existing and existing != {cfg.lora_rank}:
        raise ConfigError("lora_rank", cfg.lora_rank,
                          f"None or {sorted(existing)}: the given model already has LoRA layers of that rank")
    if existing:
        return
    try:
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, cfg.lora_dropout)
    except ConfigError as error:  # name the config field the learner set
        raise ConfigError(f"lora_{error.field}", error.value, error.allowed) from None


def prepare_model(model: torch.nn.Module, cfg: RunConfig) -> torch.nn.Module:
    """What ``cfg``'s technique fields do to a model before training: LoRA adapters, checkpointing, freezing."""
    if cfg.lora_rank is not None:
        _add_lora(model, cfg)
    if cfg.checkpointing is not False:
        kind_for(cfg).checkpoint(model, cfg)
    if cfg.freeze not in (None, "none"):
        freeze(model, cfg.freeze)
    return model

"""Per-decoder-layer checkpointing on a transformers language model: what ``RunConfig(checkpointing=True)`` does
on one.

Each decoder layer keeps only its input hidden states; its attention and MLP activations are recomputed in the
backward pass (``torch.utils.checkpoint`` with ``use_reentrant=False``), so activation memory grows with the number
of layers x tokens x hidden size instead of with every intermediate tensor. transformers does the wrapping; its
method was renamed in version 5 (``activation_checkpointing_enable``, ``gradient_checkpointing_enable`` kept as a
deprecated alias that warns), and transformers 4 (Colab's) has only the old name::

    enable = getattr(model, "activation_checkpointing_enable", None)   # transformers 5
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:                                                              # transformers 4
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

transformers checkpoints in training mode only (``model.train()``); evaluation runs the plain layers.
"""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError

KWARGS = {"use_reentrant": False}
METHODS = ("activation_checkpointing_enable", "gradient_checkpointing_enable")  # transformers 5, then 4


def checkpoint_decoder_layers(model: nn.Module) -> str:
    """Checkpoint every decoder layer of transformers model ``model`` (in place); returns the method used.

    Raises `ConfigError` (field ``checkpointing``) for a model without either method or one that cannot be
    checkpointed.

    Example:
        >>> checkpoint_decoder_layers(model)  # transformers 5
        'activation_checkpointing_enable'
    """
    for name in METHODS:
        enable = getattr(model, name, None)
        if enable is None:
            continue
        if not getattr(model, "supports_gradient_checkpointing", False):
            break
        if name == "activation_checkpointing_enable":
            enable(activation_checkpointing_kwargs=dict(KWARGS))
        else:
            enable(gradient_checkpointing_kwargs=dict(KWARGS))
        return name
    raise ConfigError("checkpointing", True, f"False for {type(model).__name__}: it has none of transformers' "
                      f"per-layer checkpointing methods ({', '.join(METHODS)}) or does not support them")


def is_checkpointing(model: nn.Module) -> bool:
    """Whether ``model``'s decoder layers are checkpointed (transformers' own flag, under either version's name)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        flag = getattr(model, name, None)
        if flag is not None:
            return bool(flag)
    return False

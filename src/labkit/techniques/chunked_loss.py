"""Chunked cross-entropy for causal language models: what ``RunConfig(loss_chunks=...)`` does.

A language model's logits are rows x length x vocabulary numbers, upcast to float32 for the loss: at 4 x 512
tokens and a 32k vocabulary that is 256 MiB, plus as much again for their gradient, more than a small model's
weights. Computing the output layer and the loss a slice of the sequence at a time, under a non-reentrant
checkpoint, keeps one slice's logits alive instead of all of them; the backward recomputes each slice's logits
from the final hidden states (one more output-layer matmul per step). Loss and gradients are the unchunked ones
to rounding::

    hidden = model.model(input_ids=ids, position_ids=positions).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    loss = 0
    for h, y in zip(hidden.chunk(chunks, dim=1), targets.chunk(chunks, dim=1)):
        loss = loss + checkpoint(slice_loss, h, y, model.lm_head.weight, use_reentrant=False)

Liger Kernel's fused linear cross-entropy goes further (a Triton kernel that never writes a slice's logits out);
this is the plain-PyTorch version of the same idea.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..choices import check_loss_chunks  # noqa: F401 - the check RunConfig uses, part of this module's API
from ..errors import ConfigError
from ..text import IGNORE_INDEX
from ..validate import is_int


def _slice_loss_sum(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def chunked_loss_sum(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, chunks: int) -> torch.Tensor:
    """The SUM of next-token cross-entropies over the label tokens, the output layer applied ``chunks`` slices of
    the sequence at a time (position t predicts token t + 1; float32 loss, as `token_loss.token_loss_sum`).

    Args:
        hidden: the final hidden states, [rows, width, hidden] (the decoder body's output, after its norm).
        head: the output layer, an ``nn.Linear`` (``model.lm_head``; a LoRA-wrapped one runs as a module).
        labels: [rows, width], unshifted, -100 where no loss is taken.
        chunks: how many slices; 1 still recomputes the logits in the backward.
    """
    if not is_int(chunks) or chunks < 1:
        raise ConfigError("loss_chunks", chunks, "an integer >= 1")
    hidden, targets = hidden[:, :-1], labels[:, 1:]
    total = hidden.new_zeros((), dtype=torch.float32)
    plain = type(head) is nn.Linear
    for part, part_targets in zip(hidden.chunk(chunks, dim=1), targets.chunk(chunks, dim=1), strict=True):
        if plain:
            total = total + checkpoint(_slice_loss_sum, part, part_targets, head.weight, head.bias,
                                       use_reentrant=False)
        else:  # e.g. a LoRA layer around the head: its parameters are the module's own
            total = total + checkpoint(_module_slice_loss_sum, head, part, part_targets, use_reentrant=False)
    return total


def _module_slice_loss_sum(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def logits_bytes(rows: int, width: int, vocab_size: int, bytes_per_value: int = 4) -> int:
    """Bytes of one batch's logits at ``bytes_per_value`` (4: the float32 upcast the loss takes).

    Example:
        >>> logits_bytes(4, 512, 32000) / 2**20
        250.0
    """
    return rows * width * vocab_size * bytes_per_value

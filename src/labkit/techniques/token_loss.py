"""Token-normalised loss for causal language models, the mechanism behind ``labkit.fit`` on a language model.

A language model's loss is a mean over label tokens, and micro-batches hold different numbers of them. Dividing
each micro-batch's MEAN by ``grad_accum`` weights a token of a short micro-batch more than one of a long one, so the
accumulated gradient is not the large batch's (off by a relative 0.1-1 with digits_sort's uneven answers). Dividing
each micro-batch's SUM of token losses by the step's TOTAL label tokens gives exactly the large batch's gradient;
transformers does the same when its Trainer passes ``num_items_in_batch``::

    total = sum(micro.counts().label_tokens for micro in micro_batches)
    for micro in micro_batches:
        (token_loss_sum(model(**forward_inputs(micro)).logits, micro.labels) / total).backward()
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..text import IGNORE_INDEX, TokenBatch


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The SUM of next-token cross-entropies over the label tokens, in float32 (position t predicts token t + 1).

    Args:
        logits: [rows, width, vocab], as the model returns them.
        labels: [rows, width], unshifted, -100 where no loss is taken.
    """
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def forward_inputs(batch: TokenBatch) -> dict:
    """``batch.model_inputs()`` without the labels: the model returns logits and computes no loss of its own."""
    inputs = batch.model_inputs()
    inputs.pop("labels")
    return inputs


def split_rows(batch: TokenBatch, chunks: int) -> list[TokenBatch]:
    """``batch``'s rows in ``chunks`` micro-batches, in order (`TokenBatch.split`)."""
    return batch.split(chunks)


def micro_batch_loss(model: torch.nn.Module, micro: TokenBatch, step_label_tokens: int) -> torch.Tensor:
    """``micro``'s summed token loss divided by the label tokens of the WHOLE optimizer step (see the module).

    Args:
        model: a transformers causal LM.
        micro: one micro-batch, on the model's device.
        step_label_tokens: label tokens summed over every micro-batch of the step (at least 1 is used).
    """
    return token_loss_sum(model(**forward_inputs(micro)).logits, micro.labels) / max(step_label_tokens, 1)

"""Gradient accumulation, the mechanism: one optimizer step over several micro-batches.

Each micro-batch's loss is divided by the number of micro-batches, so the summed gradients are the
mean over the whole batch (`labkit.train.Trainer.step` does this for ``RunConfig(grad_accum=k)``).
Under DistributedDataParallel, `sync_context` skips the gradient all-reduce on all but the last
micro-batch. Notebook 02's measurements are in `labkit.labs.batch_size`.
"""

from __future__ import annotations

import contextlib

from torch import nn

_NO_CONTEXT = contextlib.nullcontext()  # reusable: the training step allocates no context per micro-batch


def sync_context(model: nn.Module, last_micro_batch: bool):
    """``model.no_sync()`` on all but the last micro-batch of an accumulated step, else a no-op context.

    DistributedDataParallel all-reduces gradients in every backward pass; during accumulation only the
    last one needs it. DDP decides during the forward pass, so wrap forward and backward.

    Example:
        >>> with sync_context(model, last_micro_batch=i == grad_accum - 1):
        ...     loss = model(x).sum(); loss.backward()
    """
    no_sync = getattr(model, "no_sync", None)
    if no_sync is None or last_micro_batch:
        return _NO_CONTEXT
    return no_sync()

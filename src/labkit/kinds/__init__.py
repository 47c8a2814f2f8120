"""What the one training loop (`labkit.train`) asks of a model and its data, as types instead of ``if`` s.

A *kind* sets a run up (its splits, its model, the loader) and answers the loop's few questions about a batch:

- `Batch`: ``split(n)`` into micro-batches, ``loss_count()`` (what the summed loss divides by: samples for an image
  batch, label tokens for a token batch, counted on the host), ``counts()`` (tokens, for tokens/s);
- `Kind`: ``batch(item)`` (a loader item as a `Batch`), ``to_device(batch)``, ``loss_sum(model, micro)`` (the summed,
  never averaged, loss of a micro-batch), and the set-up and report steps around them.

`VisionKind` trains classifiers on image batches (`ImageBatch`), `LanguageKind` causal language models on token
batches (`labkit.text.TokenBatch`). `kind_for` picks one for a `RunConfig`. A new model or data source is a new kind.
"""

from __future__ import annotations

from .base import Batch, Kind
from .language import LanguageKind
from .prepare import given_weights, kind_for, prepare_model
from .vision import ImageBatch, VisionKind

__all__ = ["Batch", "ImageBatch", "Kind", "LanguageKind", "VisionKind", "given_weights", "kind_for", "prepare_model"]

"""Batches of token sequences: padded to the longest example, padded to ``seq_len``, or packed into full rows.

``packing`` (`PACKINGS`):

- ``pad``: one example per row, each batch padded to its longest example.
- ``pad_max``: one example per row, padded to ``seq_len`` (fixed shapes: what a compiled model or a
  memory estimate wants, and the most padding).
- ``pack``: whole examples laid end to end in rows of ``seq_len`` tokens, in order, a new row when the next one
  does not fit (no example is split); what is left at a row's end is padding. ``batch_size`` counts rows.

Every batch has ``attention_mask`` (1 on real tokens), ``position_ids`` that restart at 0 where each document starts
and ``document_ids`` (the document's index within its row, -1 on padding), from which `TokenBatch.block_causal_mask`
builds the mask that keeps packed documents apart. Labels are -100 on padding and on each document's first token.

A training loop on transformers 5 (checked on 5.24) should pass `TokenBatch.model_inputs`: for ``pack`` it leaves
``attention_mask`` out and sets ``use_cache=False``, because the Llama models then find the documents from the
restarting ``position_ids`` and mask across them; with a cache (the default ``use_cache=True``, also in train
mode) or with an attention mask of ones, packed documents silently attend to each other.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from ..choices import PACKINGS, check_choice
from ..errors import ConfigError
from ..validate import is_int
from .chars import PAD_ID
from .tasks import IGNORE_INDEX

_TENSORS = ("input_ids", "labels", "attention_mask", "position_ids", "document_ids")  # TokenBatch's, in order
__all__ = ["PACKINGS", "TokenBatch", "TokenCounts", "collate", "make_token_loader", "pack_rows"]


@dataclass(frozen=True)
class TokenCounts:
    """Tokens in one or more batches: all of them, the real (not padding) ones and those the loss counts.

    ``label_tokens`` is what a token-normalised loss divides by (transformers' ``num_items_in_batch``): sum it over
    the micro-batches of one optimizer step. Counts add up: ``sum(counts, TokenCounts())``.
    """

    tokens: int = 0
    real_tokens: int = 0
    label_tokens: int = 0

    @property
    def pad_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.tokens if self.tokens else 0.0

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(self.tokens + other.tokens, self.real_tokens + other.real_tokens,
                           self.label_tokens + other.label_tokens)


@dataclass
class TokenBatch:
    """A batch of token rows: int64 tensors [rows, width]; ``document_ids`` -1 and ``attention_mask`` 0 on pads.

    Example:
        >>> batch = collate([data[0], data[1]], packing="pack", seq_len=64)
        >>> batch.input_ids.shape, batch.position_ids[0, :3].tolist()
        (torch.Size([1, 64]), [0, 1, 2])
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor
    packing: str

    def counts(self) -> TokenCounts:
        """All tokens, real tokens and label tokens in this batch."""
        return TokenCounts(self.input_ids.numel(), int(self.attention_mask.sum()),
                           int((self.labels != IGNORE_INDEX).sum()))

    def loss_count(self) -> int:
        """Label tokens: what a token-normalised loss divides its sum by (`labkit.techniques.token_loss`)."""
        return int((self.labels != IGNORE_INDEX).sum())

    def split(self, chunks: int) -> list[TokenBatch]:
        """The rows in ``chunks`` micro-batches, in order (as wide as this batch, so the step's tokens are its).

        Example:
            >>> [micro.input_ids.shape[0] for micro in batch.split(4)]  # a batch of 8 rows
            [2, 2, 2, 2]
        """
        parts = zip(*(getattr(self, name).chunk(chunks) for name in _TENSORS), strict=True)
        return [TokenBatch(*values, packing=self.packing) for values in parts]

    @property
    def pad_fraction(self) -> float:
        return self.counts().pad_fraction

    def model_inputs(self) -> dict:
        """Keyword arguments for a transformers causal LM: ``model(**batch.model_inputs()).loss``.

        ``pack`` leaves ``attention_mask`` out so that transformers 5 separates the documents from ``position_ids``;
        ``use_cache=False`` always: a cache in training costs memory and, packed, lets documents attend to each other.
        """
        inputs = {"input_ids": self.input_ids, "labels": self.labels, "use_cache": False}
        if self.packing == "pack":
            inputs["position_ids"] = self.position_ids
        else:  # one document per row: the default positions 0, 1, 2, ... are right, padding is masked
            inputs["attention_mask"] = self.attention_mask
        return inputs

    def block_causal_mask(self) -> torch.Tensor:
        """bool [rows, 1, width, width], True where a token may attend: earlier tokens of its own document.

        For an attention that takes a mask (SDPA's ``attn_mask``); a padding token attends to itself only.
        """
        docs = self.document_ids
        width = docs.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=docs.device).tril()
        same_document = (docs[:, :, None] == docs[:, None, :]) & (docs[:, :, None] >= 0)
        return ((same_document & causal) | torch.eye(width, dtype=torch.bool, device=docs.device))[:, None]

    def to(self, device, non_blocking: bool = False) -> TokenBatch:
        """This batch with every tensor on ``device``."""
        moved = {k: getattr(self, k).to(device, non_blocking=non_blocking) for k in _TENSORS}
        return TokenBatch(**moved, packing=self.packing)


def pack_rows(lengths, seq_len: int) -> list[list[int]]:
    """Group examples into rows of at most ``seq_len`` tokens, in order: a new row when the next does not fit.

    Args:
        lengths: tokens per example, each at most ``seq_len``.
        seq_len: tokens per row.

    Example:
        >>> pack_rows([3, 4, 2, 5], seq_len=8)
        [[0, 1], [2, 3]]
    """
    rows, used = [], seq_len
    for index, length in enumerate(int(n) for n in lengths):
        if used + length > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(index)
        used += length
    return rows


def _check_lengths(lengths: list[int], seq_len: int | None) -> None:
    if seq_len is not None and (not is_int(seq_len) or seq_len < 1):
        raise ConfigError("seq_len", seq_len, "a positive integer (tokens per row)")
    if seq_len is not None and lengths and max(lengths) > seq_len:
        raise ConfigError("seq_len", seq_len, f"at least {max(lengths)}, the longest example here; batching never "
                          "truncates (load_text_splits truncates pydoc_text to its seq_len)")


def collate(examples, packing: str = "pad", seq_len: int | None = None, pad_id: int = PAD_ID) -> TokenBatch:
    """Turn examples (dicts of 1-D ``input_ids`` and ``labels``) into one `TokenBatch`.

    Args:
        examples: a list of ``{"input_ids": ..., "labels": ...}``, e.g. items of a `TokenData`.
        packing: one of `PACKINGS`; ``pack`` lays them end to end in as many rows as they need.
        seq_len: tokens per row for ``pad_max`` and ``pack``; for ``pad``, optional, the longest allowed.
        pad_id: the input id on padding (labels there are -100).

    Example:
        >>> batch = collate([data[i] for i in range(8)], packing="pad")
        >>> round(batch.counts().pad_fraction, 2)  # the first 8 examples of digits_sort's train split
        0.28
    """
    check_choice("packing", packing, PACKINGS)
    if packing != "pad" and seq_len is None:
        raise ConfigError("seq_len", seq_len, f"a positive integer: packing={packing!r} makes rows of seq_len tokens")
    examples = list(examples)
    lengths = [len(e["input_ids"]) for e in examples]
    _check_lengths(lengths, seq_len)
    rows = pack_rows(lengths, seq_len) if packing == "pack" else [[i] for i in range(len(examples))]
    return _collate_rows([[examples[i] for i in row] for row in rows], packing, seq_len, pad_id)


def _collate_rows(rows: list[list[dict]], packing: str, seq_len: int | None, pad_id: int) -> TokenBatch:
    if not rows:
        raise ConfigError("examples", [], "at least one example")
    row_lengths = [sum(len(e["input_ids"]) for e in row) for row in rows]
    width = max(row_lengths) if packing == "pad" else seq_len
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.int64)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.int64)
    document_ids = torch.full(shape, -1, dtype=torch.int64)
    position_ids = torch.empty(shape, dtype=torch.int64)
    for r, row in enumerate(rows):
        start = 0
        for d, example in enumerate(row):
            n = len(example["input_ids"])
            input_ids[r, start:start + n] = torch.as_tensor(example["input_ids"])
            labels[r, start:start + n] = torch.as_tensor(example["labels"])
            labels[r, start] = IGNORE_INDEX  # nothing in this document predicts its first token
            position_ids[r, start:start + n] = torch.arange(n)
            document_ids[r, start:start + n] = d
            start += n
        # the padding counts on from 0 too: a block of its own that transformers keeps apart from the documents
        position_ids[r, start:] = torch.arange(width - start)
    attention_mask = (document_ids >= 0).long()
    return TokenBatch(input_ids, labels, attention_mask, position_ids, document_ids, packing)


class _Rows(Dataset):
    """Indexed by a list of row indices (a batch); row i holds one example, or several when packed."""

    def __init__(self, data, rows: list[list[int]]):
        self.data, self.rows = data, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, indices) -> list[list[dict]]:
        return [[self.data[i] for i in self.rows[r]] for r in indices]


def make_token_loader(data, batch_size: int, packing: str = "pad", seq_len: int | None = None, shuffle: bool = True,
                      seed: int = 0, drop_last: bool = False, sampler=None) -> DataLoader:
    """A DataLoader over a `TokenData` split yielding `TokenBatch` es of ``batch_size`` rows.

    Args:
        data: one split from `load_text_splits`.
        batch_size: rows per batch (one example per row, or as many as fit with ``pack``).
        packing: one of `PACKINGS`.
        seq_len: tokens per row (default ``data.seq_len``).
        shuffle: a seeded random order of rows, new on each pass; ``pack`` packs once, in an order seeded by ``seed``.
        seed: seeds the order.
        drop_last: drop a last, smaller batch.
        sampler: row indices to use instead, ignoring ``shuffle`` (a ``DistributedSampler``: call ``set_epoch`` on
            ``loader.sampler.sampler``, which is a new one over the packed rows with ``pack``).

    Example:
        >>> loader = make_token_loader(splits["train"], batch_size=16, packing="pack", seq_len=64)
        >>> model(**next(iter(loader)).model_inputs()).loss
    """
    check_choice("packing", packing, PACKINGS)
    if not is_int(batch_size) or batch_size < 1:
        raise ConfigError("batch_size", batch_size, "a positive integer (rows per batch)")
    seq_len = data.seq_len if seq_len is None else seq_len
    lengths = data.lengths()
    _check_lengths(lengths.tolist(), seq_len)
    if packing == "pack":
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)) if shuffle else \
            torch.arange(len(data))
        rows = [[int(order[i]) for i in row] for row in pack_rows(lengths[order], seq_len)]
    else:
        rows = [[i] for i in range(len(data))]
    dataset = _Rows(data, rows)
    if isinstance(sampler, DistributedSampler) and len(sampler.dataset) != len(dataset):  # packed: fewer rows
        sampler = DistributedSampler(range(len(dataset)), num_replicas=sampler.num_replicas, rank=sampler.rank,
                                     shuffle=sampler.shuffle, seed=sampler.seed, drop_last=sampler.drop_last)
    if sampler is None:
        sampler = (RandomSampler(dataset, generator=torch.Generator().manual_seed(seed)) if shuffle
                   else SequentialSampler(dataset))
    collate_rows = functools.partial(_collate_rows, packing=packing, seq_len=seq_len, pad_id=data.tokenizer.pad_id)
    return DataLoader(dataset, batch_size=None, sampler=BatchSampler(sampler, batch_size, drop_last), num_workers=0,
                      collate_fn=collate_rows)

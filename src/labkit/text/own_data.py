"""A learner's own text data as the train, val and test `TokenData` splits a run uses, and what was done to it.

`load_own_splits` reads the records (`labkit.text.records`), finds their shape, tokenizes them with the loss where it
belongs (`labkit.text.supervised`), truncates at ``seq_len`` and counts it, drops the examples left with no trained
token (counted), refuses data where no token is trained at all, and splits it: a seeded 80/10/10 split (test first)
of the records, stated, since a file is one split. `OwnDataReport` says all of it; a run reports it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..data import SPLITS
from ..errors import ConfigError
from ..messages import note
from .records import check_loss_on, detect_shape, is_data_file, read_records, to_example
from .supervised import chat_template, encode_example, has_generation_marks
from .tasks import IGNORE_INDEX, TokenData

DEFAULT_OWN_SEQ_LEN = 1024  # TRL's SFTConfig max_length; capped at the model's max_position_embeddings
HELD_OUT = 0.1  # the share of the records in each of the test and validation splits


@dataclass(frozen=True)
class OwnDataReport:
    """What labkit did with a learner's data.

    Attributes:
        source: where it came from. shape: its shape (`labkit.text.records.SHAPES`). loss_on: where the loss is.
        records: records read. split_sizes: train, val, test examples. truncated: examples cut at ``seq_len``.
        dropped: examples with no trained token left after truncation (not trained on). supervised_share: the share
            of all tokens that are trained. template: how chat turns were marked (None for other shapes).
    """

    source: str
    shape: str
    loss_on: str
    records: int
    split_sizes: tuple[int, int, int]
    truncated: int
    dropped: int
    supervised_share: float
    template: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def _template_use(tokenizer, shape: str, loss_on: str) -> str | None:
    if shape not in ("messages", "sharegpt"):
        return None
    if chat_template(tokenizer) is None:
        return "ChatML rendered by labkit (the tokenizer has no chat template)"
    if loss_on == "assistant" and not has_generation_marks(tokenizer):
        return "the tokenizer's template; assistant turns found by labkit (the template has no {% generation %} marks)"
    return "the tokenizer's template" + (" with its {% generation %} marks" if loss_on == "assistant" else "")


def _order(count: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if count < 3:
        raise ConfigError("dataset", f"{count} records", "at least 3 records (one each for train, val and test)")
    held = max(1, round(HELD_OUT * count))
    order = np.random.default_rng(seed).permutation(count)
    return order[2 * held:], order[held:2 * held], order[:held]  # test first, as labkit's own tasks draw


def data_fingerprint(spec) -> str:
    """What identifies ``spec``'s content for the results cache: a file's size and modification time."""
    if isinstance(spec, str) and is_data_file(spec) and Path(spec).expanduser().is_file():
        stat = Path(spec).expanduser().stat()
        return f"{stat.st_size}-{stat.st_mtime_ns}"
    return ""


def load_own_splits(spec, tokenizer, seq_len: int, loss_on: str | None = None, columns: dict | None = None,
                    train_size: int | None = None, seed: int = 0, online: bool = True) -> dict[str, TokenData]:
    """A learner's data as ``train``, ``val`` and ``test`` splits (see the module); each split's ``report`` holds an
    `OwnDataReport`.

    Args:
        spec: a file, a ``hf:`` id, a ``datasets.Dataset`` or a list (`labkit.text.records.read_records`).
        tokenizer: the model's tokenizer (labkit's interface: ``encode``, ``bos_id``, ``eos_id``; a transformers
            one inside, for chat templates). seq_len: the most tokens per example; longer ones are cut and counted.
        loss_on: ``completion``, ``assistant``, ``all`` or None (the shape's default). columns: ``{shape's name:
            the data's}`` for other column names. train_size: at most this many training examples (None: all).
        seed: the split's order. online: whether a ``hf:`` id may download.

    Example:
        >>> splits = load_own_splits("chats.jsonl", tokenizer, seq_len=512)
        >>> splits["train"].report.shape, splits["train"].report.loss_on
        ('messages', 'assistant')
    """
    key = (spec, data_fingerprint(spec)) if isinstance(spec, str) else None
    if key is None:
        return _load(spec, tokenizer, seq_len, loss_on, columns, train_size, seed, online)
    return _cached(key, tokenizer, seq_len, loss_on, tuple(sorted((columns or {}).items())), train_size, seed, online)


@functools.lru_cache(maxsize=8)
def _cached(key, tokenizer, seq_len, loss_on, columns, train_size, seed, online):
    return _load(key[0], tokenizer, seq_len, loss_on, dict(columns), train_size, seed, online)


@dataclass(frozen=True)
class Encoded:
    """A learner's records encoded whole (before truncation): ``examples`` (ids, labels), ``shape``, ``loss_on``,
    ``template`` (`OwnDataReport`'s) and ``source``."""

    examples: list
    shape: str
    loss_on: str
    template: str | None
    source: str


def encode_records(spec, tokenizer, loss_on: str | None = None, columns: dict | None = None,
                   online: bool = True) -> Encoded:
    """Every record of ``spec`` as token ids and labels, the loss where ``loss_on`` puts it (`load_own_splits`'s
    arguments), nothing cut or dropped: what the audit reads.

    Example:
        >>> encode_records("chats.jsonl", tokenizer).shape
        'messages'
    """
    records, where, source = read_records(spec, online)
    shape, records = detect_shape(records, columns, source)
    loss_on = check_loss_on(loss_on, shape)
    template = _template_use(tokenizer, shape, loss_on)
    examples = [encode_example(tokenizer, to_example(record, shape, at), loss_on, at)
                for record, at in zip(records, where, strict=True)]
    return Encoded(examples, shape, loss_on, template, source)


def _load(spec, tokenizer, seq_len, loss_on, columns, train_size, seed, online) -> dict[str, TokenData]:
    data = encode_records(spec, tokenizer, loss_on, columns, online)
    records, shape, loss_on, template, source = data.examples, data.shape, data.loss_on, data.template, data.source
    if template is not None and ("found by labkit" in template or "ChatML" in template):
        note(f"{source}: {template}")
    encoded, truncated, dropped = [], 0, 0
    for ids, labels in records:
        cut = len(ids) > seq_len
        truncated += cut
        ids, labels = ids[:seq_len], labels[:seq_len]
        if all(label == IGNORE_INDEX for label in labels):
            dropped += 1
            continue
        encoded.append((ids, labels, cut))
    if not encoded:
        raise ConfigError("loss_on", loss_on, f"a loss on at least one token of {source}",
                          f"every label is masked in all {len(records)} records (at seq_len={seq_len}): check the "
                          "completions or the assistant turns, or use loss_on='all'")
    train, val, test = _order(len(encoded), seed)
    if train_size is not None and train_size > len(train):
        raise ConfigError("train_size", train_size, f"at most {len(train)}, the training examples of {source}")
    train = train[:train_size] if train_size is not None else train
    tokens = sum(len(ids) for ids, _, _ in encoded)
    trained = sum(sum(label != IGNORE_INDEX for label in labels) for _, labels, _ in encoded)
    report = OwnDataReport(source, shape, loss_on, len(records), (len(train), len(val), len(test)), truncated, dropped,
                           trained / tokens, template)
    note(f"{source}: {len(records)} {shape} records, the loss on {loss_on}; one split, so split here (seed {seed}) "
         f"into train/val/test = {len(train)}/{len(val)}/{len(test)}")
    if truncated or dropped:
        note(f"{source}: {truncated} of {len(records)} examples are longer than seq_len={seq_len} and were cut"
             + (f"; {dropped} were left with no trained token and are not trained on" if dropped else ""))
    splits = {}
    for split, indices in zip(("train", "val", "test"), (train, val, test), strict=True):
        chosen = [encoded[int(i)] for i in indices]
        splits[split] = TokenData(source if len(source) < 80 else os.path.basename(source), split,
                                  [torch.tensor(ids, dtype=torch.int64) for ids, _, _ in chosen],
                                  [torch.tensor(labels, dtype=torch.int64) for _, labels, _ in chosen],
                                  tokenizer, seq_len, sum(cut for _, _, cut in chosen), report)
    return {split: splits[split] for split in SPLITS}

"""Language-model datasets by name: token-id sequences with their labels, in deterministic splits.

- ``digits_source``: reverse a string of digits, ``<bos>31415>51413<eos>``. labkit pretrains its small language
  model on it, as it pretrains its CNNs on ``shapes_source``.
- ``digits_sort``: sort the digits, ``<bos>31415>11345<eos>``: the fine-tuning task, scored by `exact_match`. A
  model pretrained on reversing starts near 0 % (it reverses) and knows the format; fine-tuning moves the score.
- ``pydoc_text``: the paragraphs of the Python documentation (`pydoc_documents`) in the BPE's tokens: real text
  of uneven lengths, for padding against packing. Loss on every token.

Every example starts with ``<bos>`` and ends with ``<eos>`` (no ``<bos>`` where a hub model's tokenizer has none).
Each task has labkit's tokenizer (the digits' characters, pydoc_text's BPE) or takes a hub model's own, whose
pretrained embeddings need its ids; the digit tasks then hold the same strings in other ids. Labels are the input
ids with -100 (ignored by ``cross_entropy``) wherever no loss is wanted: the prompt and separator of the digit tasks
(loss on the answer and its ``<eos>`` only), and always the first token, which nothing in its document predicts, so
that a packed row's labels never ask one document to predict the next. Lengths against ``seq_len``: the digit
tasks refuse a ``seq_len`` below their longest example (cutting it would cut the answer; with another tokenizer than
their characters, counted in its tokens); ``pydoc_text`` truncates each paragraph to ``seq_len`` tokens, as
``truncation=True`` does in transformers, and counts them (`TokenData.num_truncated`).

Splits never share an example. The digit tasks draw distinct strings from one generator seeded by the dataset
and ``seed``: test first, then val, then train, so the test split stays the same when ``train_size`` changes.
``pydoc_text`` takes its splits from one seeded permutation of the paragraphs (test, val, train again).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data import SPLITS
from ..errors import ConfigError
from ..validate import is_int
from .bpe import pydoc_bpe, pydoc_documents
from .chars import CharTokenizer

IGNORE_INDEX = -100  # labels with this value take no part in the loss (torch's cross_entropy default)
TEXT_DATASETS = ("digits_source", "digits_sort", "pydoc_text")
DIGITS_LENGTHS = (4, 12)  # the fewest and most digits in a prompt, drawn uniformly
# tokens per row when a run leaves seq_len unset: the digit tasks' longest example fits; a pydoc paragraph is cut
DEFAULT_SEQ_LENS = {"digits_source": 32, "digits_sort": 32, "pydoc_text": 128}
DIGITS_LONGEST = 2 * DIGITS_LENGTHS[1] + 3  # <bos>, the digits, '>', the answer, <eos>
_DIGIT_TASKS = {"digits_source": lambda digits: digits[::-1], "digits_sort": lambda digits: "".join(sorted(digits))}


def available() -> list[str]:
    """The dataset names `load_text_splits` accepts.

    Example:
        >>> labkit.text.available()
        ['digits_source', 'digits_sort', 'pydoc_text']
    """
    return list(TEXT_DATASETS)


def resolve_seq_len(name: str, seq_len: int | None) -> int:
    """``seq_len``, or dataset ``name``'s default (`DEFAULT_SEQ_LENS`) when None; `ConfigError` when it cannot hold it.

    Example:
        >>> resolve_seq_len("digits_sort", None)
        32
    """
    if name not in TEXT_DATASETS:
        raise ConfigError("dataset", name, f"one of {list(TEXT_DATASETS)}")
    if seq_len is None:
        return DEFAULT_SEQ_LENS[name]
    if not is_int(seq_len) or seq_len < 2:
        raise ConfigError("seq_len", seq_len, "None (the dataset's default) or an integer >= 2 (tokens per row)")
    if name != "pydoc_text" and seq_len < DIGITS_LONGEST:
        raise ConfigError("seq_len", seq_len, f"None or at least {DIGITS_LONGEST} for {name} (its longest example: "
                          f"{DIGITS_LENGTHS[1]} digits, '>', the answer and <bos>/<eos>); it is never truncated")
    return seq_len


def split_sizes(name: str, train_size: int, val_size: int, test_size: int) -> tuple[int, int, int]:
    """A profile's split sizes, made to fit dataset ``name``: ``pydoc_text`` has only 2,608 paragraphs.

    Its validation and test splits shrink to at most 1/8 and 1/4 of them and the training split to what is left
    (`load_text_splits` still refuses sizes asked for explicitly that do not fit). The digit tasks keep every size.

    Example:
        >>> split_sizes("pydoc_text", 4096, 512, 1024)
        (1630, 326, 652)
    """
    if name != "pydoc_text":
        return train_size, val_size, test_size
    paragraphs = len(pydoc_documents())
    val_size, test_size = min(val_size, paragraphs // 8), min(test_size, paragraphs // 4)
    return min(train_size, paragraphs - val_size - test_size), val_size, test_size


@dataclass
class TokenData:
    """One split of a language-model dataset: token ids and labels per example (1-D int64 tensors, read-only).

    Attributes:
        name: the dataset; split: ``train``, ``val`` or ``test``; tokenizer: what made the ids.
        input_ids, labels: one tensor per example; labels are -100 (`IGNORE_INDEX`) where no loss is taken.
        seq_len: no example is longer; num_truncated: examples cut to ``seq_len`` (``pydoc_text``, own data).
        report: what labkit did with a learner's own data (None for labkit's datasets).

    Example:
        >>> splits = labkit.text.load_text_splits("digits_sort", 512, 128, 256, seq_len=32)
        >>> splits["train"][0]["input_ids"].shape
        torch.Size([17])
    """

    name: str
    split: str
    input_ids: list[torch.Tensor] = field(repr=False)
    labels: list[torch.Tensor] = field(repr=False)
    tokenizer: object = field(repr=False)
    seq_len: int
    num_truncated: int = 0
    report: object = field(default=None, repr=False)  # a learner's own data: `labkit.text.own_data.OwnDataReport`

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}

    def lengths(self) -> torch.Tensor:
        """Tokens per example, int64 [N]."""
        return torch.tensor([len(ids) for ids in self.input_ids], dtype=torch.int64)

    def answer_start(self, index: int) -> int:
        """Where example ``index``'s loss starts: its prompt is ``input_ids[:answer_start]``, given to generate."""
        scored = (self.labels[index] != IGNORE_INDEX).nonzero()
        return int(scored[0]) if len(scored) else len(self.labels[index])


def load_text_splits(name: str, train_size: int, val_size: int, test_size: int, seq_len: int,
                     seed: int = 0, tokenizer=None) -> dict[str, TokenData]:
    """Load the ``train``, ``val`` and ``test`` splits of language-model dataset ``name``; they share no example.

    Args:
        name: one of `available()`.
        train_size: examples in the training split (the profile's size, usually).
        val_size: examples in the validation split.
        test_size: examples in the test split.
        seq_len: the most tokens per example: the digit tasks refuse less than their longest, pydoc_text truncates.
        seed: which examples (digit tasks) or which permutation of the paragraphs (pydoc_text).
        tokenizer: what turns the text into ids, e.g. a hub model's own (`HubTokenizer`); None: labkit's own, the
            digit tasks' `CharTokenizer` (one id per character) and pydoc_text's BPE (`pydoc_bpe`).

    Example:
        >>> splits = labkit.text.load_text_splits("pydoc_text", 512, 128, 256, seq_len=256)
        >>> len(splits["val"]), splits["val"].tokenizer.name
        (128, 'pydoc_bpe')
    """
    if name not in TEXT_DATASETS:
        raise ConfigError("dataset", name, f"one of {list(TEXT_DATASETS)}")
    sizes = {"test": test_size, "val": val_size, "train": train_size}  # drawn in this order
    for split, size in sizes.items():
        if not is_int(size) or size < 1:
            raise ConfigError(f"{split}_size", size, "a positive integer (1, 2, 3, ...)")
    if not is_int(seed) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    if not is_int(seq_len) or seq_len < 2:
        raise ConfigError("seq_len", seq_len, "an integer >= 2 (tokens per example, <bos> and <eos> included)")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([zlib.crc32(name.encode()), seed])))
    if name == "pydoc_text":
        return _pydoc_splits(sizes, seq_len, rng, tokenizer or pydoc_bpe())
    return _digit_splits(name, sizes, seq_len, rng, tokenizer or CharTokenizer())


def _digit_splits(name: str, sizes: dict, seq_len: int, rng: np.random.Generator,
                  tok=None) -> dict[str, TokenData]:
    tok = tok or CharTokenizer()
    if isinstance(tok, CharTokenizer) and seq_len < DIGITS_LONGEST:  # known before drawing: one id per character
        raise ConfigError("seq_len", seq_len, f"at least {DIGITS_LONGEST} for {name} (its longest example: "
                          f"{DIGITS_LENGTHS[1]} digits, '>', the answer and <bos>/<eos>); it is never truncated")
    task = _DIGIT_TASKS[name]
    total, seen, prompts = sum(sizes.values()), set(), []
    while len(prompts) < total:  # distinct strings, so that no split holds another's example
        num_digits = int(rng.integers(DIGITS_LENGTHS[0], DIGITS_LENGTHS[1] + 1))
        digits = "".join(map(str, rng.integers(0, 10, size=num_digits)))
        if digits not in seen:
            seen.add(digits)
            prompts.append(digits)
    # The prompts above are drawn before any tokenizing, so every tokenizer's splits hold the same digit strings.
    start_ids = [] if tok.bos_id is None else [tok.bos_id]  # Qwen2.5's tokenizer has no start token
    examples = []
    for digits in prompts:
        prompt, answer = [*start_ids, *tok.encode(digits + ">")], [*tok.encode(task(digits)), tok.eos_id]
        examples.append((prompt + answer, [IGNORE_INDEX] * len(prompt) + answer))
    longest = max(len(ids) for ids, _ in examples)
    if longest > seq_len:  # another tokenizer's count is known only now; cutting an example would cut its answer
        raise ConfigError("seq_len", seq_len, f"at least {longest} for {name} tokenized by {tok.name!r} (its longest "
                          f"example has {longest} tokens); it is never truncated")
    splits, start = {}, 0
    for split, size in sizes.items():
        chosen = examples[start:start + size]
        input_ids = [torch.tensor(ids, dtype=torch.int64) for ids, _ in chosen]
        labels = [torch.tensor(example_labels, dtype=torch.int64) for _, example_labels in chosen]
        splits[split] = TokenData(name, split, input_ids, labels, tok, seq_len)
        start += size
    return {split: splits[split] for split in SPLITS}


def _pydoc_splits(sizes: dict, seq_len: int, rng: np.random.Generator, tok) -> dict[str, TokenData]:
    documents = pydoc_documents()
    if sum(sizes.values()) > len(documents):
        raise ConfigError("train_size", sizes["train"],
                          f"at most {len(documents) - sizes['val'] - sizes['test']} for pydoc_text with "
                          f"val_size={sizes['val']} and test_size={sizes['test']} (it has {len(documents)} paragraphs)")
    order = rng.permutation(len(documents))
    start_ids = [] if tok.bos_id is None else [tok.bos_id]  # Qwen2.5's tokenizer has no start token
    splits, start = {}, 0
    for split, size in sizes.items():
        input_ids, labels, num_truncated = [], [], 0
        for index in order[start:start + size]:
            ids = [*start_ids, *tok.encode(documents[index]), tok.eos_id]
            num_truncated += len(ids) > seq_len
            ids = torch.tensor(ids[:seq_len], dtype=torch.int64)
            input_ids.append(ids)
            labels.append(torch.cat([torch.tensor([IGNORE_INDEX]), ids[1:]]))
        splits[split] = TokenData("pydoc_text", split, input_ids, labels, tok, seq_len, num_truncated)
        start += size
    return {split: splits[split] for split in SPLITS}


def exact_match(predicted_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row, whether every answer token is predicted: bool [B]. Teacher-forced, in one forward pass.

    Args:
        predicted_ids: ``logits.argmax(-1)``, int [B, L]: position t holds the guess for token t + 1.
        labels: the batch's labels, int [B, L] (unshifted; -100 outside the answers). One example per row.

    With greedy decoding this equals generating the answer from the prompt: if every next-token guess along the
    true answer is right, generation writes exactly that answer (and its <eos>); the first wrong guess derails it.

    Example:
        >>> exact_match(model(**batch.model_inputs()).logits.argmax(-1), batch.labels).float().mean()
    """
    if predicted_ids.shape != labels.shape or labels.dim() != 2:
        raise ConfigError("predicted_ids", tuple(predicted_ids.shape),
                          f"the labels' shape {tuple(labels.shape)}, [B, L]")
    targets, guesses = labels[:, 1:], predicted_ids[:, :-1]
    scored = targets != IGNORE_INDEX
    return ((guesses == targets) | ~scored).all(dim=1) & scored.any(dim=1)

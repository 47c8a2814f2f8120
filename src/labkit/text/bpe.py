"""A byte-level BPE tokenizer trained here, offline, on the Python documentation every Python install carries.

The corpus is CPython's ``pydoc_data.topics`` (the text behind ``help("if")``: about 80 topics, 0.46 M
characters). `pydoc_documents` splits it into paragraphs, which gives real text of uneven lengths for the padding
and packing lesson. `pydoc_bpe` trains a byte-level BPE on the whole corpus with the `tokenizers` library (about
0.5 s on one CPU core; the result is the same bytes on every run) and caches it as JSON under
`labkit.downloads.cache_dir()` (``$LABKIT_DATA_DIR``), keyed by the vocabulary size and a hash of the corpus, so a
different Python, whose topics differ, trains its own. Byte-level: every string encodes, nothing is unknown.

`tokenizers` comes with transformers: ``pip install 'labkit-finetune[lm]'``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import re
from pathlib import Path

from ..downloads import cache_dir
from ..errors import ConfigError, UnsupportedError
from ..validate import is_int
from .chars import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS

DEFAULT_VOCAB_SIZE = 2048  # 3.7 characters per token on this corpus (1024: 2.9, 4096: 4.2); a small embedding table
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # the 256 bytes and the special tokens come first
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


@functools.cache
def pydoc_documents() -> tuple[str, ...]:
    """The paragraphs of CPython's ``pydoc_data.topics``, topic by topic in sorted order (about 2,600).

    Example:
        >>> docs = labkit.text.pydoc_documents()
        >>> len(docs), docs[0][:20]  # on Python 3.11
        (2608, 'The "assert" stateme')
    """
    from pydoc_data.topics import topics

    return tuple(p.strip("\n") for name in sorted(topics) for p in _PARAGRAPH_BREAK.split(topics[name]) if p.strip())


def _check_vocab_size(vocab_size) -> None:
    if not is_int(vocab_size) or vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError("vocab_size", vocab_size, f"an integer >= {MIN_VOCAB_SIZE} (256 bytes + special tokens)")


def _tokenizers_library():
    try:
        return importlib.import_module("tokenizers")
    except ImportError as exc:
        raise UnsupportedError("tokenizer", "pydoc_bpe", "the 'tokenizers' library is not installed (it comes with "
                               "transformers: pip install 'labkit-finetune[lm]', then restart the kernel)",
                               "tokenizer='chars', which needs no extra") from exc


class BPETokenizer:
    """A `tokenizers.Tokenizer` with the interface of `CharTokenizer` (``encode``, ``offsets``, ``decode``, ids).

    Args:
        tokenizer: a trained byte-level `tokenizers.Tokenizer` whose ids 0-2 are `SPECIAL_TOKENS`.
        name: how labkit calls it (``pydoc_bpe``).
        path: the JSON file it was loaded from, if any.

    Example:
        >>> tok = labkit.text.pydoc_bpe()
        >>> tok.decode(tok.encode("for x in range(3):")) == "for x in range(3):"
        True
    """

    def __init__(self, tokenizer, name: str = "pydoc_bpe", path: Path | None = None):
        ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
        if ids != [PAD_ID, BOS_ID, EOS_ID]:
            raise ConfigError("tokenizer", name,
                              f"a tokenizer whose {list(SPECIAL_TOKENS)} have ids 0, 1, 2 (got {ids})")
        self.name, self.path, self.backend = name, path, tokenizer
        self.pad_id, self.bos_id, self.eos_id = PAD_ID, BOS_ID, EOS_ID

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (no special tokens added)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) character span of each token; a character of several bytes may span several tokens."""
        return self.backend.encode(text, add_special_tokens=False).offsets

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (a list or a 1-D tensor)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"BPETokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def train_bpe(documents, vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train a byte-level BPE `tokenizers.Tokenizer` on ``documents``, special tokens first (ids 0, 1, 2).

    Args:
        documents: an iterable of strings.
        vocab_size: tokens in the vocabulary, merges included (at least 259: the 256 bytes and 3 special tokens).

    Example:
        >>> backend = train_bpe(["a tiny corpus", "of two documents"], vocab_size=300)
    """
    _check_vocab_size(vocab_size)
    tk = _tokenizers_library()
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    # The full byte alphabet up front: any string encodes, even one with characters the corpus lacks.
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents, trainer)
    return tokenizer


def bpe_path(vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
    """Where `pydoc_bpe` caches its tokenizer: the corpus hash in the name, so another Python trains its own.

    Example:
        >>> labkit.text.bpe_path().name
        'pydoc_bpe-2048-edf9b16fef54.json'  # on Python 3.11.7
    """
    corpus_sha = hashlib.sha256("\n\n".join(pydoc_documents()).encode()).hexdigest()[:12]
    return cache_dir() / "tokenizers" / f"pydoc_bpe-{vocab_size}-{corpus_sha}.json"


@functools.lru_cache(maxsize=4)
def _load_or_train(path: Path, vocab_size: int) -> BPETokenizer:
    tk = _tokenizers_library()
    if path.is_file():
        return BPETokenizer(tk.Tokenizer.from_file(str(path)), path=path)
    backend = train_bpe(pydoc_documents(), vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")  # write then rename: a reader never sees half a file
    backend.save(str(partial))
    os.replace(partial, path)
    return BPETokenizer(backend, path=path)


def pydoc_bpe(vocab_size: int = DEFAULT_VOCAB_SIZE) -> BPETokenizer:
    """The byte-level BPE trained on `pydoc_documents`, from the cache or trained now (about 0.5 s) and cached.

    Args:
        vocab_size: tokens in the vocabulary (at least 259).

    Example:
        >>> tok = labkit.text.pydoc_bpe()
        >>> tok.vocab_size, tok.path.parent.name
        (2048, 'tokenizers')
    """
    _check_vocab_size(vocab_size)
    return _load_or_train(bpe_path(vocab_size), int(vocab_size))

"""Language-model data: tokenizers, datasets by name and batching (padded or packed), offline.

- `chars` (`CharTokenizer`), `hub_tokenizer` (`HubTokenizer`, a hub model's own) and `bpe` (`pydoc_bpe`, a
  byte-level BPE trained here on the Python docs and cached);
  `tokens` (`tokenizer` by name, `tokens_vs_chars`).
- `tasks`: ``digits_source``, ``digits_sort`` and ``pydoc_text`` (`load_text_splits`), `exact_match`.
- `batching`: `collate` and `make_token_loader` with ``packing`` ``pad``, ``pad_max`` or ``pack``; `TokenBatch`,
  `TokenCounts` (tokens, real tokens, label tokens, pad fraction).

A language model is a workload, not a layer: this package sits beside `labkit.data`.
"""

from .batching import PACKINGS, TokenBatch, TokenCounts, collate, make_token_loader, pack_rows
from .bpe import DEFAULT_VOCAB_SIZE, BPETokenizer, bpe_path, pydoc_bpe, pydoc_documents, train_bpe
from .chars import BOS_ID, DIGITS_CHARS, EOS_ID, PAD_ID, SPECIAL_TOKENS, CharTokenizer
from .hub_tokenizer import HubTokenizer
from .tasks import (
    DEFAULT_SEQ_LENS,
    DIGITS_LENGTHS,
    IGNORE_INDEX,
    TEXT_DATASETS,
    TokenData,
    available,
    exact_match,
    load_text_splits,
    resolve_seq_len,
    split_sizes,
)
from .tokens import TOKENIZERS, TokenView, tokenizer, tokens_vs_chars

__all__ = [
    "BOS_ID", "DEFAULT_VOCAB_SIZE", "DIGITS_CHARS", "DIGITS_LENGTHS", "EOS_ID", "IGNORE_INDEX", "PACKINGS", "PAD_ID",
    "SPECIAL_TOKENS", "TEXT_DATASETS", "TOKENIZERS", "BPETokenizer", "CharTokenizer", "HubTokenizer",
    "TokenBatch", "TokenCounts",
    "TokenData", "TokenView", "available", "bpe_path", "collate", "exact_match", "load_text_splits",
    "make_token_loader", "pack_rows", "pydoc_bpe", "pydoc_documents", "tokenizer", "tokens_vs_chars", "train_bpe",
    "DEFAULT_SEQ_LENS", "resolve_seq_len", "split_sizes",
]

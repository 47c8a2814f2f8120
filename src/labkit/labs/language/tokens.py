"""Section 1 of notebook 10, tokens: the Python docs' paragraphs counted in characters (one token each, as a
character-level tokenizer cuts them) and in the pydoc BPE's tokens, and what one batch holds counted in tokens."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ... import text
from ...display import number
from ...env import profile
from ...errors import ConfigError
from ...messages import worded
from ...validate import is_int

TOKENIZATIONS = ("characters", "pydoc_bpe")


def paragraph_lengths(num_paragraphs: int | None = None) -> pd.DataFrame:
    """Each pydoc paragraph's length in characters and in pydoc BPE tokens (no ``<bos>``/``<eos>``).

    Args:
        num_paragraphs: the first this many paragraphs (None: the profile's ``train_size``, at most all of them).

    Example:
        >>> paragraph_lengths(100)[["characters", "pydoc_bpe"]].median()
    """
    documents = text.pydoc_documents()
    count = min(profile().train_size, len(documents)) if num_paragraphs is None else num_paragraphs
    if not is_int(count) or not 1 <= count <= len(documents):
        raise ConfigError("num_paragraphs", num_paragraphs, f"None or 1 to {len(documents)} (the paragraphs there are)")
    bpe = text.pydoc_bpe()
    chosen = documents[:count]
    return pd.DataFrame({"characters": [len(d) for d in chosen], "pydoc_bpe": [len(bpe.encode(d)) for d in chosen]})


def length_summary(lengths: pd.DataFrame) -> pd.DataFrame:
    """Per tokenization: tokens per paragraph (median, 90th percentile, longest), all tokens, characters per token.

    Args:
        lengths: from `paragraph_lengths`.
    """
    chars = lengths["characters"].sum()
    rows = [{"tokenization": name, "median_tokens": float(np.median(lengths[name])),
             "p90_tokens": float(np.percentile(lengths[name], 90)), "max_tokens": int(lengths[name].max()),
             "total_tokens": int(lengths[name].sum()), "chars_per_token": chars / lengths[name].sum()}
            for name in TOKENIZATIONS]
    return pd.DataFrame(rows)


def batch_in_tokens(batch_size: int = 8, seq_len: int = 128, packing: str = "pad_max", seed: int = 0) -> dict:
    """One pydoc_text training batch counted in tokens: rows x width, real tokens, label tokens, padding share.

    Args:
        batch_size: rows. seq_len: tokens per row (paragraphs are cut to it). packing: one of `labkit.text.PACKINGS`.
        seed: the batch's draw.

    Example:
        >>> batch_in_tokens(8, 128)["tokens"]
        1024
    """
    data = text.load_text_splits("pydoc_text", batch_size * 8, 1, 1, seq_len=seq_len, seed=seed)["train"]
    batch = next(iter(text.make_token_loader(data, batch_size, packing=packing, seq_len=seq_len, seed=seed)))
    counts = batch.counts()
    rows, width = batch.input_ids.shape
    documents = int((batch.document_ids.max(dim=1).values + 1).sum())  # document ids count from 0 in each row
    return {"packing": packing, "rows": rows, "width": width, "documents": documents, "tokens": counts.tokens,
            "real_tokens": counts.real_tokens, "label_tokens": counts.label_tokens, "pad_fraction": counts.pad_fraction}


@worded
def tokens_finding(summary: pd.DataFrame) -> str:
    """How many fewer tokens the BPE needs than characters, per median paragraph and per longest one."""
    chars, bpe = (summary.set_index("tokenization").loc[name] for name in TOKENIZATIONS)
    return (f"The pydoc BPE covers {number(bpe['chars_per_token'])} characters per token: a median paragraph is "
            f"{number(bpe['median_tokens'])} tokens against {number(chars['median_tokens'])} characters, the longest "
            f"{number(bpe['max_tokens'])} against {number(chars['max_tokens'])}.")


@worded
def batch_finding(batch: dict) -> str:
    """What one batch of ``rows x width`` tokens holds: real tokens, documents and padding."""
    return (f"A {batch['packing']} batch of {batch['rows']} rows x {batch['width']} = {number(batch['tokens'])} tokens "
            f"holds {number(batch['real_tokens'])} real tokens from {batch['documents']} paragraphs: "
            f"{number(100 * batch['pad_fraction'])} % padding.")

"""Section 1 of notebook 10: pydoc paragraphs in characters and in pydoc BPE tokens, and one batch in tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ... import text
from ...display import number
from ...env import profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...messages import worded
from ...validate import is_int

TOKENIZATIONS = ("characters", "pydoc_bpe")


def paragraph_lengths(num_paragraphs: int | None = None) -> pd.DataFrame:
    """Each pydoc paragraph's length in characters and in BPE tokens (None: the profile's ``train_size`` of them)."""
    documents = text.pydoc_documents()
    count = min(profile().train_size, len(documents)) if num_paragraphs is None else num_paragraphs
    if not is_int(count) or not 1 <= count <= len(documents):
        raise ConfigError("num_paragraphs", num_paragraphs, f"None or 1 to {len(documents)} (the paragraphs there are)")
    bpe = text.pydoc_bpe()
    chosen = documents[:count]
    return pd.DataFrame({"characters": [len(d) for d in chosen], "pydoc_bpe": [len(bpe.encode(d)) for d in chosen]})


def length_summary(lengths: pd.DataFrame) -> pd.DataFrame:
    """Per tokenization: tokens per paragraph (median, p90, longest), all tokens, characters per token."""
    chars = lengths["characters"].sum()
    return pd.DataFrame([{"tokenization": name, "median_tokens": float(np.median(lengths[name])),
                          "p90_tokens": float(np.percentile(lengths[name], 90)), "max_tokens": int(lengths[name].max()),
                          "total_tokens": int(lengths[name].sum()), "chars_per_token": chars / lengths[name].sum()}
                         for name in TOKENIZATIONS])


def batch_in_tokens(batch_size: int = 8, seq_len: int = 128, packing: str = "pad_max", seed: int = 0) -> dict:
    """One pydoc_text training batch counted in tokens: rows x width, real and label tokens, padding share."""
    data = text.load_text_splits("pydoc_text", batch_size * 8, 1, 1, seq_len=seq_len, seed=seed)["train"]
    batch = next(iter(text.make_token_loader(data, batch_size, packing=packing, seq_len=seq_len, seed=seed)))
    counts = batch.counts()
    rows, width = batch.input_ids.shape
    documents = int((batch.document_ids.max(dim=1).values + 1).sum())  # document ids count from 0 in each row
    return {"packing": packing, "rows": rows, "width": width, "documents": documents, "tokens": counts.tokens,
            "real_tokens": counts.real_tokens, "label_tokens": counts.label_tokens, "pad_fraction": counts.pad_fraction}


@dataclass
class TokenCounts(LabResult):
    """Tokens per paragraph for each tokenization (the frame) and one batch counted in tokens (``batch``)."""

    shown = ("tokenization", "median_tokens", "p90_tokens", "max_tokens", "chars_per_token")
    batch: dict = field(default_factory=dict)

    @worded
    def finding(self) -> str:
        chars, bpe = (self.frame.set_index("tokenization").loc[name] for name in TOKENIZATIONS)
        b = self.batch
        return (f"The pydoc BPE covers {number(bpe['chars_per_token'])} characters per token: a median paragraph is "
                f"{number(bpe['median_tokens'])} tokens against {number(chars['median_tokens'])} characters, the "
                f"longest {number(bpe['max_tokens'])} against {number(chars['max_tokens'])}. A {b['packing']} batch "
                f"of {b['rows']} rows x {b['width']} = {number(b['tokens'])} tokens holds "
                f"{number(b['real_tokens'])} real tokens from {b['documents']} paragraphs: "
                f"{number(100 * b['pad_fraction'])} % padding.")


def token_counts(num_paragraphs: int | None = None, batch_size: int = 8, seq_len: int = 128,
                 packing: str = "pad_max") -> TokenCounts:
    """`length_summary` of `paragraph_lengths` and `batch_in_tokens`, as one result."""
    return TokenCounts(length_summary(paragraph_lengths(num_paragraphs)),
                       batch=batch_in_tokens(batch_size, seq_len, packing))

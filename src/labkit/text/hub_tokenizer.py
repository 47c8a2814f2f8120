"""A hub model's own tokenizer (a transformers tokenizer) with the interface of labkit's (`CharTokenizer`,
`BPETokenizer`): ``name``, ``vocab_size``, ``encode``, ``decode``, ``pad_id``, ``bos_id``, ``eos_id``."""

from __future__ import annotations

from .chars import PAD_ID


class HubTokenizer:
    """A transformers tokenizer seen through labkit's tokenizer interface.

    Args:
        backend: what ``AutoTokenizer.from_pretrained(repo)`` returned.
        name: the repo id (a hub model's weights load only on data its own tokenizer made).

    A document is ``[bos_id] + encode(text) + [eos_id]``, the start left out when the tokenizer has no start token
    (Qwen2.5's). Padding keeps labkit's id 0: padded positions are masked and carry no loss, so its meaning is moot.

    Example:
        >>> repo = "HuggingFaceTB/SmolLM2-135M"
        >>> tok = HubTokenizer(AutoTokenizer.from_pretrained(repo), repo)
    """

    def __init__(self, backend, name: str):
        self.backend, self.name, self.path = backend, name, None
        self.pad_id = PAD_ID
        self.bos_id = backend.bos_token_id
        self.eos_id = backend.eos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.backend)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (no special tokens added)."""
        return list(self.backend.encode(text, add_special_tokens=False))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (a list or a 1-D tensor)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"HubTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"

"""A character vocabulary for the synthetic digit tasks: one token per character, three special tokens first.

The special tokens have the same ids in every labkit tokenizer (`PAD_ID`, `BOS_ID`, `EOS_ID`), so a batch, a loss
and a model's embedding rows mean the same thing whichever tokenizer made the ids.
"""

from __future__ import annotations

from ..errors import ConfigError

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
DIGITS_CHARS = "0123456789>, "  # the digits, the prompt/answer separator '>' and two list separators


class CharTokenizer:
    """One token per character of ``chars``; ids 0-2 are `SPECIAL_TOKENS`, then the characters in order.

    Args:
        chars: the characters it knows, each once.
        name: how labkit calls it (``chars``).

    Example:
        >>> tok = CharTokenizer("0123456789>")
        >>> tok.encode("31>13"), tok.decode([1, 6, 4, 13, 4, 6, 2])
        ([6, 4, 13, 4, 6], '31>13')
    """

    def __init__(self, chars: str = DIGITS_CHARS, name: str = "chars"):
        if len(set(chars)) != len(chars) or not chars:
            raise ConfigError("chars", chars, "a non-empty string of distinct characters")
        self.name, self.chars = name, chars
        self.pad_id, self.bos_id, self.eos_id = PAD_ID, BOS_ID, EOS_ID
        self._ids = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(chars)}
        self._tokens = list(SPECIAL_TOKENS) + list(chars)

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s characters (no special tokens added); an unknown character raises `ConfigError`."""
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ConfigError("text", "".join(unknown), f"characters of the '{self.name}' vocabulary {self.chars!r}")
        return [self._ids[c] for c in text]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) character span of each token of ``text``: one character each."""
        return [(i, i + 1) for i in range(len(text))]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (a list or a 1-D tensor), special tokens left out if ``skip_special_tokens``."""
        ids = [int(i) for i in ids]
        return "".join(self._tokens[i] for i in ids if not (skip_special_tokens and i < len(SPECIAL_TOKENS)))

    def __repr__(self) -> str:
        return f"CharTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"

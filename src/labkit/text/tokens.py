"""Tokenizers by name, and tokens shown against characters (notebook 10, lesson 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..choices import check_choice
from .bpe import pydoc_bpe
from .chars import CharTokenizer

TOKENIZERS = ("chars", "pydoc_bpe")  # the digit tasks' characters; the BPE trained on the pydoc topics


def tokenizer(name: str):
    """The tokenizer called ``name``: a `CharTokenizer` (``chars``) or the cached `BPETokenizer` (``pydoc_bpe``).

    Args:
        name: one of `TOKENIZERS`.

    Example:
        >>> labkit.text.tokenizer("chars").vocab_size
        16
    """
    check_choice("tokenizer", name, TOKENIZERS)
    return CharTokenizer() if name == "chars" else pydoc_bpe()


@dataclass(frozen=True)
class TokenView:
    """A text cut into its tokens: how many characters each token covers, on average and one by one.

    Attributes:
        tokenizer: its name; text: the text; token_ids: one id per token.
        pieces: the characters each token covers (a character of several bytes repeats over its byte tokens).
    """

    tokenizer: str
    text: str = field(repr=False)
    token_ids: tuple[int, ...] = field(repr=False)
    pieces: tuple[str, ...] = field(repr=False)

    @property
    def num_chars(self) -> int:
        return len(self.text)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def chars_per_token(self) -> float:
        return self.num_chars / max(self.num_tokens, 1)

    def marked(self, separator: str = "|") -> str:
        """The text with ``separator`` between tokens, e.g. ``'for| x| in| range|(|3|):'``."""
        return separator.join(self.pieces)

    def __repr__(self) -> str:
        return (f"TokenView(tokenizer={self.tokenizer!r}, num_chars={self.num_chars}, num_tokens={self.num_tokens}, "
                f"chars_per_token={self.chars_per_token:.2f})")


def tokens_vs_chars(text: str, tok="pydoc_bpe") -> TokenView:
    """Cut ``text`` into the tokens of ``tok`` and count tokens against characters.

    Args:
        text: any string (the ``chars`` tokenizer knows only digits and separators).
        tok: a tokenizer or its name (one of `TOKENIZERS`).

    Example:
        >>> view = labkit.text.tokens_vs_chars("for x in range(3):")
        >>> view.marked(), view.num_tokens
        ('for| x| in| range|(|3|):', 7)
    """
    tok = tokenizer(tok) if isinstance(tok, str) else tok
    pieces = tuple(text[start:end] for start, end in tok.offsets(text))
    return TokenView(tok.name, text, tuple(tok.encode(text)), pieces)

"""How labkit's text reaches a learner: findings printed wrapped at words, notes printed once.

JupyterLab wraps a long printed line wherever the output area ends, mid-word too ("pro/filing"), so text
meant to be read is wrapped here at word boundaries first (`wrap`, `Text`, `worded`). Things a learner should
know about a run (fp16 emulated on this CPU, weights not pretrained) are printed as a short note, once
per session (`note`), on stdout: a Python warning would show as a pink box carrying a library path
and a code line, once more for every cached run.
"""

from __future__ import annotations

import functools
import re
import textwrap

# Fits JupyterLab's output area at a 1280 px window with the file browser open, and a Colab cell.
WIDTH = 100
_BULLET = re.compile(r"^(\s*(?:[-*•]|\d+[.)])?\s*)")
_shown: set[str] = set()


def wrap(text: str, width: int = WIDTH) -> str:
    """Wrap each line of ``text`` at spaces so that none is longer than ``width``.

    A word longer than that stays whole; existing line breaks stay, and a bullet's continuation lines are
    indented under it.

    Example:
        >>> print(wrap("- one two three", width=9))
        - one two
          three
    """
    lines = []
    for line in str(text).split("\n"):
        if len(line) <= width:
            lines.append(line)
            continue
        indent = " " * len(_BULLET.match(line).group(1))
        lines.append(textwrap.fill(line, width=width, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False))
    return "\n".join(lines)


class Text(str):
    """Text for a learner to read: equal to the words as written, printed `wrap`-ped at words.

    ``print(text)`` and ``str(text)`` give the wrapped lines; comparing, searching or splitting it works
    on the text as written, so a line break the wrapping adds never changes what the text says.
    """

    def __str__(self) -> str:
        return wrap(str.__str__(self))


def worded(func):
    """Decorate a function that returns text for a learner to read: its result comes back as `Text`."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return Text(func(*args, **kwargs))

    return wrapper


def note(message: str) -> bool:
    """Print ``message`` as a short labkit note on stdout, once per session; returns whether it printed.

    A note that changes what the numbers mean says so in its own words (e.g. "NO PRETRAINED WEIGHTS").

    Example:
        >>> note("fp16 on this CPU is emulated")   # prints once; a second call prints nothing
        labkit note: fp16 on this CPU is emulated
        True
    """
    if message in _shown:
        return False
    _shown.add(message)
    print(wrap(f"labkit note: {message}"), flush=True)
    return True


def forget_notes() -> None:
    """Let every note print again (a new session, or a test)."""
    _shown.clear()

"""How labkit writes a measured quantity: bytes in MiB (or GB/TB), and a ratio as "x% less/more"."""

from __future__ import annotations

import math

MIB = 2**20
GB, TB, GIB, TIB = 1e9, 1e12, 2**30, 2**40


def mib(nbytes, spec: str = ".2f") -> str:
    """``nbytes`` in MiB with ``spec`` as its format (``"n/a"`` for None).

    Example:
        >>> mib(3 * 2**20), mib(1536 * 1024, ".3g")
        ('3.00 MiB', '1.5 MiB')
    """
    return "n/a" if nbytes is None else f"{nbytes / MIB:{spec}} MiB"


def is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def ratio(value, reference) -> float:
    """``value / reference``, or NaN when either is missing (None, NaN) or the reference is 0."""
    if value is None or reference is None or not reference or is_nan(value) or is_nan(reference):
        return math.nan
    return value / reference


def change(ratio_to_reference: float) -> str:
    """A ratio (new / reference) in words: ``"40% less"``, ``"12% more"``, ``"no change"`` (within 0.5 %).

    Example:
        >>> change(0.6), change(1.002)
        ('40% less', 'no change')
    """
    return _saved_in_words(1 - ratio_to_reference)


def change_between(value: float, reference: float) -> str:
    """``value`` against ``reference`` in words, as `change` says it.

    It works from the saving ``(reference - value) / reference`` (no ratio rounded first).

    Example:
        >>> change_between(30 * 2**20, 40 * 2**20)
        '25% less'
    """
    return _saved_in_words((reference - value) / reference)


def _saved_in_words(saved_fraction: float) -> str:
    if is_nan(saved_fraction):
        return "not measured"
    if abs(saved_fraction) < 0.005:
        return "no change"
    return f"{saved_fraction:.0%} less" if saved_fraction > 0 else f"{-saved_fraction:.0%} more"

"""Whether two measurements differ beyond their measured noise, decided once for every lab.

`compare(a, b)` takes two measurements, each a value with its spread (a run's median step time and its p10-p90,
a set of repeats, an accuracy with its test-set noise) and returns a `Comparison`: the ratio ``a / b``, the band
of ratios the two spreads allow, whether the difference is real (the spreads lie apart) and its direction. Its
words come from `VERDICTS`, the one table of what each outcome is called.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .counts import accuracy_noise
from .timing import ratio_band, separated, spread

# What a comparison is called: by the direction of a real difference (-1: a lower, 1: a higher), 0 where the
# spreads overlap (or an exact value lies inside the other's spread), None where one has no spread (one timing, or a
# value without repeats) and is not exact.
VERDICTS = {None: "no spread measured", 0: "within the noise", -1: "{lower}", 1: "{higher}"}


def _number(value) -> float:
    return float(value) if isinstance(value, numbers.Real) and value is not None else math.nan


@dataclass(frozen=True)
class Measured:
    """One measurement: its value and the spread it was measured with (``low``, ``high``; NaN where none).
    ``exact``: a value known without noise (a zero, a threshold), compared as a point against the other's spread."""

    value: float
    low: float = math.nan
    high: float = math.nan
    exact: bool = False

    @classmethod
    def exact_value(cls, value: float) -> Measured:
        """A value with no noise of its own (e.g. 0 for "did the change rise above nothing?")."""
        return cls(float(value), float(value), float(value), exact=True)

    @classmethod
    def of(cls, x) -> Measured:
        """``x`` as a measurement: a `Measured`, a ``(value, low, high)`` triple, repeats (a list of 2 or more:
        their median and p10-p90) or a single number (no spread)."""
        if isinstance(x, Measured):
            return x
        if isinstance(x, tuple) and len(x) == 3:
            return cls(*map(_number, x))
        if isinstance(x, numbers.Real):
            return cls(_number(x))
        values = [float(v) for v in x]
        return cls(*spread(values)) if len(values) > 1 else cls(values[0])

    @classmethod
    def row(cls, row, column: str) -> Measured:
        """``row[column]`` with its spread ``<name>_p10_s``/``_p90_s`` (``column`` ends in ``_s``, e.g.
        ``step_time_s``) or ``<column>_p10``/``_p90`` where the row has those."""
        stem = column[:-2] if column.endswith("_s") else column
        suffix = "_s" if column.endswith("_s") else ""
        get = row.get if hasattr(row, "get") else lambda key, default=None: getattr(row, key, default)
        return cls(_number(get(column)), _number(get(f"{stem}_p10{suffix}")), _number(get(f"{stem}_p90{suffix}")))

    @classmethod
    def accuracy(cls, value: float, test_size: int) -> Measured:
        """An accuracy on ``test_size`` examples: two of them differ beyond chance when their bands of half
        `labkit.measure.accuracy_noise` lie apart. A missing accuracy (None, NaN: not evaluated) has no band."""
        value = _number(value)
        if math.isnan(value):
            return cls(value)
        half = accuracy_noise(value, test_size) / 2
        return cls(float(value), float(value) - half, float(value) + half)

    @property
    def has_spread(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high) or self.low == self.high)


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: `ratio` (a / b), `difference` (a - b), `band` (the ratios the spreads allow; None
    without both spreads), `real` (None without a spread) and `direction` (-1 a lower, 1 a higher, 0 not real)."""

    a: Measured
    b: Measured
    words: tuple[str, str] = ("lower", "higher")

    @property
    def ratio(self) -> float:
        return self.a.value / self.b.value if self.b.value else math.nan

    @property
    def difference(self) -> float:
        return self.a.value - self.b.value

    @property
    def band(self) -> tuple[float, float] | None:
        if not (self.a.has_spread and self.b.has_spread) or self.b.low <= 0:
            return None
        return ratio_band((self.a.low, self.a.high), (self.b.low, self.b.high))

    @property
    def order(self) -> int | None:
        a, b = self.a, self.b
        if math.isnan(a.value) or math.isnan(b.value) or not (a.has_spread or a.exact) or not (
                b.has_spread or b.exact) or (a.exact and b.exact):
            return None
        return separated((a.low, a.high), (b.low, b.high)) if a.has_spread and b.has_spread else _point_order(a, b)

    @property
    def real(self) -> bool | None:
        return None if self.order is None else self.order != 0

    @property
    def direction(self) -> int:
        return self.order or 0

    @property
    def verdict(self) -> str:
        """The outcome in words from `VERDICTS`: e.g. ``faster``, ``within the noise``, ``no spread measured``."""
        lower, higher = self.words
        return VERDICTS[self.order].format(lower=lower, higher=higher)

    def __str__(self) -> str:
        """``1.32x (faster)``: the ratio and the verdict."""
        return f"{_ratio(self.ratio)}x ({self.verdict})"

    def __bool__(self) -> bool:
        """True only for a real difference."""
        return bool(self.real)


def compare(a, b, words: tuple[str, str] = ("lower", "higher")) -> Comparison:
    """``a`` against ``b``, each a measurement `Measured.of` reads; ``words`` name a real difference where ``a`` is
    lower and where it is higher (for step times: ``("faster", "slower")``).

    Example:
        >>> c = compare((0.9, 0.85, 0.95), (1.2, 1.1, 1.3), words=("faster", "slower"))
        >>> c.ratio, c.real, str(c)
        (0.75, True, '0.75x (faster)')
    """
    return Comparison(Measured.of(a), Measured.of(b), tuple(words))


def _point_order(a: Measured, b: Measured) -> int:
    """An exact value against a spread: apart only where the value lies outside the whole spread."""
    if a.exact:
        return -_point_order(b, a)
    return -1 if a.high < b.value else (1 if a.low > b.value else 0)


def _ratio(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"

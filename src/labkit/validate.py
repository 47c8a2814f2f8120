"""Type checks behind labkit's input validation: what counts as an integer and a number here."""

from __future__ import annotations

import math
import numbers

from .errors import ConfigError


def is_int(value) -> bool:
    """An integer (numpy integers too), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite real number, but not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_positive_int(name: str, value, minimum: int = 1) -> None:
    """Raise `ConfigError` naming ``name`` unless ``value`` is an integer >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ConfigError(name, value, f"an integer >= {minimum}")

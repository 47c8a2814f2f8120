"""Predict first: a learner's guess printed beside what the live run measured.

Before a notebook's main experiment the learner writes a guess (``guess = None  # YOUR GUESS``); after it,
`versus` prints the guess next to the measured value. An untouched guess prints one short line, so the
notebook runs clean in CI.
"""

from __future__ import annotations

import math
import numbers

from .errors import ConfigError
from .messages import Text


def _number(value, field: str) -> float:
    item = getattr(value, "item", None)
    if callable(item):
        value = item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(field, value, "a finite number (or None before you have guessed)")
    return float(value)


def versus(guess, measured, what: str, unit: str = "", band=None) -> Text:
    """One line: the learner's ``guess`` of ``what`` beside the ``measured`` value, and how far off it was.

    Args:
        guess: the learner's number, or None (not guessed yet: the line says so).
        measured: the live run's value, or a `labkit.measure.Comparison`: its ratio, with the band its two spreads
            allow (no spread: the line says so).
        what: what was guessed, e.g. ``"bf16 peak memory / fp32 peak memory"``.
        unit: appended to both numbers, e.g. ``"x"`` or ``" MiB"``.
        band: the ``(low, high)`` the run's own noise allows for the value (e.g. `labkit.measure.ratio_band` of
            two runs' step-time spreads): a guess inside it is as right as the measurement can tell.

    Raises:
        ConfigError: ``guess`` or ``measured`` is not a finite number (a band with a missing bound says so).

    Example:
        >>> print(versus(0.5, 0.62, "bf16 peak / fp32 peak"))
        bf16 peak / fp32 peak: you guessed 0.5, measured 0.62 (your guess was 0.81x the measured value).
    """
    if hasattr(measured, "ratio") and hasattr(measured, "band"):  # a measure.Comparison
        measured, band = measured.ratio, measured.band or (math.nan, math.nan)
    value = _number(measured, "measured")
    if band is not None and any(b is None or b != b for b in band):  # one timed step: no spread was measured
        band, noise = None, " (The run measured no spread to judge a guess by.)"
    else:
        noise = ""
    low, high = (None, None) if band is None else sorted(_number(b, "band") for b in band)
    if band is not None:
        noise = f" The run's noise allows {low:.3g}-{high:.3g}{unit}"
    if guess is None:
        return Text(f"{what}: measured {value:.3g}{unit}. (No guess recorded: write one above before the "
                    f"next run.){noise + '.' if band is not None else noise}")
    mine = _number(guess, "guess")
    if band is not None:
        noise += ": your guess is " + ("inside it, as right as this run can tell." if low <= mine <= high
                                       else "outside it.")
    if value == 0:
        off = "exactly" if mine == 0 else f"{mine - value:+.3g}{unit} off"
        return Text(f"{what}: you guessed {mine:.3g}{unit}, measured 0{unit} ({off}).{noise}")
    return Text(f"{what}: you guessed {mine:.3g}{unit}, measured {value:.3g}{unit} (your guess was "
                f"{mine / value:.2f}x the measured value).{noise}")

"""guesses.versus: a learner's guess beside the measured value."""

import numpy as np
import pytest

from labkit.errors import ConfigError
from labkit.guesses import versus


def test_a_guess_is_shown_beside_the_measurement():
    assert versus(0.5, 0.625, "bf16 peak / fp32 peak") == (
        "bf16 peak / fp32 peak: you guessed 0.5, measured 0.625 (your guess was 0.80x the measured value).")
    assert versus(3, np.float64(1.5), "first call / warm", "x").endswith(
        "measured 1.5x (your guess was 2.00x the measured value).")


def test_no_guess_is_one_quiet_line():
    text = versus(None, 0.62, "bf16 peak / fp32 peak")
    assert text == "bf16 peak / fp32 peak: measured 0.62. (No guess recorded: write one above before the next run.)"


def test_a_measured_zero():
    assert versus(0, 0, "skipped steps").endswith("(exactly).")
    assert versus(2, 0, "skipped steps").endswith("(+2 off).")


def test_bad_guesses_are_named():
    with pytest.raises(ConfigError,
                       match=r"guess='half' is not allowed: a finite number \(or None before you have guessed\)"):
        versus("half", 0.5, "x")
    with pytest.raises(ConfigError, match="measured=nan is not allowed"):
        versus(0.5, float("nan"), "x")
    with pytest.raises(ConfigError, match="guess=True is not allowed"):
        versus(True, 0.5, "x")

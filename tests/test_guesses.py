"""guesses.versus: a learner's guess beside the measured value."""

import numpy as np
import pytest

from labkit.errors import ConfigError
from labkit.guesses import versus
from labkit.measure import compare


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


def test_a_guess_inside_the_runs_noise_is_as_right_as_the_run_can_tell():
    from labkit.measure import ratio_band

    band = ratio_band((0.09, 0.11), (0.18, 0.22))  # two runs' step-time spreads: their ratio lies in 0.41-0.61
    assert band == pytest.approx((0.09 / 0.22, 0.11 / 0.18))
    inside = str(versus(0.6, 0.5, "step time, with / without", "x", band=band))
    assert " ".join(inside.split()).endswith("The run's noise allows 0.409-0.611x: your guess is inside it, as "
                                             "right as this run can tell.")
    assert " ".join(str(versus(0.3, 0.5, "t", band=band)).split()).endswith("0.409-0.611: your guess is outside it.")
    assert "noise allows 0.409-0.611" in " ".join(str(versus(None, 0.5, "t", band=band)).split())
    assert versus(0.5, 0.5, "t", band=(float("nan"), 1.0)).endswith("(The run measured no spread to judge a guess by.)")


def test_a_comparison_brings_its_ratio_and_band():
    measured = compare((0.1, 0.09, 0.11), (0.2, 0.18, 0.22))
    line = " ".join(str(versus(0.6, measured, "step time, with / without", "x")).split())
    assert "measured 0.5x" in line and line.endswith("allows 0.409-0.611x: your guess is inside it, as right as this "
                                                     "run can tell.")
    assert versus(0.5, compare(0.1, 0.2), "t").endswith("(The run measured no spread to judge a guess by.)")

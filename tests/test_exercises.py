"""Every exercise against its solution and a wrong answer. The solutions live here, not in labkit."""

import numpy as np
import pytest

from labkit import exercises
from labkit.errors import ConfigError
from labkit.exercises import WrongAnswer, check

SOLUTIONS = {
    "00.throughput": 256 / 0.080,          # batch size / step time in seconds = 3200 samples/s
    "00.mfu": 3.0e12 / 0.25 / 65e12,       # achieved FLOP/s / peak FLOP/s ~ 0.185
    # fixed 25e6 x 16 B = 0.373 GiB; fp32 peak 6.373 GiB; bf16 saves 3 GiB -> 0.471
    "01.amp_saving": 3.0 / (25e6 * 16 / 2**30 + 6.0),
    "01.loss_scale": 6,                    # 1e-9 x 2**6 = 6.4e-8 >= 2**-24 = 5.96e-8; 2**5 gives 3.2e-8
    "02.slope": (59.5 - 17.5) * 1024 / (128 - 32),  # 448 KiB per sample
    "02.accum": 8,                         # 256 / 8 = 32 <= 48; 256 / 4 = 64 does not fit; 6 does not divide 256
    "03.adam_state": 56.0,                 # 7e9 x 8 B = 56e9 B
    "03.eight_bit_bytes": 2.03125,         # 2 x (1 + 4 / 256)
}
WRONG = {
    "00.throughput": (3.2, "1000x too small, check the units"),    # forgot ms -> s
    "00.mfu": (0.5, "achieved FLOP/s = FLOPs per step / step time"),
    "01.amp_saving": (0.5, "bf16 saves half the activations and nothing of the fixed part"),  # forgot the fixed part
    "01.loss_scale": (5, "round up"),
    "02.slope": (59.5 * 1024 / 128, "difference in batch size"),  # peak / batch: forgot the fixed part
    "02.accum": (6, "grad_accum must divide"),
    "03.adam_state": (28.0, "two moments x 4 bytes"),  # one moment only
    "03.eight_bit_bytes": (2.0, "add the fp32 scale stored for every block"),
}


def test_every_exercise_has_a_solution_and_a_wrong_answer():
    assert sorted(exercises.names()) == sorted(SOLUTIONS) == sorted(WRONG)


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_solution_passes(name, capsys):
    message = check(name, SOLUTIONS[name])
    assert message.startswith(f"{name}: correct")
    assert message in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_raises_with_hint(name):
    answer, hint = WRONG[name]
    with pytest.raises(WrongAnswer, match=f"{name}: .* is not right.*{hint}"):
        check(name, answer)


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_none_is_not_attempted(name, capsys):
    message = check(name, None)
    assert message.startswith(f"{name}: not attempted yet")
    assert "not attempted yet" in capsys.readouterr().out


def test_wrong_answer_is_an_assertion_error():
    with pytest.raises(AssertionError):
        check("00.throughput", 1.0)


def test_rounded_and_numpy_answers_pass():
    check("00.throughput", 3200)
    check("00.throughput", np.float32(3200.0))
    check("00.mfu", 0.18)  # two significant digits
    check("00.mfu", np.array([0.1846]))


def test_percent_instead_of_fraction():
    with pytest.raises(WrongAnswer, match="give a fraction, not a percent"):
        check("00.mfu", 100 * SOLUTIONS["00.mfu"])


def test_scale_instead_of_exponent():
    with pytest.raises(WrongAnswer, match="give the exponent k of the scale 2\\*\\*k, not the scale itself"):
        check("01.loss_scale", 64)  # 2**6


def test_micro_batch_instead_of_accumulation_steps():
    with pytest.raises(WrongAnswer, match="give the number of accumulation steps, not the micro-batch size"):
        check("02.accum", 32)


def test_non_number_answer():
    with pytest.raises(WrongAnswer, match="expected a number, got str"):
        check("00.throughput", "3200")


def test_unknown_name_lists_exercises():
    with pytest.raises(ConfigError, match=r"exercise='00.speed' is not allowed: one of \['00.throughput', '00.mfu', '01.amp_saving', '01.loss_scale', '02.slope', '02.accum', '03.adam_state', '03.eight_bit_bytes'\]"):
        check("00.speed", 1)
    with pytest.raises(ConfigError, match="one of"):
        exercises.question("nope")


def test_question_text():
    assert exercises.question("00.throughput") == (
        "A training step on a batch of 256 images takes a median of 80 ms. What is the throughput in samples/s?")
    assert "3e12 FLOPs" in exercises.question("00.mfu")
    assert "65e12 FLOP/s" in exercises.question("00.mfu")


def test_feedback_is_not_echoed_twice_by_jupyter():
    message = check("00.throughput", None)
    assert isinstance(message, str)
    assert message._ipython_display_() is None

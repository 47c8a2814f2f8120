"""Every number exercise against a solution computed here by hand and a wrong answer; `solution` against
the same numbers. The code exercises are tested in tests/labs/test_code_exercises.py."""

import numpy as np
import pytest

from labkit.errors import ConfigError
from labkit.exercises import CodeExercise, WrongAnswer
from labkit.labs.catalog import all_exercises

exercises = all_exercises()  # every notebook's, by name
check = exercises.check

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
    # the own-numbers exercises, with their example numbers (a notebook passes the learner's own)
    "00.warmup_error": 1.9,                # (0.5 + 9 x 0.05) / 10 = 0.095 s, / 0.05 s
    "01.own_saving": 0.35,                 # (30 - 16) / 40
    "02.max_batch": 236,                   # (40 - 3) MiB = 37,888 KiB / 160 KiB = 236.8 -> 236
    "03.own_8bit": 2_071_250,              # 1e6 x 2.03125 + 5,000 x 8
    "04.coo_break_even": 8 / 9,            # dense 4 B vs (1 - s) x (4 + 4 x 8) B: s = 1 - 4/36
    "04.own_flops": 0.25,                  # (16 x 16) / (32 x 32)
    # head 2048 x 10 + 10 = 20,490; full: 25,557,032 - 2,049,000 (ImageNet head) + 20,490 = 23,528,522
    "05.head_state": 20_490 / 23_528_522,
    "05.cache_speedup": 20.0,              # 10 x 40 s / (15 s + 10 x 0.5 s)
    "05.own_backward": 0.7552,             # 2 x 0.4531 - 0.151
    "06.own_size": 1 - 0.75 * 0.973,       # the Linear share shrinks to a quarter: 0.27025
    "06.nf4_bytes": 7 * (0.5 + 4 / 64),    # 3.9375 GB
    "07.own_efficiency": 176 / (2 * 134),  # 0.657
    "07.ring_bytes": 2 * 7 / 8 * 0.496,    # 124e6 x 4 B = 0.496 GB; x 2 x 7/8 = 0.868 GB
    "08.own_count": 4_096 + (16_384 - 4_096) / 6 * 14,  # 2,048 per rank: 32,768
    "08.adam_state": 32 * 2 * 8 * 8192 * 2 * 4 / 1e6,   # 4,194,304 parameters x 8 B = 33.55 MB
    "09.own_stack": 3.67 * 1.0 * 0.95 * 0.51,    # 1.7781
    "10.logits_gib": 8 * 2048 * 128256 * 4 / 2**30,  # 7.83
    "10.own_pad_share": 4390.0 * (1 - 0.578),  # 1852.6
    "11.own_padding": 1 - 9660.0 / 13800.0,  # 0.3
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
    "00.warmup_error": (1.0, "the mean of the steps"),
    "01.own_saving": (35, "give a fraction, not a percent"),
    "02.max_batch": (237, "round down"),
    "03.own_8bit": (2_031_250, "small ones: 8 bytes per value"),  # forgot the small tensors
    "04.coo_break_even": (0.5, "set them equal and solve for the sparsity"),
    "04.own_flops": (0.5, "divide in x out after by in x out before"),  # the channel fraction, not its square
    "05.head_state": (20_490 / 25_557_032, "the total minus the old head plus the new one"),  # kept the old head
    "05.cache_speedup": (80.0, "the one-off extraction plus every epoch on the cache"),  # forgot the extraction
    "05.own_backward": (0.9062, "subtract their forward FLOPs once"),  # 2 x trainable: input gradients everywhere
    "06.own_size": (0.25, "the Linear share shrinks to a quarter, the rest stays"),  # as if everything were Linear
    "06.nf4_bytes": (3.5, "every block of 64 also stores a 4-byte float32 scale"),  # the 4-bit weights alone
    "07.own_efficiency": (176 / 134, "that is the speed-up T1 / TN"),  # forgot to divide by N
    "07.ring_bytes": (0.434, "that is one phase"),  # (N-1)/N only
    "08.own_count": (16_384 * 4, "grow faster than the rank"),  # grown with the rank's square
    "08.adam_state": (16.78, "half the answer"),  # one AdamW state only
    "09.own_stack": (3.67 - 0.05 - 0.49, "ratios multiply"),  # the savings added up
    "10.logits_gib": (8 * 2048 * 128256 * 2 / 2**30, "upcasts the logits to float32"),  # bf16's 2 bytes
    "10.own_pad_share": (4390.0 * 0.578, "real tokens/s = tokens/s x \\(1 - padding share\\)"),  # the padding's
    "11.own_padding": (9660.0 / 13800.0, "padding share = 1 - real tokens/s / tokens/s"),  # the real share
}
CODE = ["00.timer", "01.amp_step", "02.accumulate", "03.checkpoint", "04.global", "05.param_groups", "06.per_channel",
        "07.shard", "08.lora_forward", "09.measured_order", "10.accumulate", "11.pad_share"]


def own(name):
    """The numbers a notebook would pass: the example ones, for an exercise on the learner's own numbers."""
    exercise = exercises.get(name)
    return dict(exercise.numbers) if exercise.from_run else None


def test_every_exercise_has_a_solution_and_a_wrong_answer():
    numbers = [n for n in exercises.names() if not isinstance(exercises.get(n), CodeExercise)]
    assert sorted(numbers) == sorted(SOLUTIONS) == sorted(WRONG)
    assert sorted(set(exercises.names()) - set(numbers)) == CODE


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_solution_shows_the_formula_and_the_value(name):
    text = exercises.solution(name)
    assert exercises.get(name).solution in text
    assert float(text.rsplit("= ", 1)[1]) == pytest.approx(SOLUTIONS[name], rel=1e-5)


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_solution_passes(name, capsys):
    message = check(name, SOLUTIONS[name], own(name))
    assert message.startswith(f"{name}: correct")
    assert message in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_raises_with_hint(name):
    answer, hint = WRONG[name]
    with pytest.raises(WrongAnswer, match=f"{name}: .* is not right.*{hint}"):
        check(name, answer, own(name))


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_none_is_not_attempted(name, capsys):
    message = check(name, None, own(name))
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
    with pytest.raises(ConfigError, match=r"exercise='00.speed' is not allowed: one of "
                                          r"\['00.throughput', '00.mfu', '00.warmup_error', '00.timer', "
                                          r"'01.amp_saving'"):
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


def test_own_numbers_decide_the_answer_and_the_question():
    mine = {"fixed_mib": 10.0, "kib_per_sample": 256.0, "budget_mib": 74.0}
    assert "10 MiB + 256 KiB x batch" in exercises.question("02.max_batch", mine)
    check("02.max_batch", 256, mine)  # (74 - 10) x 1024 / 256
    with pytest.raises(WrongAnswer):
        check("02.max_batch", 236, mine)  # right for the example numbers, not for these
    assert "= 256" in exercises.solution("02.max_batch", mine)
    assert "= 236" in exercises.solution("02.max_batch")  # without numbers: the example ones


def test_own_numbers_are_checked():
    with pytest.raises(ConfigError, match=r"numbers=None is not allowed: a dict with fixed_mib, kib_per_sample, "
                                          r"budget_mib from your run"):
        check("02.max_batch", 1)
    with pytest.raises(ConfigError, match=r"exactly the keys \['fixed_mib', 'kib_per_sample', 'budget_mib'\]"):
        check("02.max_batch", 1, {"fixed_mib": 1.0, "kib_per_sample": 2.0})
    with pytest.raises(ConfigError, match=r"exactly the keys"):
        check("02.max_batch", 1, {"fixed_mib": 1.0, "kib_per_sample": 2.0, "budget_mib": 3.0, "extra": 1})
    with pytest.raises(ConfigError, match=r"numbers\['budget_mib'\]=nan is not allowed: a finite number"):
        check("02.max_batch", 1, {"fixed_mib": 1.0, "kib_per_sample": 2.0, "budget_mib": float("nan")})
    with pytest.raises(ConfigError, match="numbers=.* is not allowed: None: exercise 00.throughput has fixed numbers"):
        check("00.throughput", 3200, {"batch_size": 1})


def test_code_exercise_answers_are_functions():
    with pytest.raises(WrongAnswer, match="01.amp_step: expected your function, got int 3"):
        check("01.amp_step", 3)
    assert check("01.amp_step", None).startswith("01.amp_step: not attempted yet")
    with pytest.raises(ConfigError, match="is a code exercise"):
        check("01.amp_step", None, {"a": 1})


def test_code_solution_is_the_reference_source():
    text = exercises.solution("01.amp_step")
    assert text.startswith("def amp_step_solution(") and "scaler.unscale_(optimizer)" in text

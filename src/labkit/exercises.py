"""The notebooks' exercise checkers: `check(name, answer)` and `question(name)`.

A learner's cell starts as ``answer = None  # YOUR CODE``. `check` reports "not attempted yet" for
None (so an untouched notebook runs clean in CI), raises `WrongAnswer` with a hint on a wrong
answer and confirms a right one. Each exercise computes its expected value from the numbers in
its question, so the answers are not spelled out here; the solutions live in tests/test_exercises.py.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import ConfigError
from .messages import Text, worded


class WrongAnswer(AssertionError):
    """The answer to an exercise is not right; the message carries a hint."""


@dataclass(frozen=True)
class Exercise:
    """One exercise: a question built from ``numbers`` and the function computing its expected value.

    Attributes:
        name: ``"<notebook>.<topic>"``, e.g. ``"00.throughput"``.
        template: the question, with ``{placeholders}`` filled from ``numbers``.
        numbers: the values the question gives.
        expected: ``expected(numbers) -> float``, the right answer.
        hint: shown with a wrong answer.
        rel_tol: accepted relative error (answers may be rounded).
        diagnose: ``diagnose(answer, expected) -> str | None``, a hint for a recognisable mistake.
    """

    name: str
    template: str
    numbers: dict
    expected: Callable[[dict], float]
    hint: str
    rel_tol: float = 0.01
    diagnose: Callable[[float, float], str | None] | None = field(default=None, compare=False)

    @property
    def question(self) -> str:
        return self.template.format(**{k: _show(v) for k, v in self.numbers.items()})


_REGISTRY: dict[str, Exercise] = {}


class Feedback(Text):
    """The message `check` returns. It is printed already, so Jupyter does not echo it a second time."""

    def _ipython_display_(self, **kwargs):
        pass


def register(exercise: Exercise) -> Exercise:
    """Add ``exercise`` to the registry (a name may be registered once)."""
    if exercise.name in _REGISTRY:
        raise ConfigError("exercise", exercise.name, "a name not registered yet")
    _REGISTRY[exercise.name] = exercise
    return exercise


def names() -> list[str]:
    """The registered exercise names, e.g. ``["00.throughput", "00.mfu"]``."""
    return list(_REGISTRY)


def get(name: str) -> Exercise:
    """The `Exercise` called ``name``; an unknown name raises `ConfigError` listing the known ones."""
    if name not in _REGISTRY:
        raise ConfigError("exercise", name, f"one of {names()}")
    return _REGISTRY[name]


@worded
def question(name: str) -> str:
    """The question text of exercise ``name``, for a notebook to print.

    Example:
        >>> print(labkit.exercises.question("00.throughput"))
    """
    return get(name).question


def check(name: str, answer) -> str:
    """Check ``answer`` to exercise ``name``: None -> "not attempted yet"; wrong -> `WrongAnswer`; right -> confirmed.

    Numbers are compared with the exercise's relative tolerance (1% unless it says otherwise).

    Args:
        name: the exercise, e.g. ``"00.throughput"`` (see `names`).
        answer: the learner's number, or None when not attempted.

    Returns:
        The message, also printed.

    Raises:
        WrongAnswer: the answer is wrong (the message has a hint). ConfigError: no exercise is called ``name``.

    Example:
        >>> answer = None  # YOUR CODE
        >>> labkit.exercises.check("00.throughput", answer)
        '00.throughput: not attempted yet ...'
    """
    exercise = get(name)
    if answer is None:
        return _say(f"{name}: not attempted yet. Replace `answer = None` with your answer and run the cell again.")
    value = _as_number(answer)
    if value is None:
        raise WrongAnswer(f"{name}: expected a number, got {type(answer).__name__} {answer!r}. "
                          f"Hint: {exercise.hint}")
    expected = float(exercise.expected(exercise.numbers))
    if math.isclose(value, expected, rel_tol=exercise.rel_tol):
        return _say(f"{name}: correct! ({value:.4g})")
    specific = exercise.diagnose(value, expected) if exercise.diagnose else None
    specific = specific or _unit_slip(value, expected)
    message = f"{name}: {value:.4g} is not right" + (f": {specific}" if specific else "")
    raise WrongAnswer(f"{message}. Hint: {exercise.hint}")


def _say(message: str) -> Feedback:
    feedback = Feedback(message)
    print(feedback)
    return feedback


def _as_number(answer) -> float | None:
    """A float for numbers, numpy scalars and one-element tensors/arrays; None for anything else."""
    item = getattr(answer, "item", None)
    if callable(item):  # numpy scalars and arrays, torch tensors: item() works for one element only
        try:
            answer = item()
        except (TypeError, ValueError, RuntimeError):
            return None
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        return None
    return float(answer)


def _show(value) -> str:
    """Numbers as a question shows them: 256, 0.25, 3e12, 65e12 (exponents in steps of 3)."""
    if isinstance(value, float) and value != 0 and abs(value) >= 1e6:
        exponent = int(math.floor(math.log10(abs(value)) / 3) * 3)
        return f"{value / 10**exponent:g}e{exponent}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _unit_slip(value: float, expected: float) -> str | None:
    """Recognise an answer off by a power of 1000 (ms vs s, bytes vs KB): the usual unit slip."""
    if value == 0 or expected == 0 or (value < 0) != (expected < 0):
        return None
    for exponent in (3, 6, 9, 12):
        for factor, direction in ((10.0**exponent, "large"), (10.0**-exponent, "small")):
            if math.isclose(value, expected * factor, rel_tol=0.02):
                return f"it is {10**exponent:g}x too {direction}, check the units"
    return None


def _percent_not_fraction(value: float, expected: float) -> str | None:
    if 1 < value <= 100:
        return "give a fraction, not a percent (e.g. 0.5 for 50%)"
    return None


# --- Notebook 00: start here ------------------------------------------------------------------------------

register(Exercise(
    name="00.throughput",
    template=("A training step on a batch of {batch_size} images takes a median of {step_time_ms} ms. "
              "What is the throughput in samples/s?"),
    numbers={"batch_size": 256, "step_time_ms": 80},
    expected=lambda n: n["batch_size"] / (n["step_time_ms"] / 1e3),
    hint="throughput = batch size / step time in seconds (convert the milliseconds first)",
))

register(Exercise(
    name="00.mfu",
    template=("A step performs {flops_per_step} FLOPs and takes {step_time_s} s on a GPU whose datasheet "
              "peak for that precision is {peak_flops} FLOP/s. What fraction of the peak (0..1) is "
              "achieved? (Two significant digits are enough.)"),
    numbers={"flops_per_step": 3.0e12, "step_time_s": 0.25, "peak_flops": 65e12},
    expected=lambda n: n["flops_per_step"] / n["step_time_s"] / n["peak_flops"],
    hint=("achieved FLOP/s = FLOPs per step / step time; the fraction of the peak is achieved FLOP/s / "
          "peak FLOP/s"),
    rel_tol=0.03,
    diagnose=_percent_not_fraction,
))


# --- Notebook 01: mixed precision -------------------------------------------------------------------------

register(Exercise(
    name="01.amp_saving",
    template=("A model of {num_params} parameters is fine-tuned with AdamW. In mixed precision its parameters, "
              "gradients and AdamW's two moments stay float32 (4 bytes each). Its activations take {act_gib} GiB "
              "in fp32 and half that in bf16. Counting only those parts, what fraction (0..1) of the fp32 "
              "peak memory does bf16 save? (Use 1 GiB = 2**30 bytes.)"),
    numbers={"num_params": 25e6, "act_gib": 6.0},
    expected=lambda n: (n["act_gib"] / 2) / (n["num_params"] * 16 / 2**30 + n["act_gib"]),
    hint=("fixed = parameters x (4 + 4 + 8) bytes (weights, gradients, two AdamW moments); fp32 peak = fixed + "
          "activations; bf16 saves half the activations and nothing of the fixed part"),
    rel_tol=0.02,
    diagnose=_percent_not_fraction,
))


def _power_of_two_hint(value: float, expected: float) -> str | None:
    if value > 0 and math.isclose(math.log2(value), expected):
        return "give the exponent k of the scale 2**k, not the scale itself"
    return None


register(Exercise(
    name="01.loss_scale",
    template=("fp16's smallest positive number is 2**-24 (about 5.96e-8); a value below it is rounded to 0 or to "
              "2**-24 and loses all its digits. A gradient element is {grad} in float32. What is the smallest "
              "exponent k such that the scaled gradient, gradient x 2**k, is at least 2**-24?"),
    numbers={"grad": 1e-9},
    expected=lambda n: math.ceil(math.log2(2.0**-24 / n["grad"])),
    hint="scaled gradient = gradient x 2**k must be at least 2**-24, so k >= log2(2**-24 / gradient); round up",
    rel_tol=0.0,
    diagnose=_power_of_two_hint,
))


# --- Notebook 02: batch size -------------------------------------------------------------------------------

register(Exercise(
    name="02.slope",
    template=("A batch-size sweep measured a peak of {peak_small_mib} MiB at batch {small} and {peak_large_mib} MiB "
              "at batch {large}. How many KiB of memory does each extra sample cost (the slope)?"),
    numbers={"small": 32, "peak_small_mib": 17.5, "large": 128, "peak_large_mib": 59.5},
    expected=lambda n: (n["peak_large_mib"] - n["peak_small_mib"]) * 1024 / (n["large"] - n["small"]),
    hint="slope = (peak at the large batch - peak at the small one) / (difference in batch size); 1 MiB = 1024 KiB",
))


_ACCUM_NUMBERS = {"batch": 256, "max_fit": 48}


def _accumulation_hint(value: float, expected: float) -> str | None:
    if value > 0 and math.isclose(_ACCUM_NUMBERS["batch"] / value, expected):
        return "give the number of accumulation steps, not the micro-batch size"
    return None


register(Exercise(
    name="02.accum",
    template=("You want the gradient of a batch of {batch} samples, but at most {max_fit} samples fit in memory at "
              "once. grad_accum must divide the batch. What is the smallest grad_accum that works?"),
    numbers=_ACCUM_NUMBERS,
    expected=lambda n: next(k for k in range(1, n["batch"] + 1) if n["batch"] % k == 0 and n["batch"] // k <= n["max_fit"]),
    hint="the micro-batch is batch / grad_accum: it must be at most the largest that fits, and grad_accum must divide "
         "the batch (try 2, 4, 8, ...)",
    rel_tol=0.0,
    diagnose=_accumulation_hint,
))


# --- Notebook 03: memory savers ---------------------------------------------------------------------------

register(Exercise(
    name="03.adam_state",
    template=("A model of {num_params} parameters is fine-tuned with AdamW, which keeps two float32 moments per "
              "parameter. How many GB (1 GB = 1e9 bytes) of optimizer state is that?"),
    numbers={"num_params": 7e9},
    expected=lambda n: n["num_params"] * 2 * 4 / 1e9,
    hint="two moments x 4 bytes = 8 bytes per parameter; divide the bytes by 1e9",
))


def _forgot_block_scales(value: float, expected: float) -> str | None:
    if math.isclose(value, 2.0):
        return "the two 1-byte moments are right; add the fp32 scale stored for every block of values"
    return None


register(Exercise(
    name="03.eight_bit_bytes",
    template=("bitsandbytes' 8-bit AdamW stores each of its two moments as 1 byte per value, plus one float32 "
              "scale (4 bytes) per block of {block} values of each moment. How many bytes per parameter does its "
              "state take for a large tensor? (Give at least three decimals.)"),
    numbers={"block": 256},
    expected=lambda n: 2 * (1 + 4 / n["block"]),
    hint="per moment: 1 byte + 4 bytes / block size; there are two moments",
    rel_tol=0.001,
    diagnose=_forgot_block_scales,
))

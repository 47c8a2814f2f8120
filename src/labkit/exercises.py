"""How the notebooks' exercises are asked and checked: `Exercises` (one notebook's, by name) with `question`,
`check` and `solution`. Each notebook's exercises sit with its lab (``labkit.labs.<lab>.exercises``);
`labkit.labs.catalog` lists them all.

Three kinds of exercise:

- a **number** worked out from numbers the question gives (`Exercise`);
- a number worked out from the learner's **own measured numbers** (`Exercise` with ``from_run``): the
  notebook passes them, ``question(name, numbers)`` and ``check(name, answer, numbers)``;
- **code**: the learner completes a function and the checker runs it against the engine (`CodeExercise`).

A learner's cell starts as ``answer = None  # YOUR CODE`` (or, for code, a function whose body is
``raise NotImplementedError  # YOUR CODE``). `check` reports "not attempted yet" for those, so an
untouched notebook runs clean in CI; it raises `WrongAnswer` with a hint on a wrong answer and confirms a
right one. `solution(name)` gives instructors the worked solution; the tests check every solution against numbers
computed independently.

`check` compares numbers with the exercise's relative tolerance (1% unless it says otherwise). For a code
exercise the answer is the learner's function; one that still raises NotImplementedError is not attempted.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import RunConfig
from .errors import ConfigError
from .messages import Text, worded


class WrongAnswer(AssertionError):
    """The answer to an exercise is not right; the message carries a hint."""


@dataclass(frozen=True)
class Exercise:
    """One exercise whose answer is a number.

    Attributes:
        name: ``"<notebook>.<topic>"``, e.g. ``"00.throughput"``.
        template: the question, with ``{placeholders}`` filled from the numbers.
        numbers: the values the question gives (for ``from_run`` exercises: an example set).
        solution: a Python expression over the numbers' names that computes the answer, e.g.
            ``"batch_size / (step_time_ms / 1e3)"``; `solution` shows it to instructors.
        hint: shown with a wrong answer.
        rel_tol: accepted relative error (answers may be rounded).
        diagnose: ``diagnose(answer, expected) -> str | None``, a hint for a recognisable mistake.
        from_run: the names of the numbers the notebook passes from the learner's own run (empty: the
            question's numbers are fixed).
    """

    name: str
    template: str
    numbers: dict
    solution: str
    hint: str
    rel_tol: float = 0.01
    diagnose: Callable[[float, float], str | None] | None = field(default=None, compare=False)
    from_run: tuple[str, ...] = ()

    def numbers_for(self, given: dict | None) -> dict:
        """The numbers of this question: ``given`` (the learner's run) for a ``from_run`` exercise."""
        if not self.from_run:
            if given is not None:
                raise ConfigError("numbers", given, f"None: exercise {self.name} has fixed numbers")
            return self.numbers
        if not isinstance(given, dict):
            raise ConfigError("numbers", given, f"a dict with {', '.join(self.from_run)} from your run "
                                                f"(exercise {self.name} uses your own numbers)")
        missing = [k for k in self.from_run if k not in given]
        unknown = [k for k in given if k not in self.from_run]
        if missing or unknown:
            raise ConfigError("numbers", sorted(given), f"exactly the keys {list(self.from_run)}")
        values = {k: v if isinstance(v, str) else _as_number(v) for k, v in given.items()}  # str: a label
        bad = [k for k, v in values.items() if v is None or (not isinstance(v, str) and not math.isfinite(v))]
        if bad:
            raise ConfigError(f"numbers[{bad[0]!r}]", given[bad[0]], "a finite number")
        return values

    def expected(self, values: dict) -> float:
        return float(eval(self.solution, {"__builtins__": _SOLUTION_BUILTINS, "math": math, **values}))  # noqa: S307

    def question_for(self, values: dict) -> str:
        return self.template.format(**{k: _show(v) for k, v in values.items()})

    @property
    def question(self) -> str:
        return self.question_for(self.numbers)


@dataclass(frozen=True)
class CodeExercise:
    """One exercise whose answer is a function the learner writes.

    Attributes:
        name: ``"<notebook>.<topic>"``, e.g. ``"01.amp_step"``.
        task: what to write (the notebook prints it above the skeleton).
        checker: ``checker(function) -> str``: runs the learner's function against the engine, returns
            what it confirmed and raises `WrongAnswer` (with a hint) where they differ.
        reference: the solution, a function with the same signature (`solution` prints its source).
    """

    name: str
    task: str
    checker: Callable[[Callable], str]
    reference: Callable

    @property
    def question(self) -> str:
        return self.task


# What a solution expression may call (the expressions are labkit's own text, never a learner's).
_SOLUTION_BUILTINS = {"abs": abs, "max": max, "min": min, "range": range, "round": round, "int": int}


class Feedback(Text):
    """The message `check` returns. It is printed already, so Jupyter does not echo it a second time."""

    def _ipython_display_(self, **kwargs):
        pass


class Exercises:
    """One notebook's exercises by name: what it asks (`question`), checks (`check`), shows instructors (`solution`).

    Example:
        >>> from labkit.labs.start_here import exercises
        >>> exercises.check("00.throughput", 3200)
    """

    def __init__(self, *items: Exercise | CodeExercise):
        self._items: dict[str, Exercise | CodeExercise] = {}
        for item in items:
            self.add(item)

    def add(self, exercise: Exercise | CodeExercise) -> Exercise | CodeExercise:
        """Add ``exercise`` (a name is added once)."""
        if exercise.name in self._items:
            raise ConfigError("exercise", exercise.name, "a name not used yet")
        self._items[exercise.name] = exercise
        return exercise

    def names(self) -> list[str]:
        """The exercise names, in the notebook's order, e.g. ``["00.throughput", "00.mfu", ...]``."""
        return list(self._items)

    def get(self, name: str) -> Exercise | CodeExercise:
        """The exercise called ``name``; an unknown name raises `ConfigError` listing the known ones."""
        if name not in self._items:
            raise ConfigError("exercise", name, f"one of {self.names()}")
        return self._items[name]

    def __add__(self, other: Exercises) -> Exercises:
        return Exercises(*self._items.values(), *other._items.values())

    def question(self, name: str, numbers: dict | None = None) -> str:
        """The question text of exercise ``name`` (with the learner's own ``numbers`` where it uses them)."""
        return question(self.get(name), numbers)

    def check(self, name: str, answer, numbers: dict | None = None) -> str:
        """Check ``answer`` to exercise ``name``; see the module's `check`."""
        return check(self.get(name), answer, numbers)

    def solution(self, name: str, numbers: dict | None = None) -> str:
        """The worked solution of exercise ``name``, for instructors."""
        return solution(self.get(name), numbers)


@worded
def question(exercise: Exercise | CodeExercise, numbers: dict | None = None) -> str:
    """The question text of ``exercise``, for a notebook to print.

    Args:
        exercise: the exercise.
        numbers: the learner's own numbers, for an exercise that uses them.
    """
    name = exercise.name
    if isinstance(exercise, CodeExercise):
        if numbers is not None:
            raise ConfigError("numbers", numbers, f"None: {name} is a code exercise")
        return exercise.task
    return exercise.question_for(exercise.numbers_for(numbers))


def check(exercise: Exercise | CodeExercise, answer, numbers: dict | None = None) -> str:
    """Check ``answer``: None -> "not attempted yet"; wrong -> `WrongAnswer` (with a hint); right -> confirmed.

    Args:
        exercise: the exercise (`Exercises.check` finds it by name, e.g. ``"00.throughput"``).
        answer: the learner's number or function, or None when not attempted.
        numbers: the learner's own numbers, for an exercise that uses them (the ones its question showed).

    Returns:
        The message, also printed.

    Example:
        >>> answer = None  # YOUR CODE
        >>> exercises.check("00.throughput", answer)  # `Exercises.check`, in notebook 00
        '00.throughput: not attempted yet ...'
    """
    name = exercise.name
    if isinstance(exercise, CodeExercise):
        return _check_code(exercise, answer, numbers)
    values = exercise.numbers_for(numbers)
    if answer is None:
        return _say(f"{name}: not attempted yet. Replace `answer = None` with your answer and run the cell again.")
    value = _as_number(answer)
    if value is None:
        raise WrongAnswer(f"{name}: expected a number, got {type(answer).__name__} {answer!r}. "
                          f"Hint: {exercise.hint}")
    expected = exercise.expected(values)
    if math.isclose(value, expected, rel_tol=exercise.rel_tol):
        return _say(f"{name}: correct! ({value:.4g})")
    specific = exercise.diagnose(value, expected) if exercise.diagnose else None
    specific = specific or unit_slip(value, expected)
    message = f"{name}: {value:.4g} is not right" + (f": {specific}" if specific else "")
    raise WrongAnswer(f"{message}. Hint: {exercise.hint}")


def _check_code(exercise: CodeExercise, answer, numbers) -> str:
    name = exercise.name
    if numbers is not None:
        raise ConfigError("numbers", numbers, f"None: {name} is a code exercise")
    if answer is None:
        return _say(f"{name}: not attempted yet. Write the function and pass it to check().")
    if not callable(answer):
        raise WrongAnswer(f"{name}: expected your function, got {type(answer).__name__} {answer!r}")
    try:
        confirmed = exercise.checker(answer)
    except NotImplementedError:
        return _say(f"{name}: not attempted yet. Replace the `raise NotImplementedError` line with your code "
                    "and run the cell again.")
    except WrongAnswer:
        raise
    except Exception as exc:  # the learner's code failed while the checker ran it: that is the answer's fault
        raise WrongAnswer(f"{name}: your function raised {type(exc).__name__}: {exc}") from exc
    return _say(f"{name}: correct! {confirmed}")


def solution(exercise: Exercise | CodeExercise, numbers: dict | None = None) -> str:
    """The worked solution of ``exercise``, for instructors.

    The formula with the numbers put in, or the reference function's source for a code exercise.

    Example:
        >>> print(exercises.solution("00.throughput"))  # `Exercises.solution`, in notebook 00
        batch_size / (step_time_ms / 1e3)
        with batch_size=256, step_time_ms=80
        = 3200
    """
    if isinstance(exercise, CodeExercise):
        return inspect.getsource(exercise.reference)  # code keeps its own lines: not wrapped
    # A from_run exercise without the learner's numbers shows its example numbers.
    values = exercise.numbers_for(numbers) if numbers is not None else exercise.numbers
    given = ", ".join(f"{k}={_show(v)}" for k, v in values.items())
    return Text(f"{exercise.solution}\nwith {given}\n= {exercise.expected(values):.6g}")


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
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"  # 292,608: easier to read, and Python accepts 292_608 or 292608 back
    return f"{value:g}" if isinstance(value, float) else str(value)


def unit_slip(value: float, expected: float) -> str | None:
    """Recognise an answer off by a power of 1000 (ms vs s, bytes vs KB): the usual unit slip."""
    if value == 0 or expected == 0 or (value < 0) != (expected < 0):
        return None
    for exponent in (3, 6, 9, 12):
        for factor, direction in ((10.0**exponent, "large"), (10.0**-exponent, "small")):
            if math.isclose(value, expected * factor, rel_tol=0.02):
                return f"it is {10**exponent:g}x too {direction}, check the units"
    return None


def percent_not_fraction(value: float, expected: float) -> str | None:
    if 1 < value <= 100:
        return "give a fraction, not a percent (e.g. 0.5 for 50%)"
    return None


def exercise_config(**changes) -> RunConfig:
    """The small run the code exercises compare against: small_cnn on shapes10, batch 16, from scratch."""
    return RunConfig(model="small_cnn", dataset="shapes10", batch_size=16, pretrained=False, max_steps=4,
                     **changes)

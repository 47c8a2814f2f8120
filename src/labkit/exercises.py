"""The notebooks' exercise checkers: `question(name)`, `check(name, answer)` and `solution(name)`.

Three kinds of exercise:

- a **number** worked out from numbers the question gives (`Exercise`);
- a number worked out from the learner's **own measured numbers** (`Exercise` with ``from_run``): the
  notebook passes them, ``question(name, numbers)`` and ``check(name, answer, numbers)``;
- **code**: the learner completes a function and the checker runs it against the engine
  (`CodeExercise`; those checkers need the training loop, so they are registered by
  `labkit.labs.code_exercises`, which every lab module imports).

A learner's cell starts as ``answer = None  # YOUR CODE`` (or, for code, a function whose body is
``raise NotImplementedError  # YOUR CODE``). `check` reports "not attempted yet" for those, so an
untouched notebook runs clean in CI; it raises `WrongAnswer` with a hint on a wrong answer and confirms a
right one. `solution(name)` gives instructors the worked solution; tests/test_exercises.py checks every
solution against numbers computed independently.
"""

from __future__ import annotations

import inspect
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


_REGISTRY: dict[str, Exercise | CodeExercise] = {}
# What a solution expression may call (the expressions are labkit's own text, never a learner's).
_SOLUTION_BUILTINS = {"abs": abs, "max": max, "min": min, "range": range, "round": round, "int": int}


class Feedback(Text):
    """The message `check` returns. It is printed already, so Jupyter does not echo it a second time."""

    def _ipython_display_(self, **kwargs):
        pass


def register(exercise: Exercise | CodeExercise) -> Exercise | CodeExercise:
    """Add ``exercise`` to the registry (a name may be registered once)."""
    if exercise.name in _REGISTRY:
        raise ConfigError("exercise", exercise.name, "a name not registered yet")
    _REGISTRY[exercise.name] = exercise
    return exercise


def names() -> list[str]:
    """The registered exercise names, e.g. ``["00.throughput", "00.mfu", ...]`` (code exercises appear once
    `labkit.labs` is imported)."""
    return list(_REGISTRY)


def get(name: str) -> Exercise | CodeExercise:
    """The exercise called ``name``; an unknown name raises `ConfigError` listing the known ones."""
    if name not in _REGISTRY:
        raise ConfigError("exercise", name, f"one of {names()}")
    return _REGISTRY[name]


@worded
def question(name: str, numbers: dict | None = None) -> str:
    """The question text of exercise ``name``, for a notebook to print.

    Args:
        name: the exercise. numbers: the learner's own numbers, for an exercise that uses them.

    Example:
        >>> print(labkit.exercises.question("00.throughput"))
    """
    exercise = get(name)
    if isinstance(exercise, CodeExercise):
        if numbers is not None:
            raise ConfigError("numbers", numbers, f"None: {name} is a code exercise")
        return exercise.task
    return exercise.question_for(exercise.numbers_for(numbers))


def check(name: str, answer, numbers: dict | None = None) -> str:
    """Check ``answer`` to exercise ``name``: None -> "not attempted yet"; wrong -> `WrongAnswer`; right -> confirmed.

    Numbers are compared with the exercise's relative tolerance (1% unless it says otherwise). For a code
    exercise ``answer`` is the learner's function; one that still raises NotImplementedError is not attempted.

    Args:
        name: the exercise, e.g. ``"00.throughput"`` (see `names`).
        answer: the learner's number or function, or None when not attempted.
        numbers: the learner's own numbers, for an exercise that uses them (the ones its question showed).

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
    specific = specific or _unit_slip(value, expected)
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


def solution(name: str, numbers: dict | None = None) -> str:
    """The worked solution of exercise ``name``, for instructors: the formula with the numbers put in, or
    the reference function's source for a code exercise.

    Example:
        >>> print(labkit.exercises.solution("00.throughput"))
        batch_size / (step_time_ms / 1e3)
        with batch_size=256, step_time_ms=80
        = 3200
    """
    exercise = get(name)
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
    solution="batch_size / (step_time_ms / 1e3)",
    hint="throughput = batch size / step time in seconds (convert the milliseconds first)",
))

register(Exercise(
    name="00.mfu",
    template=("A step performs {flops_per_step} FLOPs and takes {step_time_s} s on a GPU whose datasheet "
              "peak for that precision is {peak_flops} FLOP/s. What fraction of the peak (0..1) is "
              "achieved? (Two significant digits are enough.)"),
    numbers={"flops_per_step": 3.0e12, "step_time_s": 0.25, "peak_flops": 65e12},
    solution="flops_per_step / step_time_s / peak_flops",
    hint=("achieved FLOP/s = FLOPs per step / step time; the fraction of the peak is achieved FLOP/s / "
          "peak FLOP/s"),
    rel_tol=0.03,
    diagnose=_percent_not_fraction,
))


register(Exercise(
    name="00.warmup_error",
    template=("Your own timing run: the very first call of a training step took {first_call_s} s, a warm step "
              "takes a median of {warm_median_s} s. Had you timed {steps} steps starting with the first call and "
              "reported their mean, how many times the warm median would your step time be?"),
    numbers={"first_call_s": 0.5, "warm_median_s": 0.05, "steps": 10},
    solution="(first_call_s + (steps - 1) * warm_median_s) / steps / warm_median_s",
    hint="the mean of the steps = (first call + (steps - 1) x warm step) / steps; divide it by the warm median",
    rel_tol=0.02,
    from_run=("first_call_s", "warm_median_s", "steps"),
))


# --- Notebook 01: mixed precision -------------------------------------------------------------------------

register(Exercise(
    name="01.amp_saving",
    template=("A model of {num_params} parameters is fine-tuned with AdamW. In mixed precision its parameters, "
              "gradients and AdamW's two moments stay float32 (4 bytes each). Its activations take {act_gib} GiB "
              "in fp32 and half that in bf16. Counting only those parts, what fraction (0..1) of the fp32 "
              "peak memory does bf16 save? (Use 1 GiB = 2**30 bytes.)"),
    numbers={"num_params": 25e6, "act_gib": 6.0},
    solution="(act_gib / 2) / (num_params * 16 / 2**30 + act_gib)",
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
    solution="math.ceil(math.log2(2.0**-24 / grad))",
    hint="scaled gradient = gradient x 2**k must be at least 2**-24, so k >= log2(2**-24 / gradient); round up",
    rel_tol=0.0,
    diagnose=_power_of_two_hint,
))


register(Exercise(
    name="01.own_saving",
    template=("Your own runs: the fp32 step peaked at {fp32_peak_mib} MiB, with {fp32_activations_mib} MiB of "
              "activations; in {low} the activations took {low_activations_mib} MiB. If the activations were all "
              "that changed, what fraction (0..1) of the fp32 peak would {low} save?"),
    numbers={"fp32_peak_mib": 40.0, "fp32_activations_mib": 30.0, "low_activations_mib": 16.0, "low": "bf16"},
    solution="(fp32_activations_mib - low_activations_mib) / fp32_peak_mib",
    hint="saved = fp32 activations - low-precision activations; divide by the fp32 peak",
    rel_tol=0.02,
    diagnose=_percent_not_fraction,
    from_run=("fp32_peak_mib", "fp32_activations_mib", "low_activations_mib", "low"),
))


# --- Notebook 02: batch size -------------------------------------------------------------------------------

register(Exercise(
    name="02.slope",
    template=("A batch-size sweep measured a peak of {peak_small_mib} MiB at batch {small} and {peak_large_mib} MiB "
              "at batch {large}. How many KiB of memory does each extra sample cost (the slope)?"),
    numbers={"small": 32, "peak_small_mib": 17.5, "large": 128, "peak_large_mib": 59.5},
    solution="(peak_large_mib - peak_small_mib) * 1024 / (large - small)",
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
    solution="min(k for k in range(1, batch + 1) if batch % k == 0 and batch // k <= max_fit)",
    hint="the micro-batch is batch / grad_accum: it must be at most the largest that fits, and grad_accum must divide "
         "the batch (try 2, 4, 8, ...)",
    rel_tol=0.0,
    diagnose=_accumulation_hint,
))


register(Exercise(
    name="02.max_batch",
    template=("Your own sweep fitted peak memory = {fixed_mib} MiB + {kib_per_sample} KiB x batch. What is the "
              "largest batch that this line says fits within a budget of {budget_mib} MiB? (A whole number: "
              "round down.)"),
    numbers={"fixed_mib": 3.0, "kib_per_sample": 160.0, "budget_mib": 40.0},
    solution="math.floor((budget_mib - fixed_mib) * 1024 / kib_per_sample)",
    hint="solve fixed + slope x batch <= budget for the batch: (budget - fixed) / slope, with both in KiB "
         "(1 MiB = 1024 KiB), then round down",
    rel_tol=0.0,
    from_run=("fixed_mib", "kib_per_sample", "budget_mib"),
))


# --- Notebook 03: memory savers ---------------------------------------------------------------------------

register(Exercise(
    name="03.adam_state",
    template=("A model of {num_params} parameters is fine-tuned with AdamW, which keeps two float32 moments per "
              "parameter. How many GB (1 GB = 1e9 bytes) of optimizer state is that?"),
    numbers={"num_params": 7e9},
    solution="num_params * 2 * 4 / 1e9",
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
    solution="2 * (1 + 4 / block)",
    hint="per moment: 1 byte + 4 bytes / block size; there are two moments",
    rel_tol=0.001,
    diagnose=_forgot_block_scales,
))


register(Exercise(
    name="03.own_8bit",
    template=("Your model's trainable tensors: {numel_large} values in tensors of at least {min_8bit_size} values, "
              "{numel_small} in smaller ones. 8-bit AdamW keeps 2 moments of 1 byte per value plus a 4-byte scale per "
              "block of {block} values for the large tensors, and 2 float32 moments (8 bytes per value) for the small "
              "ones. How many bytes of optimizer state is that?"),
    numbers={"numel_large": 1_000_000, "numel_small": 5_000, "min_8bit_size": 4096, "block": 256},
    solution="numel_large * 2 * (1 + 4 / block) + numel_small * 8",
    hint="large tensors: 2 x (1 + 4 / block) bytes per value; small ones: 8 bytes per value; add the two",
    rel_tol=0.01,
    from_run=("numel_large", "numel_small", "min_8bit_size", "block"),
))


# --- Notebook 04: pruning ---------------------------------------------------------------------------------

register(Exercise(
    name="04.coo_break_even",
    template=("A float32 conv weight of shape (out, in, kh, kw), {ndim} dimensions, is stored in COO format: each "
              "nonzero costs its {value_bytes}-byte value plus one {index_bytes}-byte (int64) index per dimension, and "
              "zeros cost nothing. Above what sparsity (fraction of zeros, 0..1) does COO take fewer bytes than dense "
              "storage, which costs {value_bytes} bytes for every value? (Ignore the few bytes of header.)"),
    numbers={"ndim": 4, "value_bytes": 4, "index_bytes": 8},
    solution="1 - value_bytes / (value_bytes + ndim * index_bytes)",
    hint=("COO bytes = (1 - sparsity) x numel x (value + ndim x index); dense bytes = numel x value; set them equal "
          "and solve for the sparsity"),
    rel_tol=0.01,
    diagnose=_percent_not_fraction,
))


register(Exercise(
    name="04.own_flops",
    template=("Your structured pruning left conv {layer} with {in_after} of its {in_before} input channels and "
              "{out_after} of its {out_before} output channels (its kernel size and its output's pixels did not "
              "change). A conv's FLOPs are 2 x in x out x kernel pixels x output pixels. What fraction (0..1) of "
              "its former FLOPs does it do now?"),
    numbers={"layer": "block1.1.0", "in_before": 32, "out_before": 32, "in_after": 16, "out_after": 16},
    solution="(in_after * out_after) / (in_before * out_before)",
    hint="only the channel counts changed: divide in x out after by in x out before",
    rel_tol=0.01,
    diagnose=_percent_not_fraction,
    from_run=("layer", "in_before", "out_before", "in_after", "out_after"),
))


# --- Notebook 05: layer freezing ---------------------------------------------------------------------------

register(Exercise(
    name="05.head_state",
    template=("A ResNet-50 has {num_params} parameters with its 1000-class ImageNet head, a Linear layer of "
              "{head_in} x 1000 weights plus 1000 biases. You fine-tune it on {classes} classes, so the head is "
              "replaced by a {head_in} x {classes} Linear layer with biases. With AdamW (8 bytes of state per "
              "trainable parameter), what fraction (0..1) of full fine-tuning's optimizer state does head-only "
              "freezing keep?"),
    numbers={"num_params": 25_557_032, "head_in": 2048, "classes": 10},
    solution="(head_in * classes + classes) / (num_params - (head_in * 1000 + 1000) + head_in * classes + classes)",
    hint=("head-only trains the new head only: head_in x classes + classes parameters; full fine-tuning trains the "
          "model with the new head: the total minus the old head plus the new one; the 8 bytes cancel"),
    rel_tol=0.01,
    diagnose=_percent_not_fraction,
))


register(Exercise(
    name="05.cache_speedup",
    template=("Head-only training through the whole network takes {epoch_s} s per epoch. Computing the frozen "
              "features of the training set once takes {extract_s} s, and an epoch of head training on those "
              "cached features takes {cached_s} s. Over {epochs} epochs, how many times faster is caching (total "
              "time through the network / total time with the cache)?"),
    numbers={"epoch_s": 40.0, "extract_s": 15.0, "cached_s": 0.5, "epochs": 10},
    solution="epochs * epoch_s / (extract_s + epochs * cached_s)",
    hint="with the cache: the one-off extraction plus every epoch on the cache; without: every epoch through the network",
    rel_tol=0.01,
))


register(Exercise(
    name="05.own_backward",
    template=("Your own level sweep, at {level}: the layers with trainable weights cost {trainable_gflop} GFLOP in the "
              "forward pass, and {first_gflop} GFLOP of that is in the layers that read the frozen part's output "
              "(their input needs no gradient). A layer's backward pass computes its weight's gradient (as many "
              "FLOPs as its forward) and, if its input needs one, its input's gradient (as many again); frozen "
              "layers before them compute neither. How many GFLOP does the backward pass cost?"),
    numbers={"level": "heavy", "trainable_gflop": 0.4531, "first_gflop": 0.151},
    solution="2 * trainable_gflop - first_gflop",
    hint=("every trainable layer: weight gradient + input gradient = 2 x its forward FLOPs, except that the layers "
          "reading the frozen output compute no input gradient: subtract their forward FLOPs once"),
    rel_tol=0.01,
    from_run=("level", "trainable_gflop", "first_gflop"),
))


# --- Notebook 06: quantization ----------------------------------------------------------------------------

register(Exercise(
    name="06.own_size",
    template=("In your run, {linear_share_pct}% of {model}'s parameters sit in Linear layers. int8 dynamic stores "
              "each Linear weight in 1 byte instead of 4 and leaves every other parameter in float32. Ignoring "
              "biases, scales and the file's headers, what fraction (0..1) of the fp32 file would you expect it "
              "to keep? (Your run measured {measured_pct}%.)"),
    numbers={"model": "tiny_vit", "linear_share_pct": 97.3, "measured_pct": 28.9},
    solution="1 - 0.75 * linear_share_pct / 100",
    hint="the Linear share shrinks to a quarter, the rest stays: (1 - share) + share / 4",
    rel_tol=0.01,
    diagnose=_percent_not_fraction,
    from_run=("model", "linear_share_pct", "measured_pct"),
))


def _nf4_hint(value: float, expected: float) -> str | None:
    """06.nf4_bytes with its fixed numbers (block 64): recognise the 4-bit bytes without the scales."""
    if math.isclose(value, expected * 0.5 / (0.5 + 4 / 64), rel_tol=0.01):
        return "that is the 4-bit weights alone; every block of 64 also stores a 4-byte float32 scale"
    if math.isclose(value, expected * 4 / (0.5 + 4 / 64), rel_tol=0.01):
        return "4 bits is half a byte, not 4 bytes"
    return None


register(Exercise(
    name="06.nf4_bytes",
    template=("QLoRA stores a {billions}-billion-parameter model in NF4: 4 bits per weight, in blocks of {block} "
              "weights with one float32 scale (absmax) per block. How many GB (1e9 bytes) do the weights take? "
              "(Without QLoRA's double quantization of the scales; bf16 would take {bf16_gb} GB.)"),
    numbers={"billions": 7, "block": 64, "bf16_gb": 14},
    solution="billions * (0.5 + 4 / block)",
    hint="per weight: half a byte, plus 4 bytes of scale shared by a block: 0.5 + 4 / block bytes; times the weights",
    rel_tol=0.01,
    diagnose=_nf4_hint,
))


# --- Notebook 07: distributed data parallel -------------------------------------------------------------


def _speedup_not_efficiency(value: float, expected: float) -> str | None:
    """07.own_efficiency: the speed-up T1 / TN is N times the efficiency."""
    for n in (2, 4, 8):
        if math.isclose(value, expected * n, rel_tol=0.02):
            return f"that is the speed-up T1 / TN; the efficiency divides it by N ({n} here)"
    return _percent_not_fraction(value, expected)


register(Exercise(
    name="07.own_efficiency",
    template=("In your scaling run, one process took {t1_ms} ms per step of the global batch and {world_size} "
              "processes took {tn_ms} ms for the same batch. What is the scaling efficiency T1 / (N x TN), as a "
              "fraction (0..1)?"),
    numbers={"world_size": 2, "t1_ms": 176.0, "tn_ms": 134.0},
    solution="t1_ms / (world_size * tn_ms)",
    hint="efficiency = T1 / (N x TN): 1 means N processes did the step N times faster",
    rel_tol=0.02,
    diagnose=_speedup_not_efficiency,
    from_run=("world_size", "t1_ms", "tn_ms"),
))


def _ring_hint(value: float, expected: float) -> str | None:
    """07.ring_bytes: recognise one phase of the ring only, or the whole gradient twice."""
    if math.isclose(value, expected / 2, rel_tol=0.02):
        return "that is one phase; a ring all-reduce is a reduce-scatter and then an all-gather, each (N-1)/N"
    if math.isclose(value, expected * 8 / 7, rel_tol=0.02):
        return "each phase sends (N-1)/N of the gradient, not all of it"
    return None


register(Exercise(
    name="07.ring_bytes",
    template=("DDP all-reduces a model's gradients with a ring: each of N GPUs sends 2 (N-1) / N times the "
              "gradient's bytes per step. For a {millions}M-parameter model with float32 gradients on N = {n} "
              "GPUs, how many GB (1e9 bytes) does each GPU send per optimizer step?"),
    numbers={"millions": 124, "n": 8},
    solution="2 * (n - 1) / n * millions * 1e6 * 4 / 1e9",
    hint="gradient bytes = parameters x 4; times 2 (N-1) / N; divide by 1e9",
    rel_tol=0.01,
    diagnose=_ring_hint,
))


def _count_hint(value: float, expected: float) -> str | None:
    """08.own_count: recognise scaling the whole count with the rank (the head does not grow)."""
    if value > expected:
        return "did you scale the whole count with the rank? The head's parameters train at every rank and do not grow"
    return "did you leave out the head's parameters? They train at every rank"


register(Exercise(
    name="08.own_count",
    template=("In your sweep, LoRA on qkv trained {trainable_low} parameters at rank {rank_low} and {trainable_high} at "
              "rank {rank_high}. How many will it train at rank {rank_new}?"),
    numbers={"rank_low": 2, "trainable_low": 5_642, "rank_high": 16, "trainable_high": 34_314, "rank_new": 32},
    solution="trainable_low + (trainable_high - trainable_low) / (rank_high - rank_low) * (rank_new - rank_low)",
    hint=("the adapters grow linearly with the rank (rank x (in + out) per layer); the head's parameters do not "
          "grow: find the count per rank from your two rows, then add it for the missing ranks"),
    rel_tol=0.005,
    diagnose=_count_hint,
    from_run=("rank_low", "trainable_low", "rank_high", "trainable_high", "rank_new"),
))


def _adam_state_hint(value: float, expected: float) -> str | None:
    """08.adam_state: recognise counting only q or v, only one AdamW state, or bytes of 2 instead of 4."""
    for factor, slip in ((2, "half the answer: count both projections (q and v) and both AdamW states (m and v)"),
                         (4, "a quarter of the answer: count both projections and both AdamW states")):
        if math.isclose(value * factor, expected, rel_tol=0.02):
            return f"{slip}, 4 bytes each in float32"
    return _unit_slip(value, expected)


register(Exercise(
    name="08.adam_state",
    template=("A {layers}-layer LLaMA-style model of hidden size {hidden} gets LoRA of rank {rank} on its q and v "
              "projections (each hidden x hidden). AdamW keeps two float32 states per trainable parameter. How many "
              "MB (1e6 bytes) of optimizer state do the adapters need? (Full fine-tuning of its 7e9 parameters: 56,000 MB.)"),
    numbers={"layers": 32, "hidden": 4096, "rank": 8},
    solution="layers * 2 * rank * (hidden + hidden) * 2 * 4 / 1e6",
    hint="per layer 2 projections x rank x (in + out) parameters; times 2 states x 4 bytes; divide by 1e6",
    rel_tol=0.01,
    diagnose=_adam_state_hint,
))


def _stack_hint(value: float, expected: float) -> str | None:
    """09.own_stack: the usual slip is adding the changes (1 + sum of (ratio - 1)) instead of multiplying the ratios."""
    return "ratios multiply: a stage at 0.5x after one at 0.8x leaves 0.4x, not 0.3x"


register(Exercise(
    name="09.own_stack",
    template=("Alone on the baseline, each training stage of your recipe changed the peak memory by these ratios: "
              "larger batch {batch}, mixed precision {amp}, checkpointing {ckpt}, 8-bit optimizer {opt8}, freezing "
              "{freeze}. If their effects were independent, what would all five stacked give, as a ratio to the "
              "baseline's peak?"),
    numbers={"batch": 3.67, "amp": 1.0, "ckpt": 0.94, "opt8": 0.95, "freeze": 0.51},
    solution="batch * amp * ckpt * opt8 * freeze",
    hint="each ratio scales what the stages before it left: multiply the five ratios",
    rel_tol=0.01,
    diagnose=_stack_hint,
    from_run=("batch", "amp", "ckpt", "opt8", "freeze"),
))

"""Notebook 02's exercises on batch size, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import math

import torch.nn.functional as F

from ...equivalence import compare_step
from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, exercise_config
from ...runsetup import set_up
from .accumulation import without_batchnorm

EXERCISES = Exercises()


EXERCISES.add(Exercise(
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


EXERCISES.add(Exercise(
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


EXERCISES.add(Exercise(
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


def accumulate_solution(model, micro_batches):
    """Leave in ``.grad`` the gradient of the mean loss over all samples of ``micro_batches`` ((images, labels))."""
    total = sum(len(labels) for _, labels in micro_batches)
    for images, labels in micro_batches:
        # each micro-batch's mean loss, weighted by its share of the samples (k equal ones: 1/k each)
        loss = F.cross_entropy(model(images), labels) * (len(labels) / total)
        loss.backward()


def _check_accumulate(accumulate) -> str:
    s = set_up(exercise_config())
    model, batch = without_batchnorm(s.model), s.batch(32)
    x, y = batch.images, batch.labels
    params = [p for p in model.parameters() if p.requires_grad]
    F.cross_entropy(model(x), y).backward()
    whole = [p.grad.clone() for p in params]
    largest = max(float(g.abs().max()) for g in whole)
    for sizes in ((8, 8, 8, 8), (5, 11, 16)):
        model.zero_grad(set_to_none=True)
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        accumulate(model, [(x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
        if any(p.grad is None for p in params):
            raise WrongAnswer("02.accumulate: some parameters have no gradient: call backward() on every "
                              "micro-batch's loss")
        diff = max(float((p.grad - g).abs().max()) for p, g in zip(params, whole, strict=True)) / largest
        if diff > 1e-4:
            equal = len(set(sizes)) == 1
            hint = ("divide each micro-batch's loss so that the sum is the mean over all samples" if equal
                    else "with unequal micro-batches, 1/k is wrong: weight each micro-batch's mean loss by its "
                         "share of the samples, len(labels) / total")
            raise WrongAnswer(f"02.accumulate: with micro-batches of {sizes} samples the gradient differs from the "
                              f"whole batch's by {diff:.2g} (relative). Hint: {hint}")

    def engine_like(model, images, labels, optimizer):
        accumulate(model, list(zip(images.chunk(4), labels.chunk(4), strict=True)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    comparison = compare_step(engine_like, exercise_config(grad_accum=4, optimizer="sgd", lr=0.1))
    if not comparison.same(rel_tol=1e-4):
        raise WrongAnswer(f"02.accumulate: with 4 equal micro-batches your gradients differ from Trainer.step's "
                          f"(grad_accum=4) by {comparison.grad_diff:.2g}")
    return ("Your accumulation gives the whole batch's gradient for equal and unequal micro-batches, and equals "
            "labkit's Trainer.step with grad_accum=4.")


EXERCISES.add(CodeExercise(
    name="02.accumulate",
    task=("Complete accumulate(model, micro_batches) below: micro_batches is a list of (images, labels) pairs, "
          "possibly of different sizes. Run forward and backward on each so that, afterwards, every parameter's .grad "
          "is the gradient of the mean cross-entropy over all their samples together (no optimizer step)."),
    checker=_check_accumulate,
    reference=accumulate_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

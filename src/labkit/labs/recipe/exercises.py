"""Notebook 09's exercises on the recipe, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import pandas as pd

from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer
from .stages import Stage, measured_order

EXERCISES = Exercises()


def _stack_hint(value: float, expected: float) -> str | None:  # the usual slip: adding the changes
    return "ratios multiply: a stage at 0.5x after one at 0.8x leaves 0.4x, not 0.3x"


EXERCISES.add(Exercise(
    name="09.own_stack",
    template=("Alone on the baseline, each training stage of your recipe changed the peak memory by these ratios: "
              "larger batch {batch}, mixed precision {amp}, 8-bit optimizer {opt8}, freezing {freeze}. If their "
              "effects were independent, what would all four stacked give, as a ratio to the baseline's peak?"),
    numbers={"batch": 3.67, "amp": 1.0, "opt8": 0.95, "freeze": 0.51},
    solution="batch * amp * opt8 * freeze",
    hint="each ratio scales what the stages before it left: multiply the four ratios",
    rel_tol=0.01,
    diagnose=_stack_hint,
    from_run=("batch", "amp", "opt8", "freeze"),
))


def measured_order_solution(alone):
    """Training stages first, then inference ones; within each, the smallest memory ratio x time ratio first."""
    return sorted(alone, key=lambda name: (alone[name]["inference"],
                                           alone[name]["memory_ratio"] * alone[name]["time_ratio"]))


_ORDER_CASES = (  # stage -> what it did alone on the baseline (ratios to the baseline's peak memory and epoch time)
    {"larger batch": (3.6, 0.9, False), "mixed precision": (0.7, 0.6, False), "checkpointing": (0.8, 1.4, False),
     "8-bit optimizer": (0.9, 1.02, False), "freezing": (0.5, 0.55, False), "quantization": (1.0, 1.0, True)},
    {"quantization": (1.0, 1.0, True), "pruning": (1.0, 0.99, True), "freezing": (0.9, 0.8, False),
     "checkpointing": (0.5, 1.3, False), "larger batch": (1.8, 0.4, False)},
)


_CHANGES = {"larger batch": {"batch_size": 256}, "mixed precision": {"precision": "auto"},
            "checkpointing": {"checkpointing": True}, "8-bit optimizer": {"optimizer": "adamw8bit"},
            "freezing": {"freeze": "medium"}, "quantization": {"quantize": "int8_static"},
            "pruning": {"prune_amount": 0.5}}


def _alone_frame(case: dict):
    """`measured_order`'s inputs for ``case``: stages and an alone frame with the baseline first."""
    stages = [Stage(name, _CHANGES[name]) for name in case]
    rows = [{"peak_memory_bytes": 1.0, "epoch_time_s": 1.0, "error": None}]
    rows += [{"peak_memory_bytes": m, "epoch_time_s": t, "error": None} for m, t, _ in case.values()]
    return stages, pd.DataFrame(rows)


def _check_measured_order(order) -> str:
    for case in _ORDER_CASES:
        alone = {name: {"memory_ratio": m, "time_ratio": t, "inference": inf} for name, (m, t, inf) in case.items()}
        stages, frame = _alone_frame(case)
        expected = [stage.name for stage in measured_order(stages, frame)]
        try:
            got = list(order({k: dict(v) for k, v in alone.items()}))
        except (TypeError, KeyError) as error:
            raise WrongAnswer(f"09.measured_order: {type(error).__name__}: {error}. Hint: alone[name] is a dict with "
                              "memory_ratio, time_ratio and inference") from None
        if sorted(got) != sorted(expected):
            raise WrongAnswer(f"09.measured_order: return every stage name once; got {got}")
        descending = sorted(alone, key=lambda n: (alone[n]["inference"],
                                                  -alone[n]["memory_ratio"] * alone[n]["time_ratio"]))
        if got in (list(reversed(expected)), descending):
            raise WrongAnswer("09.measured_order: reversed: the smallest ratio (the most saved) comes first")
        inference = [name for name in got if alone[name]["inference"]]
        if got[-len(inference):] != inference:
            raise WrongAnswer("09.measured_order: the inference stages (quantization, pruning) act on the trained "
                              "model and go after every training stage")
        if got != expected:
            by_memory = sorted(alone, key=lambda n: (alone[n]["inference"], alone[n]["memory_ratio"]))
            hint = ("you ranked by memory alone; rank by memory ratio x time ratio" if got == by_memory else
                    "rank by memory ratio x time ratio, smallest first")
            raise WrongAnswer(f"09.measured_order: expected {expected}, got {got}: {hint}")
    return ("Your order equals labkit's measured_order on two recipes: training stages by memory x time, the most "
            "saved first, then the inference stages.")


EXERCISES.add(CodeExercise(
    name="09.measured_order",
    task=("Complete measured_order(alone): alone maps each stage's name to what it did alone on the baseline, a dict "
          "with memory_ratio and time_ratio (new / baseline peak memory and epoch time) and inference (True for a "
          "stage that acts on the trained model: quantization, pruning). Return the stage names in the order to "
          "stack them: every training stage before the inference ones; within each group, the one that saved the "
          "most (the smallest memory_ratio x time_ratio) first."),
    checker=_check_measured_order,
    reference=measured_order_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

"""Notebook 10's exercises on language models, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import math

from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer
from .accumulation import gradient_errors

EXERCISES = Exercises()


def _forgot_upcast(value: float, expected: float) -> str | None:
    if math.isclose(value, expected / 2, rel_tol=0.01):
        return "that is 2 bytes per value: the loss upcasts the logits to float32, 4 bytes each"
    return None


EXERCISES.add(Exercise(
    name="10.logits_gib",
    template=("A fine-tune runs {rows} rows of {seq_len} tokens through a model with a {vocab}-token vocabulary. How "
              "many GiB (2**30 bytes) do the logits take once the loss has upcast them to float32?"),
    numbers={"rows": 8, "seq_len": 2048, "vocab": 128256},
    solution="rows * seq_len * vocab * 4 / 2**30",
    hint="rows x sequence length x vocabulary values, 4 bytes each in float32; divide by 2**30",
    rel_tol=0.01,
    diagnose=_forgot_upcast,
))


EXERCISES.add(Exercise(
    name="10.own_pad_share",
    template=("In your run of section 4, padding every row to seq_len left a share {pad_max_share} of the tokens "
              "padding, and the run moved {pad_max_tokens_per_s} tokens/s. How many real tokens per second is that?"),
    numbers={"pad_max_share": 0.578, "pad_max_tokens_per_s": 4390.0},
    solution="pad_max_tokens_per_s * (1 - pad_max_share)",
    hint="a pad token is computed like any other: real tokens/s = tokens/s x (1 - padding share)",
    rel_tol=0.01,
    from_run=("pad_max_share", "pad_max_tokens_per_s"),
))


def accumulate_solution(model, micro_batches):
    """Backward through every micro-batch so that the summed gradients equal one step on their rows together.

    Args:
        model: a transformers causal LM (``model(input_ids=..., ...).logits``).
        micro_batches: `labkit.text.TokenBatch` objects; ``micro.labels`` is -100 where no loss is taken.
    """
    import torch.nn.functional as F

    total = sum(int((micro.labels[:, 1:] != -100).sum()) for micro in micro_batches)  # the step's label tokens
    for micro in micro_batches:
        inputs = micro.model_inputs()
        inputs.pop("labels")
        logits = model(**inputs).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), micro.labels[:, 1:].flatten(),
                               ignore_index=-100, reduction="sum")  # a SUM over this micro-batch's tokens
        (loss / total).backward()  # over the WHOLE step's tokens


def _check_accumulate(accumulate) -> str:
    def checked(model, micro_batches):
        accumulate(model, micro_batches)
        if not any(p.grad is not None for p in model.parameters()):
            raise WrongAnswer("10.accumulate: no gradients: call .backward() on each micro-batch's loss")

    error = gradient_errors(8, 4, 0, checked)[0]["yours"]  # shortest rows first: uneven label tokens
    if error > 1e-4:
        raise WrongAnswer(f"10.accumulate: your gradients are {error:.1%} off one step on the 8 rows. Hint: sum each "
                          "micro-batch's token losses (reduction='sum') and divide by the label tokens of ALL the "
                          "micro-batches, not by each one's own count or by the number of micro-batches")
    return f"Your accumulated gradient equals one step on all 8 rows (relative difference {error:.1e})."


EXERCISES.add(CodeExercise(
    name="10.accumulate",
    task=("Complete accumulate(model, micro_batches): backward through each micro-batch so that the gradients "
          "summed over them equal one step on all their rows together, whatever their numbers of label tokens "
          "(labels are -100 where no loss is taken; position t predicts token t + 1)."),
    checker=_check_accumulate,
    reference=accumulate_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

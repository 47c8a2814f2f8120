"""Notebook 11's exercises on your fine-tune, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import numpy as np

from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer
from ...finetune.audit import pad_share

EXERCISES = Exercises()


def pad_share_solution(lengths, batch_size):
    """The share of padding when rows of ``lengths`` tokens, in this order, are batched ``batch_size`` at a time
    (a last, incomplete batch dropped) and each batch is padded to its longest row."""
    padded = real = 0
    for start in range(0, len(lengths) - batch_size + 1, batch_size):
        rows = lengths[start:start + batch_size]
        padded, real = padded + max(rows) * len(rows), real + sum(rows)
    return 1 - real / padded


def _check_pad_share(function) -> str:
    lengths = np.random.default_rng(1).integers(5, 300, size=50)
    for batch in (1, 4, 8):
        expected = pad_share(lengths, batch, seed=0)  # the audit's: a seeded order, then in batches
        yours = function(list(lengths[np.random.default_rng(0).permutation(len(lengths))]), batch)
        if yours is None or abs(float(yours) - expected) > 1e-9:
            raise WrongAnswer(f"11.pad_share: at batch {batch} yours gives {yours}, the audit {expected:.4f}. Hint: "
                              "pad each batch to ITS longest row, count the pad tokens over every batch, and divide by "
                              "all the tokens computed (real + pad); drop a last batch smaller than batch_size")
    return f"Your pad share equals the audit's at batches 1, 4 and 8 ({expected:.1%} at 8)."


EXERCISES.add(CodeExercise(
    name="11.pad_share",
    task=("Complete pad_share(lengths, batch_size): rows of these token lengths come in this order, batch_size at a "
          "time (drop a last, smaller batch); each batch is padded to its longest row. Return the share of the "
          "computed tokens that is padding, as the audit's 'padding' row counts it."),
    checker=_check_pad_share,
    reference=pad_share_solution,
))

EXERCISES.add(Exercise(
    name="11.own_padding",
    template=("Your measured full fine-tune (section 4) computed {tokens_per_s} tokens/s, of which {real_tokens_per_s} "
              "were real tokens. What share of the computed tokens was padding?"),
    numbers={"tokens_per_s": 13800.0, "real_tokens_per_s": 9660.0},
    solution="1 - real_tokens_per_s / tokens_per_s",
    hint="a pad token is computed like any other: padding share = 1 - real tokens/s / tokens/s",
    rel_tol=0.02,
    from_run=("tokens_per_s", "real_tokens_per_s"),
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

"""Notebook 03's exercises on memory savers, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import math

import torch

from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer
from .selective import activation_peak, mlp_blocks

EXERCISES = Exercises()


EXERCISES.add(Exercise(
    name="03.adam_state",
    template=("A model of {num_params} parameters is fine-tuned with AdamW, which keeps two float32 moments per "
              "parameter. How many GB (1 GB = 1e9 bytes) of optimizer state is that?"),
    numbers={"num_params": 7e9},
    solution="num_params * 2 * 4 / 1e9",
    hint="two moments x 4 bytes = 8 bytes per parameter; divide the bytes by 1e9",
))


EXERCISES.add(Exercise(
    name="03.eight_bit_bytes",
    template=("bitsandbytes' 8-bit AdamW stores each of its two moments as 1 byte per value, plus one float32 "
              "scale (4 bytes) per block of {block} values of each moment. How many bytes per parameter does its "
              "state take for a large tensor? (Give at least three decimals.)"),
    numbers={"block": 256},
    solution="2 * (1 + 4 / block)",
    hint="per moment: 1 byte + 4 bytes / block size; there are two moments",
    rel_tol=0.001,
    diagnose=lambda value, expected: ("the two 1-byte moments are right; add the fp32 scale stored for every block "
                                      "of values") if math.isclose(value, 2.0) else None,
))


EXERCISES.add(Exercise(
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


def checkpointed_forward_solution(blocks, x):
    """Run ``blocks`` (an nn.Sequential) on ``x``, each block under a checkpoint."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)  # keep only the block's input; recompute the rest
    return x


def _check_checkpointed(forward) -> str:
    blocks = mlp_blocks()
    x = torch.randn(256, 256)
    plain_bytes, plain_grads, plain_out = activation_peak(blocks, lambda b, t: b(t), x)
    yours_bytes, yours_grads, yours_out = activation_peak(blocks, forward, x)
    if not torch.allclose(yours_out, plain_out, rtol=1e-5, atol=1e-6):
        raise WrongAnswer("03.checkpoint: your forward's output differs from blocks(x): run every block, in order")
    if any(a is None or not torch.allclose(a, b, rtol=1e-4, atol=1e-7)
           for a, b in zip(yours_grads, plain_grads, strict=True)):
        raise WrongAnswer("03.checkpoint: the gradients differ from the plain forward's. Hint: "
                          "checkpoint(block, x, use_reentrant=False) returns the block's output; pass it on")
    if yours_bytes > 0.8 * plain_bytes:
        raise WrongAnswer(f"03.checkpoint: activations peaked at {yours_bytes / 2**20:.1f} MiB, the plain forward's at "
                          f"{plain_bytes / 2**20:.1f} MiB: nothing was checkpointed, or everything in one segment, "
                          "which recomputes all of it at once. Hint: wrap each block in "
                          "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)")
    return (f"Same output and gradients as the plain forward, with activations peaking at "
            f"{yours_bytes / 2**20:.1f} MiB instead of {plain_bytes / 2**20:.1f} MiB.")


EXERCISES.add(CodeExercise(
    name="03.checkpoint",
    task=("Complete the forward below, (blocks, x): run each block of the nn.Sequential `blocks` on x under "
          "torch.utils.checkpoint.checkpoint, so that the output and the gradients stay the same and the "
          "activations held during forward and backward fall (checkpointing the whole stack as one segment "
          "recomputes it all at once and saves nothing at the peak)."),
    checker=_check_checkpointed,
    reference=checkpointed_forward_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

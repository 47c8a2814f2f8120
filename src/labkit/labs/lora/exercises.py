"""Notebook 08's exercises on LoRA and QLoRA, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, unit_slip
from ...techniques import lora

EXERCISES = Exercises()


def _count_hint(value: float, expected: float) -> str | None:
    """08.own_count: recognise a count that grew with the rank's square, or did not grow at all."""
    if value > expected:
        return "did it grow faster than the rank? Each adapted layer trains rank x (in + out): linear in the rank"
    return "did you keep part of the count fixed? Only the adapters train here, and all of them grow with the rank"


EXERCISES.add(Exercise(
    name="08.own_count",
    template=("In your sweep, LoRA on q_proj and v_proj trained {trainable_low} parameters at rank {rank_low} and "
              "{trainable_high} at rank {rank_high}. How many will it train at rank {rank_new}?"),
    numbers={"rank_low": 2, "trainable_low": 4_096, "rank_high": 8, "trainable_high": 16_384, "rank_new": 16},
    solution="trainable_low + (trainable_high - trainable_low) / (rank_high - rank_low) * (rank_new - rank_low)",
    hint=("the adapters grow linearly with the rank (rank x (in + out) per adapted layer), and on a language model "
          "nothing else trains: find the count per rank from your two rows"),
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
    return unit_slip(value, expected)


EXERCISES.add(Exercise(
    name="08.adam_state",
    template=("A {layers}-layer LLaMA-style model of hidden size {hidden} gets LoRA of rank {rank} on its q and v "
              "projections (each hidden x hidden). AdamW keeps two float32 states per trainable parameter. How many "
              "MB (1e6 bytes) of optimizer state do the adapters need? (Full fine-tuning of its 7e9 parameters: "
              "56,000 MB.)"),
    numbers={"layers": 32, "hidden": 4096, "rank": 8},
    solution="layers * 2 * rank * (hidden + hidden) * 2 * 4 / 1e6",
    hint="per layer 2 projections x rank x (in + out) parameters; times 2 states x 4 bytes; divide by 1e6",
    rel_tol=0.01,
    diagnose=_adam_state_hint,
))


def lora_forward_solution(x, weight, bias, lora_A, lora_B, alpha):
    """The LoRA layer's output: the frozen layer plus the scaled low-rank update, as two thin matmuls."""
    rank = lora_A.shape[0]
    return F.linear(x, weight, bias) + (x @ lora_A.T @ lora_B.T) * (alpha / rank)


_LORA_CASES = ((128, 384, 8, 16.0), (64, 64, 1, 8.0), (96, 32, 4, 12.0), (20, 50, 16, 32.0))  # alpha / rank never 1


def _check_lora_forward(forward) -> str:
    for in_features, out_features, rank, alpha in _LORA_CASES:
        torch.manual_seed(in_features + rank)
        layer = lora.LoRALinear(torch.nn.Linear(in_features, out_features), rank, alpha)
        torch.nn.init.normal_(layer.lora_B, std=0.5)  # as after training (a zero B would hide the update)
        x = torch.randn(2, 5, in_features)
        args = (layer.base.weight.detach(), layer.base.bias.detach(), layer.lora_A.detach(), layer.lora_B.detach())
        with torch.no_grad():
            expected = layer(x)
            try:
                got = torch.as_tensor(forward(x.clone(), *[a.clone() for a in args], alpha))
            except NotImplementedError:
                raise  # not attempted yet
            except RuntimeError as error:
                raise WrongAnswer(f"08.lora_forward: {str(error).splitlines()[0]} (in={in_features}, "
                                  f"out={out_features}, rank={rank}). Hint: x @ A.T is (..., rank), then @ B.T is "
                                  "(..., out)") from None
            if got.shape != expected.shape:
                raise WrongAnswer(f"08.lora_forward: output shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
            base = F.linear(x, args[0], args[1])
            update = expected - base
            if torch.allclose(got, base, atol=1e-4):
                raise WrongAnswer("08.lora_forward: your output is the frozen layer's alone; add the update "
                                  "(alpha / rank) * B A x")
            if torch.allclose(got, base + update * rank / alpha, atol=1e-4):
                raise WrongAnswer("08.lora_forward: the update is unscaled; multiply it by alpha / rank "
                                  "(rank = lora_A.shape[0])")
            if rank != 1 and torch.allclose(got, base + update * rank * rank, atol=1e-4):
                raise WrongAnswer("08.lora_forward: the update is scaled by alpha x rank; LoRA scales by alpha / rank")
            if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
                off = float((got - expected).abs().max())
                raise WrongAnswer(f"08.lora_forward: for in={in_features}, out={out_features}, rank={rank}, "
                                  f"alpha={alpha:g} your output differs from LoRALinear's by up to {off:.3g}")
    return ("Your forward equals labkit's LoRALinear on four shapes and ranks: W x + b + (alpha / rank) B A x, "
            "with the update as two thin matmuls.")


EXERCISES.add(CodeExercise(
    name="08.lora_forward",
    task=("Complete lora_forward(x, weight, bias, lora_A, lora_B, alpha) below: the output of a LoRA layer whose "
          "frozen Linear has weight (out, in) and bias (out,), with lora_A (rank, in) and lora_B (out, rank). "
          "x is (..., in); return (..., out). The update is scaled by alpha / rank."),
    checker=_check_lora_forward,
    reference=lora_forward_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

"""Notebook 01's exercises on mixed precision, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from ...env import env_report
from ...equivalence import compare_step
from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, exercise_config, percent_not_fraction

EXERCISES = Exercises()


EXERCISES.add(Exercise(
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
    diagnose=percent_not_fraction,
))


def power_of_two_hint(value: float, expected: float) -> str | None:
    if value > 0 and math.isclose(math.log2(value), expected):
        return "give the exponent k of the scale 2**k, not the scale itself"
    return None


EXERCISES.add(Exercise(
    name="01.loss_scale",
    template=("fp16's smallest positive number is 2**-24 (about 5.96e-8); a value below it is rounded to 0 or to "
              "2**-24 and loses all its digits. A gradient element is {grad} in float32. What is the smallest "
              "exponent k such that the scaled gradient, gradient x 2**k, is at least 2**-24?"),
    numbers={"grad": 1e-9},
    solution="math.ceil(math.log2(2.0**-24 / grad))",
    hint="scaled gradient = gradient x 2**k must be at least 2**-24, so k >= log2(2**-24 / gradient); round up",
    rel_tol=0.0,
    diagnose=power_of_two_hint,
))


EXERCISES.add(Exercise(
    name="01.own_saving",
    template=("Your own runs: the fp32 step peaked at {fp32_peak_mib} MiB, with {fp32_activations_mib} MiB of "
              "activations; in {low} the activations took {low_activations_mib} MiB. If the activations were all "
              "that changed, what fraction (0..1) of the fp32 peak would {low} save?"),
    numbers={"fp32_peak_mib": 40.0, "fp32_activations_mib": 30.0, "low_activations_mib": 16.0, "low": "bf16"},
    solution="(fp32_activations_mib - low_activations_mib) / fp32_peak_mib",
    hint="saved = fp32 activations - low-precision activations; divide by the fp32 peak",
    rel_tol=0.02,
    diagnose=percent_not_fraction,
    from_run=("fp32_peak_mib", "fp32_activations_mib", "low_activations_mib", "low"),
))


def amp_step_solution(model, images, labels, optimizer, scaler, dtype, max_norm=1.0):
    """One mixed-precision step: autocast forward, scaled backward, unscale, clip, step, update."""
    with torch.autocast(images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()  # a disabled scaler (bf16) passes the loss through
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # skips the step if a gradient is inf/NaN
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _diagnose_step(comparison, precision: str) -> str | None:
    if comparison.engine_steps != comparison.plain_steps:
        return (f"optimizer.step() ran {comparison.plain_steps} times in your step, {comparison.engine_steps} in the "
                "engine's. Hint: step through the scaler, scaler.step(optimizer), once per step")
    if comparison.engine_scale != comparison.plain_scale:
        return (f"the GradScaler's scale is {comparison.plain_scale:g}, the engine's {comparison.engine_scale:g}. "
                "Hint: call scaler.update() once after scaler.step(optimizer)")
    if not comparison.same(rel_tol=1e-4):
        return (f"in {precision}, the gradients the optimizer got differ from the engine's by "
                f"{comparison.grad_diff:.2g} (relative). Hint: scale the loss before backward(), call "
                "scaler.unscale_(optimizer) before clipping, clip to max_norm, and zero the gradients every step")
    return None


def _check_amp_step(amp_step) -> str:
    env = env_report()
    # A GPU before Ampere may refuse bf16 kernels outright: there only fp16 can be compared.
    precisions = ("fp16", "bf16") if env["device"] != "cuda" or env["bf16"] else ("fp16",)
    step = functools.partial(amp_step, max_norm=1.0)
    for precision in precisions:
        problem = _diagnose_step(compare_step(step, exercise_config(precision=precision, grad_clip=1.0)), precision)
        if problem:
            raise WrongAnswer(f"01.amp_step: {problem}")
    # A scale of 2**40 overflows fp16 gradients: the engine skips that step, and so must yours.
    if compare_step(step, exercise_config(precision="fp16", grad_clip=1.0), steps=1, init_scale=2.0**40).plain_steps:
        raise WrongAnswer("01.amp_step: with fp16 gradients that overflowed (inf), your step still stepped the "
                          "optimizer, and the weights became inf/NaN. Hint: step through the scaler, "
                          "scaler.step(optimizer): it skips the step when a gradient is not finite")
    done = "In fp16 (with a GradScaler) and in bf16 (its scaler disabled)" if len(precisions) == 2 else "In fp16"
    return (f"{done}, two steps of your function gave the optimizer the same gradients as labkit's Trainer.step, "
            "clipped to 1.0, and it skipped a step whose gradients overflowed.")


EXERCISES.add(CodeExercise(
    name="01.amp_step",
    task=("Complete the step below, (model, images, labels, optimizer, scaler, dtype, max_norm): one training "
          "step with the forward and the cross-entropy loss under torch.autocast(dtype=dtype), the backward pass "
          "through the GradScaler, the gradients clipped to max_norm (unscaled first), the optimizer step through "
          "the scaler, the scaler's update, and the gradients zeroed for the next step. It must work for fp16 (an "
          "enabled scaler) and bf16 (a disabled one); the checker runs two steps."),
    checker=_check_amp_step,
    reference=amp_step_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

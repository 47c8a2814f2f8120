"""Notebook 06's exercises on quantization, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import math

import torch

from ... import models
from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, percent_not_fraction
from ...techniques import quantization

EXERCISES = Exercises()


EXERCISES.add(Exercise(
    name="06.own_size",
    template=("In your run, {linear_share_pct}% of {model}'s parameters sit in Linear layers. int8 dynamic stores "
              "each Linear weight in 1 byte instead of 4 and leaves every other parameter in float32. Ignoring "
              "biases, scales and the file's headers, what fraction (0..1) of the fp32 file would you expect it "
              "to keep? (Your run measured {measured_pct}%.)"),
    numbers={"model": "tiny_vit", "linear_share_pct": 97.3, "measured_pct": 28.9},
    solution="1 - 0.75 * linear_share_pct / 100",
    hint="the Linear share shrinks to a quarter, the rest stays: (1 - share) + share / 4",
    rel_tol=0.01,
    diagnose=percent_not_fraction,
    from_run=("model", "linear_share_pct", "measured_pct"),
))


def _nf4_hint(value: float, expected: float) -> str | None:
    """06.nf4_bytes with its fixed numbers (block 64): recognise the 4-bit bytes without the scales."""
    if math.isclose(value, expected * 0.5 / (0.5 + 4 / 64), rel_tol=0.01):
        return "that is the 4-bit weights alone; every block of 64 also stores a 4-byte float32 scale"
    if math.isclose(value, expected * 4 / (0.5 + 4 / 64), rel_tol=0.01):
        return "4 bits is half a byte, not 4 bytes"
    return None


EXERCISES.add(Exercise(
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


def per_channel_int8_solution(weight):
    """Symmetric int8 per output channel: (integers in -128..127, one scale per row of ``weight``)."""
    w = weight.detach().float()
    rows = w.reshape(w.shape[0], -1)
    scale = rows.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).eps) / 127.5  # torch's symmetric range
    shape = (-1,) + (1,) * (w.dim() - 1)
    q = torch.clamp(torch.round(w / scale.reshape(shape)), -128, 127).to(torch.int8)
    return q, scale


def _check_per_channel(per_channel) -> str:
    torch.manual_seed(0)
    model = models.build("tiny_vit", 10, pretrained=False)[0]
    weights = {"block1.attn.qkv": model.block1.attn.qkv.weight.detach(), "stem.proj": model.stem.proj.weight.detach()}
    weights["block1.mlp.0"] = model.block1.mlp[0].weight.detach() * torch.logspace(-2, 0, 256)[:, None]  # rows differ
    for name, w in weights.items():
        result = per_channel(w.clone())
        if not (isinstance(result, tuple) and len(result) == 2):
            raise WrongAnswer("06.per_channel: return a pair (q, scale): the integers and one scale per output channel")
        q, scale = (torch.as_tensor(t) for t in result)
        if q.shape != w.shape:
            raise WrongAnswer(f"06.per_channel: q must have the weight's shape {tuple(w.shape)}; got {tuple(q.shape)}")
        if scale.numel() == 1 and w.shape[0] > 1:
            raise WrongAnswer("06.per_channel: one scale for the whole tensor is per-tensor quantization. Hint: take "
                              "the largest |w| of each output channel (row 0, row 1, ...): amax over every dim but 0")
        if scale.numel() != w.shape[0]:
            raise WrongAnswer(f"06.per_channel: one scale per output channel ({w.shape[0]} of them) expected; got "
                              f"{scale.numel()}")
        expected_scale, zero = quantization.affine_qparams(w, symmetric=True, dim=0)
        scale = scale.flatten().float()
        if torch.allclose(scale * 127 / 127.5, expected_scale, rtol=1e-5):  # amax / 127 instead of / 127.5
            raise WrongAnswer("06.per_channel: your scale is max|w| / 127; torch's symmetric observers use "
                              "max|w| / 127.5, half the int8 range of 255 steps (so -128 is reachable too)")
        if not torch.allclose(scale, expected_scale, rtol=1e-5):
            raise WrongAnswer(f"06.per_channel: the scales of {name} differ from torch's (first: {float(scale[0]):.4g} "
                              f"against {float(expected_scale[0]):.4g}). Hint: scale = max|w| of the row / 127.5")
        torchs = torch.quantize_per_channel(w.float(), expected_scale, zero, 0, torch.qint8).int_repr()
        differ = (q.to(torch.int64) - torchs.to(torch.int64)).abs()
        # Each channel's largest |w| lands exactly on +-127.5 steps, a rounding tie that dividing (w / scale) and
        # torch's multiplying (w * (1 / scale)) may break differently: one integer per channel may differ by 1.
        if int(differ.max()) > 1 or int((differ > 0).sum()) > w.shape[0] + w.numel() // 1000:
            raise WrongAnswer(f"06.per_channel: {int((differ > 0).sum())} of {name}'s integers differ from "
                              "torch.quantize_per_channel's. Hint: q = clamp(round(w / scale), -128, 127), with the "
                              "scale broadcast along the output channels (reshape it to (-1, 1, ...))")
    return ("Your per-channel int8 equals torch.quantize_per_channel's integers and scales (up to a rare rounding tie) "
            "on three weights: a Linear, a conv and one whose rows differ in range by 100x.")


EXERCISES.add(CodeExercise(
    name="06.per_channel",
    task=("Complete per_channel_int8(weight) below: symmetric int8 quantization with one scale per output channel "
          "(dim 0): return (q, scale), q the integers (weight's shape, in -128..127) and scale a 1-D tensor with one "
          "value per output channel, chosen as torch's symmetric observers choose it, so that your integers are "
          "torch.quantize_per_channel's. It must work for a Linear weight (out, in) and a conv weight "
          "(out, in, kh, kw)."),
    checker=_check_per_channel,
    reference=per_channel_int8_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

"""Notebook 06's rounding errors. Section 1: one weight quantized four ways (symmetric or not, per tensor or per
channel). Section 3.4: which layers are sensitive to rounding (validation split): static int8 with choices of layers
kept in float, and weights rounded to fewer bits (simulated)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import measure, results
from ...config import RunConfig
from ...env import profile
from ...inference import accuracy
from ...labresult import LabResult
from ...messages import worded
from ...techniques import quantization
from .workload import CALIBRATION_BATCHES, accuracies, calibration_batches, fine_tuned, points

KEEP_FLOAT_CHOICES = {"all int8": (), "LayerNorm float": ("LayerNorm",), "first+last float": ("stem", "head"),
                      "first+last+LN float": ("stem", "head", "LayerNorm")}  # what stays in float
SIMULATED_BITS = (4, 3)  # simulated weight widths: where rounding starts to hurt
SIMULATED_CHOICES = {"all rounded": (), "first float": ("stem",), "last float": ("head",),
                     "first+last float": ("stem", "head")}


@dataclass
class SchemeErrors(LabResult):
    """Each weight's error under each scheme; ``relative_error`` is norm(error) / norm(weight)."""

    shown = ("weight", "scheme", "granularity", "mean_abs_error", "max_abs_error", "relative_error")

    @worded
    def finding(self) -> str:
        parts = []
        for name, rows in self.frame.groupby("weight", sort=False):
            best = rows.loc[rows.relative_error.idxmin()]
            sym = rows[rows.scheme == "symmetric"].set_index("granularity").relative_error
            parts.append(f"{name}: smallest error {best.scheme} {best.granularity} ({best.relative_error:.2%}), "
                         f"symmetric per tensor / per channel: {sym['per tensor'] / sym['per channel']:.1f}x the error")
        return "; ".join(parts) + "."


def scheme_errors(weights, bits: int = 8) -> SchemeErrors:
    """Each weight (a tensor, or a dict name -> tensor) quantized and dequantized the four ways, with its error."""
    weights = weights if isinstance(weights, dict) else {"weight": weights}
    rows = []
    for name, weight in weights.items():
        w = weight.detach().float().cpu()
        for symmetric in (False, True):
            for dim in (None, 0):
                scale, zero_point = quantization.affine_qparams(w, bits, symmetric, dim)
                q = quantization.quantize_affine(w, scale, zero_point, bits, symmetric, dim)
                error = quantization.dequantize_affine(q, scale, zero_point, dim) - w
                rows.append({"weight": name, "scheme": "symmetric" if symmetric else "asymmetric",
                             "granularity": "per tensor" if dim is None else "per channel",
                             "mean_abs_error": float(error.abs().mean()), "max_abs_error": float(error.abs().max()),
                             "relative_error": float(torch.linalg.vector_norm(error) / torch.linalg.vector_norm(w))})
    return SchemeErrors(pd.DataFrame(rows))


@dataclass
class Sensitivity(LabResult):
    """Validation accuracy of each choice of float layers, per study; the fp32 model is the first row."""

    shown = ("study", "choice", "keep_float", "val_accuracy", "accuracy_drop", "model_size_bytes")

    @worded
    def finding(self) -> str:
        fp32, size = self.frame.val_accuracy.iloc[0], profile().val_size
        parts = []
        for study, rows in self.frame.iloc[1:].groupby("study", sort=False):
            rows = rows.set_index("choice")
            everything = accuracies(rows.val_accuracy.iloc[0], fp32, size)
            text = f"{study}: everything quantized {points(everything.difference)} ({everything.verdict})"
            if everything.direction >= 0:
                parts.append(text + ", nothing to win back")
                continue
            best = rows.val_accuracy.idxmax()
            won = accuracies(rows.val_accuracy[best], rows.val_accuracy.iloc[0], size)
            parts.append(text + f", {best} won back {points(won.difference)} ({won.verdict})")
        return f"Validation accuracy of fp32 {fp32:.1%}; " + "; ".join(parts) + "."


def sensitivity(cfg: RunConfig, num_calibration: int = CALIBRATION_BATCHES,
                bits: tuple[int, ...] = SIMULATED_BITS, refresh: bool = False) -> Sensitivity:
    """Static int8 and simulated ``bits``-bit weights, each with choices of layers kept in float (cached)."""
    frame = results.cached_frame("quant-sensitivity", [cfg], lambda: _measure(cfg, num_calibration, bits),
                                 refresh=refresh, num_calibration=num_calibration, bits=list(bits))
    frame["model_size_bytes"] = pd.to_numeric(frame.model_size_bytes)
    return Sensitivity(frame)


def _measure(cfg: RunConfig, num_calibration: int, bits: tuple[int, ...]) -> pd.DataFrame:
    model = copy.deepcopy(fine_tuned(cfg, progress=False)[0]).cpu().eval()
    names = dict(model.named_modules())
    calibration = calibration_batches(cfg, num_calibration)
    variants = {("fp32", "fp32 (reference)"): ((), model)}
    for choice, keep in KEEP_FLOAT_CHOICES.items():
        if "LayerNorm" in keep and not any(isinstance(m, nn.LayerNorm) for m in model.modules()):
            continue  # a CNN has none: the choice would repeat another
        keep = tuple(k for k in keep if k == "LayerNorm" or k in names)
        variants[("int8 static", choice)] = (keep, quantization.quantize(model, "int8_static", calibration,
                                                                         keep_float=keep))
    sized = set(variants)  # the real int8 models (and fp32): their files; the simulated ones store floats
    for width in bits:
        for choice, keep in SIMULATED_CHOICES.items():
            keep = tuple(k for k in keep if k in names)
            variants[(f"{width}-bit weights (simulated)", choice)] = (
                keep, quantization.fake_quantize_weights(model, width, keep_float=keep))
    rows = []
    for (study, choice), (keep, m) in variants.items():
        label = f"{study.split()[0]} {choice}" if "simulated" in study else choice  # e.g. "3-bit first float"
        rows.append({"study": study, "choice": choice, "label": label, "keep_float": ", ".join(keep) or "-",
                     "val_accuracy": accuracy(m, cfg, "val"),
                     **({"model_size_bytes": measure.model_size_bytes(m)} if (study, choice) in sized else {})})
    frame = pd.DataFrame(rows)
    frame["accuracy_drop"] = frame.val_accuracy.iloc[0] - frame.val_accuracy
    return frame

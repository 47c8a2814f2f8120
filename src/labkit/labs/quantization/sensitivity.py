"""Notebook 06, section 3.4: which layers are sensitive to rounding, on the validation split.

Two studies in one frame: static int8 (real kernels) with everything quantized and with the first, last and
LayerNorm layers kept in float; and weights rounded to fewer bits (simulated), the first and last layers kept in
float or not.
"""

from __future__ import annotations

import copy

import pandas as pd
from torch import nn

from ... import measure, results
from ...config import RunConfig
from ...env import profile
from ...inference import accuracy
from ...messages import worded
from ...techniques import quantization
from .workload import CALIBRATION_BATCHES, calibration_batches, fine_tuned

KEEP_FLOAT_CHOICES = {  # what stays in float: nothing; LayerNorm; the first and last layers; all three
    "all int8": (),
    "LayerNorm float": ("LayerNorm",),
    "first+last float": ("stem", "head"),
    "first+last+LN float": ("stem", "head", "LayerNorm"),
}
SIMULATED_BITS = (4, 3)  # simulated weight widths: where rounding starts to hurt
SIMULATED_CHOICES = {"all rounded": (), "first float": ("stem",), "last float": ("head",),
                     "first+last float": ("stem", "head")}


def sensitivity(cfg: RunConfig, num_calibration: int = CALIBRATION_BATCHES,
                bits: tuple[int, ...] = SIMULATED_BITS, refresh: bool = False) -> pd.DataFrame:
    """Static int8 and simulated low-bit weights, each with choices of layers kept in float (measured once, cached).

    Args:
        cfg: the fine-tune. num_calibration: calibration batches. bits: simulated widths. refresh: measure again.

    Returns:
        ``study``, ``choice``, ``label``, ``keep_float``, ``val_accuracy``, ``accuracy_drop`` (validation points
        below fp32); for the fp32 and int8 rows ``model_size_bytes``. The fp32 model is the first row.
    """
    frame = results.cached_frame("quant-sensitivity", [cfg], lambda: _measure(cfg, num_calibration, bits),
                                 refresh=refresh, num_calibration=num_calibration, bits=list(bits))
    frame["model_size_bytes"] = pd.to_numeric(frame.model_size_bytes)
    return frame


def _measure(cfg: RunConfig, num_calibration: int, bits: tuple[int, ...]) -> pd.DataFrame:
    model, _ = fine_tuned(cfg, progress=False)
    model = copy.deepcopy(model).cpu().eval()
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
        entry = {"study": study, "choice": choice, "label": label, "keep_float": ", ".join(keep) or "-",
                 "val_accuracy": accuracy(m, cfg, "val")}
        if (study, choice) in sized:
            entry["model_size_bytes"] = measure.model_size_bytes(m)
        rows.append(entry)
    frame = pd.DataFrame(rows)
    frame["accuracy_drop"] = frame.val_accuracy.iloc[0] - frame.val_accuracy
    return frame


@worded
def sensitivity_finding(frame: pd.DataFrame) -> str:
    """One line: per study, what quantizing everything cost and what the best float choice won back, against noise.

    Args:
        frame: `sensitivity`'s frame.
    """
    fp32 = frame.val_accuracy.iloc[0]
    noise = measure.accuracy_noise(fp32, profile().val_size)
    parts = []
    for study, rows in frame.iloc[1:].groupby("study", sort=False):
        rows = rows.set_index("choice")
        everything = rows.accuracy_drop.iloc[0]
        if everything <= noise:
            change = round(-everything * 100, 1) + 0.0  # never "-0.0"
            parts.append(f"{study}: everything quantized {change:+.1f} points, nothing to win back")
            continue
        best = rows.accuracy_drop.idxmin()
        won = everything - rows.accuracy_drop[best]
        parts.append(f"{study}: everything quantized -{everything * 100:.1f} points, {best} won back "
                     f"{won * 100:.1f}" + (" (chance)" if won <= noise else ""))
    return (f"Validation accuracy of fp32 {fp32:.1%}, chance up to {noise * 100:.1f} points; " + "; ".join(parts)
            + ".")

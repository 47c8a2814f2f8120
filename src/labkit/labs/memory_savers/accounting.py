"""Section 1 of notebook 03: the bytes-per-parameter calculator against a measured step, and at scale."""

from __future__ import annotations

import math

import pandas as pd
import torch

from ...capacity import model_training_memory, step_memory, training_memory
from ...config import RunConfig
from ...display import number
from ...errors import ConfigError
from ...labresult import LabResult
from ...messages import worded
from ...runsetup import set_up
from ...units import GB, GIB, TB, TIB
from ...validate import is_number

# The CUDA caching allocator hands out memory in multiples of this many bytes, so a tensor occupies up to
# 511 bytes more than its elements; labkit's tracker counts what was allocated.
CUDA_ROUNDING_BYTES = 512


def calculator_check(cfg: RunConfig) -> LabResult:
    """`model_training_memory` (fp32: autocast keeps fp32 weights) against one measured step of ``cfg``."""
    measured = step_memory(cfg, cfg.batch_size).breakdown.peak_by_category
    s = set_up(cfg.replace(evaluate=False, pretrained=False), techniques=True)
    calculated = model_training_memory(s.model, "fp32", cfg.optimizer, device=s.device,
                                       momentum=cfg.momentum > 0 if cfg.optimizer == "sgd" else True)
    allowance = rounding_allowance(s.model, cfg.optimizer, cfg.momentum > 0, s.device)
    rows = [{"component": component, "calculated_bytes": calculated[component],
             "measured_bytes": measured.get(category, 0),
             "difference_bytes": measured.get(category, 0) - calculated[component],
             "rounding_bytes": allowance[component]}
            for component, category in (("weights", "parameters"), ("gradients", "gradients"),
                                        ("optimizer_state", "optimizer_state"))]
    return LabResult(pd.DataFrame(rows))


def rounding_allowance(model, optimizer: str, momentum: bool, device) -> dict:
    """The most bytes the CUDA allocator's rounding can add to each component: 511 per tensor (0 on a CPU)."""
    if torch.device(device).type != "cuda":
        return {"weights": 0, "gradients": 0, "optimizer_state": 0}
    trainable = sum(p.requires_grad for p in model.parameters())
    # optimizer tensors per trainable one; 8-bit AdamW: two states and two block scales (an upper bound)
    per_param = {"adamw": 2, "adamw8bit": 4, "paged_adamw8bit": 4, "sgd": 1 if momentum else 0}[optimizer]
    per_tensor = CUDA_ROUNDING_BYTES - 1
    return {"weights": per_tensor * (len(list(model.parameters())) + len(list(model.buffers()))),
            "gradients": per_tensor * trainable, "optimizer_state": per_tensor * per_param * trainable}


class ScaleTable(LabResult):
    shown = ("setup", "weights_bytes", "gradients_bytes", "optimizer_state_bytes", "master_weights_bytes",
             "bytes_per_param", "total_bytes")


def scale_table(num_params: dict | None = None, setups: dict | None = None, columns=None) -> ScaleTable:
    """`training_memory` for each model (label -> parameters) and setup (label -> its keywords)."""
    num_params = num_params or {"7B": 7e9, "175B": 175e9}
    setups = setups or {
        "fp32 + AdamW": {"precision": "fp32", "optimizer": "adamw"},
        "mixed (fp16 + master) + AdamW": {"precision": "fp16", "optimizer": "adamw"},
        "mixed (fp16 + master) + 8-bit AdamW": {"precision": "fp16", "optimizer": "adamw8bit"},
        "pure bf16 + 8-bit AdamW": {"precision": "bf16", "optimizer": "adamw8bit", "master_weights": False},
    }
    rows = []
    for label, count in num_params.items():
        for setup, kwargs in setups.items():
            memory = training_memory(count, **kwargs)
            rows.append({"model": label, "num_params": count, "setup": setup,
                         **{f"{k}_bytes": v for k, v in memory.items()}, "bytes_per_param": memory["total"] / count,
                         "total_gb": memory["total"] / GB, "total_gib": memory["total"] / GIB,
                         "optimizer_state_gb": memory["optimizer_state"] / GB})
    return ScaleTable(pd.DataFrame(rows), columns=columns)


@worded
def optimizer_claim(num_params: float = 175e9, claimed_tb: tuple[float, float] = (1.2, 0.3)) -> str:
    """A claim "8-bit Adam takes optimizer memory from A TB to B TB" read as TB, TiB, and TB with fp32 masters."""
    if not is_number(num_params) or num_params <= 0:
        raise ConfigError("num_params", num_params, "a number of parameters > 0 (e.g. 175e9)")
    if (not isinstance(claimed_tb, tuple) or len(claimed_tb) != 2
            or not all(is_number(v) and v > 0 for v in claimed_tb)):
        raise ConfigError("claimed_tb", claimed_tb, "a pair of positive numbers (before, after), in TB")
    fp32 = training_memory(num_params, optimizer="adamw")["optimizer_state"]
    eight = training_memory(num_params, optimizer="adamw8bit")["optimizer_state"]
    master = 4 * num_params
    before, after = claimed_tb
    readings = {"TB": (fp32 / TB, eight / TB), "TiB": (fp32 / TIB, eight / TIB),
                "TB with master weights": ((fp32 + master) / TB, (eight + master) / TB)}

    def close(value, claimed):  # the claim's precision: its numbers are given to one decimal
        return abs(value - claimed) <= 0.05 + 1e-9 or math.floor(value * 10) / 10 == claimed

    matches = [name for name, (a, b) in readings.items() if close(a, before) and close(b, after)]
    claim = f"{before:g} TB -> {after:g} TB"
    if matches == ["TiB"]:
        verdict = f"the claim's {claim} are the TiB figures, rounded down and labelled TB"
    elif matches:
        verdict = f"the claim's {claim} match when read as {' or '.join(matches)}"
    else:
        verdict = f"the claim's {claim} match none of these readings"
    return (f"{num_params / 1e9:g}B parameters: AdamW's moments {number(fp32 / TB)} TB ({number(fp32 / TIB)} TiB), "
            f"8-bit AdamW's {number(eight / TB)} TB ({number(eight / TIB)} TiB), {number(fp32 / eight)}x less; "
            f"{verdict}. With fp32 master weights: {number((fp32 + master) / TB)} TB -> "
            f"{number((eight + master) / TB)} TB, {number((fp32 + master) / (eight + master))}x less.")

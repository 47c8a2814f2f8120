"""Section 1 of notebook 03: the bytes-per-parameter calculator (`labkit.capacity.training_memory`) checked
against a measured step, applied to large models, and a popular claim about 8-bit Adam computed."""

from __future__ import annotations

import math

import pandas as pd
import torch

from ... import train
from ...capacity import model_training_memory, step_memory, training_memory
from ...config import RunConfig
from ...display import number
from ...errors import ConfigError
from ...messages import worded
from ...units import GB, GIB, TB, TIB
from ...validate import is_number

# The CUDA caching allocator hands out memory in multiples of this many bytes, so a tensor occupies up to
# 511 bytes more than its elements; labkit's tracker counts what was allocated.
CUDA_ROUNDING_BYTES = 512


def calculator_check(cfg: RunConfig):
    """The calculator (`model_training_memory`) against one measured training step (`step_memory`) of ``cfg``.

    Args:
        cfg: the run; an autocast run (fp16/bf16) keeps fp32 weights, so it is computed as fp32.

    Returns:
        ``component`` (weights, gradients, optimizer_state), ``calculated_bytes``, ``measured_bytes``,
        ``difference_bytes``, and ``rounding_bytes``: how much more the measurement may hold because the CUDA
        allocator rounds every tensor up to a multiple of 512 bytes (0 on a CPU, see `rounding_allowance`).

    Example:
        >>> calculator_check(cfg.replace(optimizer="adamw8bit"))
    """
    measured = step_memory(cfg, cfg.batch_size).breakdown.peak_by_category
    trainer = train.Trainer(cfg.replace(evaluate=False, pretrained=False))
    calculated = model_training_memory(trainer.model, "fp32", cfg.optimizer, device=trainer.device,
                                       momentum=cfg.momentum > 0 if cfg.optimizer == "sgd" else True)
    allowance = rounding_allowance(trainer.model, cfg.optimizer, cfg.momentum > 0, trainer.device)
    rows = []
    for component, category in (("weights", "parameters"), ("gradients", "gradients"),
                                ("optimizer_state", "optimizer_state")):
        rows.append({"component": component, "calculated_bytes": calculated[component],
                     "measured_bytes": measured.get(category, 0),
                     "difference_bytes": measured.get(category, 0) - calculated[component],
                     "rounding_bytes": allowance[component]})
    return pd.DataFrame(rows)


def rounding_allowance(model, optimizer: str, momentum: bool, device) -> dict:
    """The most bytes the CUDA allocator's rounding can add to each component of ``model``'s training state.

    511 bytes per tensor (`CUDA_ROUNDING_BYTES` - 1); 0 on a CPU, which allocates exactly. Optimizer tensors per
    trainable parameter: AdamW 2; 8-bit AdamW 4 (two states, two block scales: an upper bound); SGD 1 or 0.

    Args:
        model: the model trained. optimizer: its name. momentum: SGD with momentum. device: where it trains.

    Example:
        >>> rounding_allowance(model, "adamw", True, "cuda")["optimizer_state"]   # 2 x 511 x tensors
    """
    if torch.device(device).type != "cuda":
        return {"weights": 0, "gradients": 0, "optimizer_state": 0}
    trainable = sum(p.requires_grad for p in model.parameters())
    per_param = {"adamw": 2, "adamw8bit": 4, "paged_adamw8bit": 4, "sgd": 1 if momentum else 0}[optimizer]
    per_tensor = CUDA_ROUNDING_BYTES - 1
    return {"weights": per_tensor * (len(list(model.parameters())) + len(list(model.buffers()))),
            "gradients": per_tensor * trainable, "optimizer_state": per_tensor * per_param * trainable}


def scale_table(num_params: dict | None = None, setups: dict | None = None):
    """`training_memory` for large models: bytes, GB and bytes per parameter by component.

    Args:
        num_params: label -> parameter count (default 7B and 175B).
        setups: label -> `training_memory` keyword arguments (default: fp32 + AdamW, mixed precision with
            master weights + AdamW (ZeRO's 16 bytes), the same with 8-bit AdamW, and pure bf16 + 8-bit AdamW).

    Example:
        >>> scale_table()[["model", "setup", "bytes_per_param", "total_gb"]]
    """
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
            row = {"model": label, "num_params": count, "setup": setup}
            row.update({f"{k}_bytes": v for k, v in memory.items()})
            row.update(bytes_per_param=memory["total"] / count, total_gb=memory["total"] / GB,
                       total_gib=memory["total"] / GIB, optimizer_state_gb=memory["optimizer_state"] / GB)
            rows.append(row)
    return pd.DataFrame(rows)


@worded
def optimizer_claim(num_params: float = 175e9, claimed_tb: tuple[float, float] = (1.2, 0.3)) -> str:
    """Check a claim "optimizer memory goes from A TB to B TB with 8-bit Adam" for ``num_params``, in one line.

    Args:
        num_params: the model's parameters (e.g. 175e9).
        claimed_tb: the claim's (before, after), in TB; read as TB, TiB, and TB with fp32 master weights.

    Example:
        >>> print(optimizer_claim(175e9, (1.2, 0.3)))
    """
    if not is_number(num_params) or num_params <= 0:
        raise ConfigError("num_params", num_params, "a number of parameters > 0 (e.g. 175e9)")
    if (not isinstance(claimed_tb, tuple) or len(claimed_tb) != 2
            or not all(is_number(v) and v > 0 for v in claimed_tb)):
        raise ConfigError("claimed_tb", claimed_tb, "a pair of positive numbers (before, after), in TB")
    fp32 = training_memory(num_params, optimizer="adamw")["optimizer_state"]
    eight = training_memory(num_params, optimizer="adamw8bit")["optimizer_state"]
    master = 4 * num_params
    before, after = claimed_tb
    readings = {
        "TB": (fp32 / TB, eight / TB),
        "TiB": (fp32 / TIB, eight / TIB),
        "TB with master weights": ((fp32 + master) / TB, (eight + master) / TB),
    }

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

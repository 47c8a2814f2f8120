"""Section 3 of notebook 03: bitsandbytes' 8-bit AdamW tensor by tensor, and why tensors with fewer than
``min_8bit_size`` elements keep 32-bit state; the exercise's numbers from the learner's own model."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch
from torch import nn

from ... import models
from ...capacity import training_memory
from ...display import number
from ...messages import worded
from ...techniques.optimizers import MIN_8BIT_SIZE

BNB_BLOCK = 256  # bitsandbytes' block size for 8-bit optimizer state: one fp32 scale per 256 values


def _storage_key(tensor: torch.Tensor) -> tuple:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def optimizer_state_table(optimizer: torch.optim.Optimizer, model: nn.Module | None = None):
    """The optimizer's state tensor by tensor: what each parameter tensor costs, and in which dtype.

    Args:
        optimizer: a torch or bitsandbytes optimizer after at least one step.
        model: names the tensors (default: ``param 0``, ``param 1``, ...).

    Returns:
        ``tensor``, ``numel``, ``state_dtype`` (float32, or uint8 for 8-bit state), ``state_bytes``,
        ``bytes_per_param``, and for bitsandbytes ``below_min_8bit_size``. State shared by all tensors (the
        quantisation maps) is a last row with ``numel`` 0: ``state_bytes`` sums to `measure.optimizer_state_bytes`.

    Example:
        >>> optimizer_state_table(trainer.optimizer, trainer.model)
    """
    names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
    min_size = getattr(getattr(optimizer, "args", None), "min_8bit_size", None)
    counts: dict[tuple, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                counts[_storage_key(value)] = counts.get(_storage_key(value), 0) + 1
    rows, shared, shared_seen = [], 0, set()
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            own = 0
            dtype = None
            for key, value in state.items():
                if not torch.is_tensor(value):
                    continue
                storage = _storage_key(value)
                if counts[storage] > 1:  # shared between tensors: counted once, in the last row
                    if storage not in shared_seen:
                        shared_seen.add(storage)
                        shared += value.untyped_storage().nbytes()
                    continue
                own += value.untyped_storage().nbytes()
                if key in ("exp_avg", "state1", "momentum_buffer"):
                    dtype = str(value.dtype).replace("torch.", "")
            row = {"tensor": names.get(id(p), f"param {index}"), "numel": p.numel(), "state_dtype": dtype,
                   "state_bytes": own, "bytes_per_param": own / p.numel() if p.numel() else math.nan}
            if min_size is not None:
                row["below_min_8bit_size"] = p.numel() < min_size
            rows.append(row)
            index += 1
    if shared:
        row = {"tensor": "(shared: quantisation maps)", "numel": 0, "state_dtype": "float32",
               "state_bytes": shared, "bytes_per_param": math.nan}
        if min_size is not None:
            row["below_min_8bit_size"] = None
        rows.append(row)
    frame = pd.DataFrame(rows)
    if min_size is not None:
        frame["below_min_8bit_size"] = frame["below_min_8bit_size"].astype("boolean")  # NA on the shared row
    return frame


def eight_bit_savings(model_names: Iterable[str] | None = None, min_8bit_size: int = MIN_8BIT_SIZE,
                      num_classes: int = 10):
    """Optimizer state of AdamW and 8-bit AdamW per model, computed from its tensor sizes (no training).

    Args:
        model_names: models of `labkit.models.build` (default: all). min_8bit_size: bitsandbytes' threshold.
        num_classes: the models' output classes.

    Returns:
        ``model``, ``num_params``, ``params_below_min_8bit_size`` and its ``below_min_8bit_share``,
        ``min_8bit_size``, ``adamw_state_bytes``, ``adamw8bit_state_bytes``, ``state_ratio`` (8-bit / AdamW),
        8-bit ``bytes_per_param``.

    Example:
        >>> eight_bit_savings(["small_cnn", "resnet18"])
    """
    rows = []
    for name in list(models.available() if model_names is None else model_names):
        model = models.build(name, num_classes, pretrained=False)[0]
        sizes = [p.numel() for p in model.parameters() if p.requires_grad]
        total = sum(sizes)
        adamw = training_memory(total, optimizer="adamw")["optimizer_state"]
        eight = training_memory(total, optimizer="adamw8bit", tensor_sizes=sizes,
                                min_8bit_size=min_8bit_size)["optimizer_state"]
        below = sum(n for n in sizes if n < min_8bit_size)
        rows.append({"model": name, "num_params": total, "params_below_min_8bit_size": below,
                     "below_min_8bit_share": below / total, "min_8bit_size": min_8bit_size, "adamw_state_bytes": adamw,
                     "adamw8bit_state_bytes": eight, "state_ratio": eight / adamw, "bytes_per_param": eight / total})
    return pd.DataFrame(rows)


BNB_BLOCK = 256  # bitsandbytes' block size for 8-bit optimizer state: one fp32 scale per 256 values


def eight_bit_numbers(state: pd.DataFrame, min_8bit_size: int = MIN_8BIT_SIZE) -> dict:
    """Your own numbers for exercise ``03.own_8bit``, from `optimizer_state_table` of an 8-bit optimizer.

    Args:
        state: the table. min_8bit_size: bitsandbytes' threshold for 8-bit state.
    """
    tensors = state[state["numel"] > 0]
    small = tensors["numel"] < min_8bit_size
    return {"numel_large": int(tensors.loc[~small, "numel"].sum()),
            "numel_small": int(tensors.loc[small, "numel"].sum()), "min_8bit_size": min_8bit_size, "block": BNB_BLOCK}


def state_summary(state: pd.DataFrame) -> pd.DataFrame:
    """`optimizer_state_table`'s rows summed by kind: tensors with 8-bit state, with fp32 state, shared maps.

    Args:
        state: an `optimizer_state_table` frame of a bitsandbytes optimizer (with ``below_min_8bit_size``).

    Returns:
        ``kind``, ``tensors``, ``num_params``, ``state_bytes``, ``bytes_per_param``.
    """
    kinds = {False: "at least min_8bit_size: 8-bit state", True: "under min_8bit_size: fp32 state"}
    rows = []
    for small, label in kinds.items():
        part = state[state["numel"].gt(0) & state["below_min_8bit_size"].eq(small).fillna(False)]
        numel, nbytes = int(part["numel"].sum()), int(part["state_bytes"].sum())
        rows.append({"kind": label, "tensors": len(part), "num_params": numel, "state_bytes": nbytes,
                     "bytes_per_param": nbytes / numel if numel else math.nan})
    shared = state[state["numel"] == 0]
    if len(shared):
        rows.append({"kind": "shared quantisation maps", "tensors": None, "num_params": 0,
                     "state_bytes": int(shared["state_bytes"].sum()), "bytes_per_param": math.nan})
    return pd.DataFrame(rows)


@worded
def eight_bit_finding(numbers: dict, state: pd.DataFrame) -> str:
    """The state the exercise's arithmetic gives beside what the optimizer really holds, in one line.

    Args:
        numbers: `eight_bit_numbers`' dict. state: the `optimizer_state_table` it came from.
    """
    computed = numbers["numel_large"] * 2 * (1 + 4 / numbers["block"]) + numbers["numel_small"] * 8
    measured = int(state["state_bytes"].sum())
    shared = int(state.loc[state["numel"] == 0, "state_bytes"].sum())
    rest = measured - shared - round(computed)
    tail = ("the rest matches the arithmetic exactly" if rest == 0 else
            f"the other {rest:+} bytes are block counts rounded up to whole blocks")
    return (f"The arithmetic gives {number(computed / 1024)} KiB; the optimizer holds {number(measured / 1024)} KiB "
            f"({measured / computed - 1:+.1%}): {number(shared / 1024)} KiB are the quantisation maps shared by all "
            f"tensors, and {tail}.")

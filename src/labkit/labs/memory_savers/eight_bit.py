"""Section 3 of notebook 03: bitsandbytes' 8-bit AdamW state, tensor by tensor and per model."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch
from torch import nn

from ... import models
from ...capacity import training_memory
from ...display import number
from ...labresult import LabResult
from ...messages import worded
from ...techniques.optimizers import BNB_BLOCK_SIZE, MIN_8BIT_SIZE


def _storage_key(tensor: torch.Tensor) -> tuple:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


class OptimizerState(LabResult):
    """An optimizer's state by tensor; a last row with ``numel`` 0 holds the state shared by all."""

    shown = ("tensor", "numel", "state_dtype", "state_bytes", "bytes_per_param")

    def tensors(self, small: bool) -> pd.DataFrame:
        return self.frame[self.frame["numel"].gt(0) & self.frame["below_min_8bit_size"].eq(small).fillna(False)]

    def summary(self) -> pd.DataFrame:
        """The rows summed by kind of state."""
        rows = []
        for small, label in ((False, "at least min_8bit_size: 8-bit state"), (True, "under min_8bit_size: fp32 state")):
            part = self.tensors(small)
            numel, nbytes = int(part["numel"].sum()), int(part["state_bytes"].sum())
            rows.append({"kind": label, "tensors": len(part), "num_params": numel, "state_bytes": nbytes,
                         "bytes_per_param": nbytes / numel if numel else math.nan})
        shared = int(self.frame.loc[self.frame["numel"] == 0, "state_bytes"].sum())
        if shared:
            rows.append({"kind": "shared quantisation maps", "tensors": None, "num_params": 0, "state_bytes": shared,
                         "bytes_per_param": math.nan})
        return pd.DataFrame(rows)

    def numbers(self, min_8bit_size: int = MIN_8BIT_SIZE) -> dict:
        """Exercise ``03.own_8bit``'s numbers."""
        tensors = self.frame[self.frame["numel"] > 0]
        small = tensors["numel"] < min_8bit_size
        return {"numel_large": int(tensors.loc[~small, "numel"].sum()),
                "numel_small": int(tensors.loc[small, "numel"].sum()), "min_8bit_size": min_8bit_size,
                "block": BNB_BLOCK_SIZE}

    @worded
    def finding(self) -> str:
        if "below_min_8bit_size" not in self.frame:
            return ""
        n = self.numbers()
        computed = n["numel_large"] * 2 * (1 + 4 / n["block"]) + n["numel_small"] * 8
        measured = int(self.frame["state_bytes"].sum())
        shared = int(self.frame.loc[self.frame["numel"] == 0, "state_bytes"].sum())
        rest = measured - shared - round(computed)
        tail = ("the rest matches the arithmetic exactly" if rest == 0 else
                f"the other {rest:+} bytes are block counts rounded up to whole blocks")
        return (f"The arithmetic gives {number(computed / 1024)} KiB; the optimizer holds {number(measured / 1024)} "
                f"KiB ({measured / computed - 1:+.1%}): {number(shared / 1024)} KiB are the quantisation maps shared "
                f"by all tensors, and {tail}.")


def optimizer_state_table(optimizer: torch.optim.Optimizer, model: nn.Module | None = None) -> OptimizerState:
    """A torch or bitsandbytes optimizer's state after a step, tensor by tensor (named from ``model``)."""
    names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
    min_size = getattr(getattr(optimizer, "args", None), "min_8bit_size", None)
    counts: dict[tuple, int] = {}
    for value in (v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)):
        counts[_storage_key(value)] = counts.get(_storage_key(value), 0) + 1
    rows, shared = [], {}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, p in enumerate(params):
        own, dtype = 0, None
        for key, value in ((k, v) for k, v in optimizer.state.get(p, {}).items() if torch.is_tensor(v)):
            if counts[_storage_key(value)] > 1:  # shared between tensors: counted once, in the last row
                shared[_storage_key(value)] = value.untyped_storage().nbytes()
                continue
            own += value.untyped_storage().nbytes()
            if key in ("exp_avg", "state1", "momentum_buffer"):
                dtype = str(value.dtype).replace("torch.", "")
        rows.append({"tensor": names.get(id(p), f"param {index}"), "numel": p.numel(), "state_dtype": dtype,
                     "state_bytes": own, "bytes_per_param": own / p.numel() if p.numel() else math.nan,
                     **({} if min_size is None else {"below_min_8bit_size": p.numel() < min_size})})
    if shared:
        rows.append({"tensor": "(shared: quantisation maps)", "numel": 0, "state_dtype": "float32",
                     "state_bytes": sum(shared.values()), "bytes_per_param": math.nan,
                     **({} if min_size is None else {"below_min_8bit_size": None})})
    frame = pd.DataFrame(rows)
    if min_size is not None:
        frame["below_min_8bit_size"] = frame["below_min_8bit_size"].astype("boolean")  # NA on the shared row
    return OptimizerState(frame)


def eight_bit_savings(model_names: Iterable[str] | None = None, min_8bit_size: int = MIN_8BIT_SIZE,
                      num_classes: int = 10) -> LabResult:
    """AdamW's and 8-bit AdamW's state per model (default: all), from its tensor sizes."""
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
    return LabResult(pd.DataFrame(rows), columns=["model", "num_params", "below_min_8bit_share", "adamw_state_bytes",
                                                  "adamw8bit_state_bytes", "state_ratio", "bytes_per_param"])

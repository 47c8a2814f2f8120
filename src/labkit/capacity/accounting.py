"""Bytes per parameter: training memory computed for any parameter count (`training_memory`) or exactly for a
real model (`model_training_memory`): weights, gradients, optimizer state and master weights.

The components `training_memory` returns, with their ``total`` (activations are extra and grow with the batch):

- ``weights``: 4 bytes per parameter in fp32, 2 in fp16/bf16.
- ``gradients``: one per trainable parameter, in the weights' dtype.
- ``master_weights``: an fp32 copy of the trainable weights when the weights are half precision
  (``master_weights=None`` means yes for fp16/bf16): the optimizer updates the copy, and the half
  weights are rounded from it. ``master_weights=False`` is "pure" half-precision training.
- ``optimizer_state``: AdamW two moments in the dtype of the weights it updates (8 bytes per
  trainable parameter for fp32 or master weights, 4 for pure half weights); SGD one momentum buffer
  (none when ``momentum=False``); 8-bit AdamW (``adamw8bit``, ``paged_adamw8bit``) two uint8 moments
  plus an fp32 absmax per 256-value block for each (2 + 8/256 = 2.03 bytes per parameter) and 2 KiB
  of shared quantisation maps; tensors with fewer than ``min_8bit_size`` elements keep fp32 moments
  (8 bytes), which only ``tensor_sizes`` can account for (without it every tensor counts as large).
  Paged state has the same size; it can be paged out to CPU memory.

Two conventions for "mixed precision": ``torch.autocast`` (what labkit's ``precision="bf16"`` runs)
keeps the weights, gradients and optimizer state in fp32 and only computes in half precision, so
describe it here as ``precision="fp32"`` (4 + 4 + 8 = 16 bytes per parameter with AdamW; autocast
saves activation memory, not these). The classic recipe (Micikevicius et al. 2018) and the ZeRO paper
keep fp16 weights and gradients plus an fp32 master copy: 2 + 2 + (4 + 8) = 16 bytes per parameter
(``training_memory(7e9, "bf16", "adamw")``; ZeRO counts the master copy as optimizer state, "12 bytes"):
the same total, split differently. Not counted: AdamW's per-tensor step counters (4 bytes each) and
allocator overhead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from ..choices import check_optimizer
from ..errors import ConfigError
from ..techniques.optimizers import BNB_BLOCK_SIZE, BNB_QMAP_BYTES, MIN_8BIT_SIZE
from ..validate import is_int, is_number

WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


COMPONENTS = ("weights", "gradients", "optimizer_state", "master_weights")


def _eight_bit_state_bytes(sizes: list[int], min_8bit_size: int) -> int:
    total, any_8bit = 0, False
    for n in sizes:
        if n < min_8bit_size:
            total += 8 * n  # two fp32 moments
        else:
            any_8bit = True
            total += 2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK_SIZE)  # two uint8 moments, an fp32 absmax per block each
    return total + (BNB_QMAP_BYTES if any_8bit else 0)


def training_memory(num_params: int | float, precision: str = "fp32", optimizer: str = "adamw",
                    master_weights: bool | None = None, trainable_params: int | float | None = None,
                    tensor_sizes: Iterable[int] | None = None, min_8bit_size: int = MIN_8BIT_SIZE,
                    momentum: bool = True) -> dict:
    """Training memory that does not depend on the batch, in bytes per component (see the module docstring).

    Args:
        num_params: the model's parameters (a count; 7e9 is fine).
        precision: dtype of the stored weights: ``fp32``, ``fp16`` or ``bf16``.
        optimizer: ``adamw``, ``sgd``, ``adamw8bit`` or ``paged_adamw8bit``.
        master_weights: keep an fp32 master copy (default: yes for half-precision weights, never for fp32).
        trainable_params: parameters that get gradients and optimizer state (default all).
        tensor_sizes: element counts of the trainable tensors, for the exact 8-bit accounting.
        min_8bit_size: bitsandbytes' threshold (default 4096).
        momentum: SGD keeps a momentum buffer (labkit's default momentum is 0.9).

    Example:
        >>> training_memory(7e9, optimizer="adamw")["total"] / 1e9   # fp32 + AdamW: 16 bytes/param
        112.0
    """
    if not is_number(num_params) or num_params <= 0:
        raise ConfigError("num_params", num_params, "a number of parameters > 0 (e.g. 7e9)")
    if precision not in WEIGHT_BYTES:
        raise ConfigError("precision", precision, f"one of {list(WEIGHT_BYTES)} (the dtype of the stored weights)",
                          "torch.autocast keeps fp32 weights: describe an autocast run as 'fp32'")
    check_optimizer(optimizer)
    if master_weights not in (None, True, False):
        raise ConfigError("master_weights", master_weights, "None (the default for the precision), True or False")
    if precision == "fp32" and master_weights:
        raise ConfigError("master_weights", master_weights, "None or False with precision='fp32'",
                          "fp32 weights are their own master copy")
    trainable = num_params if trainable_params is None else trainable_params
    if not is_number(trainable) or not 0 <= trainable <= num_params:
        raise ConfigError("trainable_params", trainable_params, f"None or a number from 0 to num_params={num_params:g}")
    if not is_int(min_8bit_size) or min_8bit_size < 0:
        raise ConfigError("min_8bit_size", min_8bit_size, "an integer >= 0")
    if not isinstance(momentum, bool):
        raise ConfigError("momentum", momentum, "True or False")
    if optimizer != "sgd" and momentum is not True:
        raise ConfigError("momentum", momentum, "True (the default) unless optimizer='sgd'",
                          f"{optimizer} has no momentum setting")
    sizes = None
    if tensor_sizes is not None:
        sizes = list(tensor_sizes)
        if not all(is_int(n) and n >= 0 for n in sizes) or sum(sizes) != trainable:
            summed = sum(sizes) if all(map(is_int, sizes)) else "?"
            raise ConfigError("tensor_sizes", f"{len(sizes)} sizes summing to {summed}",
                              f"element counts (integers >= 0) of the trainable tensors, summing to {trainable:g}")
    half = WEIGHT_BYTES[precision] == 2
    master = half if master_weights is None else master_weights
    weight_bytes = WEIGHT_BYTES[precision]
    updated_bytes = 4 if (master or not half) else weight_bytes  # dtype of the weights the optimizer updates
    if optimizer == "adamw":
        state = 2 * updated_bytes * trainable
    elif optimizer == "sgd":
        state = updated_bytes * trainable if momentum else 0
    elif sizes is not None:
        state = _eight_bit_state_bytes(sizes, min_8bit_size)
    else:
        state = (2 * trainable + 2 * 4 * math.ceil(trainable / BNB_BLOCK_SIZE) + BNB_QMAP_BYTES) if trainable else 0
    out = {"weights": weight_bytes * num_params, "gradients": weight_bytes * trainable,
           "optimizer_state": state, "master_weights": 4 * trainable if master else 0}
    out = {k: int(round(v)) for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def model_training_memory(model: nn.Module, precision: str = "fp32", optimizer: str = "adamw",
                          master_weights: bool | None = None, device: torch.device | str = "cpu",
                          min_8bit_size: int = MIN_8BIT_SIZE, momentum: bool = True) -> dict:
    """`training_memory` for a real model, exact to the byte: what labkit's memory breakdown should measure.

    Uses the model's trainable tensor sizes (exact 8-bit accounting), adds its buffers (BatchNorm running
    statistics) to ``weights`` as labkit's ``parameters`` category does, and torch AdamW's 4-byte step
    counter per tensor when training on the CPU (on a GPU they stay on the CPU and are not GPU memory).

    Example:
        >>> model_training_memory(model, optimizer="adamw8bit")["optimizer_state"]
    """
    trainable = [p.numel() for p in model.parameters() if p.requires_grad]
    num_params = sum(p.numel() for p in model.parameters())
    out = training_memory(num_params, precision, optimizer, master_weights, trainable_params=sum(trainable),
                          tensor_sizes=trainable, min_8bit_size=min_8bit_size, momentum=momentum)
    out["weights"] += sum(b.numel() * b.element_size() for b in model.buffers())
    if optimizer == "adamw" and torch.device(device).type == "cpu":
        out["optimizer_state"] += 4 * len(trainable)
    out["total"] = sum(out[k] for k in COMPONENTS)
    return out

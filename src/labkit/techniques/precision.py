"""Mixed precision: which dtype a run uses, the autocast context and the GradScaler.

fp16 needs a GradScaler (small gradients underflow in fp16); bf16 has fp32's range and needs none.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..env import has_tensor_cores, native_bf16

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """What a run will use. ``requested`` is the config value, ``name`` what it resolved to."""

    requested: str
    name: str
    warning: str | None = None

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.name)

    @property
    def uses_scaler(self) -> bool:
        return self.name == "fp16"


def resolve_precision(requested: str, device: torch.device, capability: tuple[int, int] | None = None) -> Precision:
    """Resolve ``auto`` and flag bf16 that would be emulated.

    ``auto``: bf16 where it is native (CUDA capability >= 8.0), fp16 on tensor-core GPUs without it
    (T4, V100), fp32 elsewhere (P100, CPU).

    Example:
        >>> resolve_precision("auto", torch.device("cuda"), (7, 5)).name
        'fp16'
    """
    device = torch.device(device)
    if device.type == "cuda" and capability is None:
        capability = torch.cuda.get_device_capability(device)
    on_gpu = device.type == "cuda"
    if requested == "auto":
        if on_gpu and native_bf16(capability):
            return Precision(requested, "bf16")
        if on_gpu and has_tensor_cores(capability):
            return Precision(requested, "fp16")
        return Precision(requested, "fp32")
    if requested == "bf16" and on_gpu and not native_bf16(capability):
        major, minor = capability
        advice = ("fp16 with a GradScaler is the fast choice here" if has_tensor_cores(capability)
                  else "this GPU has no tensor cores either, so fp32 is usually the fastest here")
        return Precision(requested, "bf16", warning=(
            f"bf16 on a GPU of capability {major}.{minor} is emulated (native bf16 needs 8.0+, Ampere): "
            f"it runs, but slowly; {advice}"))
    if requested == "fp16" and on_gpu and not has_tensor_cores(capability):
        major, minor = capability
        return Precision(requested, "fp16", warning=(
            f"fp16 on a GPU of capability {major}.{minor} (no tensor cores, e.g. a P100) saves memory but "
            "is often no faster than fp32"))
    return Precision(requested, requested)


def autocast(precision: Precision, device: torch.device):
    """``torch.autocast`` for fp16/bf16, a no-op context for fp32."""
    if precision.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=precision.autocast_dtype)


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler enabled only for fp16 (a disabled one passes calls straight through)."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=precision.uses_scaler)

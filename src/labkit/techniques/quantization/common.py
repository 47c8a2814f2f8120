"""What every quantization path shares: the table of methods, checks of ``keep_float`` and calibration, `Cast`."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

import torch
from torch import nn

from ...choices import QUANTIZE_METHODS, QuantizeMethod, check_quantize_method
from ...errors import ConfigError
from ...project import torchao_requirement

TORCHAO_REQUIREMENT = "torchao>=0.12"  # the oldest in labkit.project.TORCHAO_FOR_TORCH (torch 2.5-2.7)
TORCHAO_TESTED = "0.18.0"  # the version labkit's tests run; older ones may lack a config or a kernel
# torchao is in no extra (each release is built for one torch): the release built for the installed torch.
INSTALL_HINT = (f"pip install '{torchao_requirement()}' (the torchao release built for this torch) and "
                "'bitsandbytes>=0.50', or the notebook's extra with it: pip install 'labkit-finetune[quant]'")

Method = QuantizeMethod  # one way to quantize a model; the table of them is `labkit.choices.QUANTIZE_METHODS`
METHODS = QUANTIZE_METHODS
CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Cast(nn.Module):
    """``model`` run in ``dtype``: inputs are cast in and outputs back to float32, so it drops into fp32 code."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model = model.to(dtype)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.to(self.dtype)).float()


def check_method(method: str) -> Method:
    """The method's row of `METHODS`, or `ConfigError` listing the methods (a simulated one is not a kernel)."""
    check_quantize_method(method)
    if method not in METHODS:  # a simulated method: no kernel, nothing to look up
        raise ConfigError("method", method, f"one of {list(METHODS)} (a simulated method rounds the weights only)")
    return METHODS[method]


def installed_version(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (the CPU for a model without any)."""
    return next(iter(model.parameters()), torch.empty(0)).device


def linear_names(model: nn.Module, keep_float: Iterable[str]) -> list[str]:
    """The names of the Linear layers outside ``keep_float``'s module names."""
    keep = tuple(keep_float)
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)
            and not any(name == k or name.startswith(k + ".") for k in keep)]


def check_keep_float(model: nn.Module, keep_float: Iterable[str]) -> tuple[str, ...]:
    """Module names (a name keeps everything under it) or layer types such as ``"LayerNorm"``."""
    keep = tuple(keep_float)
    names = {name for name, _ in model.named_modules()}
    types = {type(m).__name__ for m in model.modules()}
    bad = [k for k in keep if k not in names and k not in types]
    if bad:
        raise ConfigError("keep_float", bad, f"module names of the model (e.g. {sorted(names - {''})[:6]}) or "
                          f"layer types in it (e.g. {sorted(types)[:6]})")
    return keep


def split_keep(model: nn.Module, keep: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``keep`` split into (module names, layer type names)."""
    names = {name for name, _ in model.named_modules()}
    return [k for k in keep if k in names], [k for k in keep if k not in names]


def calibration_inputs(calibration, method: str) -> list[torch.Tensor]:
    """The input tensors of ``calibration`` (batches or (inputs, labels) pairs), or `ConfigError` on what to pass."""
    if calibration is None:
        raise ConfigError("calibration", None, f"a few batches of training inputs for {method!r} (it fixes the "
                          "activation ranges from them), e.g. labkit.labs.quantization.calibration_batches(cfg, 8)")
    batches = [b[0] if isinstance(b, (tuple, list)) else b for b in calibration]
    if not batches or not all(isinstance(b, torch.Tensor) for b in batches):
        raise ConfigError("calibration", type(calibration).__name__,
                          "a non-empty iterable of input tensors (or (inputs, labels) pairs)")
    return batches

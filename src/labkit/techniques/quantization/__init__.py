"""Quantization, the mechanism: store weights (and maybe activations) in fewer bits. One module per job:

- `affine`: affine quantization from scratch (`affine_qparams`, `quantize_affine`, `dequantize_affine`), the same
  numbers as torch's observers and `torch.quantize_per_tensor` / `quantize_per_channel`; `fake_quantize_weights`
  simulates any bit width (weights rounded, stored as floats) for sensitivity studies.
- `fx`: ``torch.ao.quantization``, deprecated since torch 2.10 (most existing code runs it): int8 dynamic
  (``quantize_dynamic``), static int8 in FX graph mode (``prepare_fx`` / ``convert_fx``), `prepare_qat` / `convert_qat`.
- `pt2e`: the flow that replaces FX graph mode, in torchao: ``torch.export``, ``prepare_pt2e`` with the x86
  quantizer, calibrate, ``convert_pt2e`` (`static_pt2e`), and `prepare_qat_pt2e` / `convert_qat_pt2e`.
- `with_torchao`: torchao's ``quantize_``: int8 dynamic, int8 and int4 weight-only. `with_bitsandbytes`: LLM.int8()
  and 4-bit NF4 (the QLoRA base). `common`: the method table, ``keep_float`` and calibration checks, `Cast`.
- here: `quantize(model, method, calibration=None)`, a quantized copy by one of `METHODS`, and
  `supported(method, device)` / `available(device)`: what runs here, and why not.

Methods whose kernels are x86 CPU ones (``int8_dynamic``, ``int8_static``: torch.ao's x86/fbgemm engine;
``int8_pt2e``: the x86 quantizer) return a CPU model; the others stay put.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from ... import machine, messages
from ...choices import SIMULATED_METHODS
from ...errors import ConfigError, UnsupportedError
from . import pt2e
from .affine import affine_qparams, dequantize_affine, fake_quantize_weights, quantize_affine
from .common import (
    CASTS,
    INSTALL_HINT,
    METHODS,
    TORCHAO_REQUIREMENT,
    TORCHAO_TESTED,
    Cast,
    Method,
    calibration_inputs,
    check_keep_float,
    check_method,
    installed_version,
    linear_names,
    model_device,
    split_keep,
)
from .fx import _silence_deprecations as _silence_deprecations
from .fx import convert_qat, module_int8_layers, prepare_qat
from .fx import dynamic as _dynamic
from .fx import static as _static
from .int8_matmul import INT_MM_METHODS, cpu_int_mm_error, inexact_int8_note
from .pt2e import (
    allow_train_eval,
    convert_qat_pt2e,
    export,
    graph_int8_layers,
    prepare_qat_pt2e,
    static_pt2e,
    x86_quantizer,
)
from .with_bitsandbytes import BNB_CPU_BLOCK_N
from .with_bitsandbytes import bnb_quantize as _bnb_quantize
from .with_torchao import INT4_GROUP_SIZES, INT4_PACKING, int4_config
from .with_torchao import torchao_quantize as _torchao_quantize

__all__ = [
    "BNB_CPU_BLOCK_N", "CASTS", "INSTALL_HINT", "INT4_GROUP_SIZES", "INT4_PACKING", "INT_MM_METHODS", "METHODS",
    "SIMULATED_METHODS", "TORCHAO_REQUIREMENT", "TORCHAO_TESTED", "Cast", "Method", "affine_qparams",
    "allow_train_eval", "available", "convert_qat", "convert_qat_pt2e", "cpu_int_mm_error", "dequantize_affine",
    "export", "fake_quantize_weights", "installed_version", "inexact_int8_note", "int4_config", "int8_layers",
    "prepare_qat", "prepare_qat_pt2e", "quantize", "quantize_affine", "static_pt2e", "supported", "x86_quantizer",
]
# The private names the rest of labkit and its tests reach for, under their old names; a test that monkeypatches
# `installed_version`, `supported` or `_torchao_quantize` here changes what `quantize` and `supported` call.
_check_method, _model_device, _linear_names = check_method, model_device, linear_names
_check_keep_float, _split_keep, _calibration_inputs = check_keep_float, split_keep, calibration_inputs


def supported(method: str, device: torch.device | str = "cpu") -> str | None:
    """None when ``method`` can run on ``device`` here, else why not (a sentence).

    Example:
        >>> supported("int4_weight_only", "cpu")
        "torchao's int4 weight-only kernels run on CUDA GPUs only ..."
    """
    spec = check_method(method)
    device = torch.device(device)
    if device.type not in spec.devices:
        if method == "int4_weight_only":
            return ("torchao's int4 weight-only kernels run on CUDA GPUs only (tinygemm, compute capability 8.0+); "
                    "for 4 bits on a CPU use 'nf4_bnb'")
        return f"{spec.api}'s {method} kernels run on {' and '.join(spec.devices)} only, not {device.type}"
    if device.type == "cpu" and method in ("int8_dynamic", "int8_static"):
        if not {"x86", "fbgemm", "qnnpack"} & set(torch.backends.quantized.supported_engines):
            return f"this torch build has no quantized CPU engine ({torch.backends.quantized.supported_engines})"
    if spec.api.startswith("torchao") and installed_version("torchao") is None:
        return f"torchao is not installed; {INSTALL_HINT}"
    if spec.api == "bitsandbytes" and installed_version("bitsandbytes") is None:
        return "bitsandbytes is not installed; pip install 'bitsandbytes>=0.50'"
    if method == pt2e.METHOD:
        return pt2e.problem()
    capability = machine.here().capability
    if method == "int4_weight_only" and capability < (8, 0):
        return (f"torchao's int4 kernels (tinygemm, on bf16 weights) need compute capability 8.0+; this GPU has "
                f"{'.'.join(map(str, capability))}, so for 4 bits use 'nf4_bnb'")
    return None


def int8_layers(model: nn.Module) -> list[str]:
    """The names of the layers whose weights ``model`` stores in int8: torch.ao's modules or a PT2E graph's.

    Example:
        >>> int8_layers(quantize(model, "int8_pt2e", batches)) == int8_layers(quantize(model, "int8_static", batches))
    """
    if isinstance(model, torch.fx.GraphModule) and graph_int8_layers(model):
        return graph_int8_layers(model)
    return module_int8_layers(model)


def available(device: torch.device | str = "cpu") -> list[str]:
    """The methods that can run on ``device`` here."""
    return [name for name in METHODS if supported(name, device) is None]


def quantize(model: nn.Module, method: str, calibration: Iterable | None = None,
             keep_float: Iterable[str] = ()) -> nn.Module:
    """A quantized copy of ``model`` (in eval mode; ``model`` itself is left alone).

    Args:
        model: any float32 model (labkit's or your own).
        method: one of `METHODS`, or a `SIMULATED_METHODS` name (weights rounded, kept in float32).
        calibration: training batches of inputs (or (inputs, labels) pairs); for ``int8_static`` and ``int8_pt2e``.
        keep_float: module names (e.g. ``"stem"``, ``"head"``) or layer types (``"LayerNorm"``) to leave in float.

    Raises:
        ConfigError: an unknown method, static quantization without calibration, a bad keep_float name.
        UnsupportedError: a method this device or installation cannot run (e.g. 4-bit torchao on a CPU).

    Example:
        >>> small = quantize(model, "int8_dynamic")
        >>> labkit.measure.model_size_bytes(small) / labkit.measure.model_size_bytes(model)
    """
    if method in SIMULATED_METHODS:
        if calibration is not None:
            raise ConfigError("calibration", type(calibration).__name__, f"None: {method!r} uses no calibration data")
        return fake_quantize_weights(model, SIMULATED_METHODS[method], keep_float=keep_float).eval()
    spec = check_method(method)
    device = model_device(model)
    target = device if device.type in spec.devices else torch.device("cpu")
    reason = supported(method, target)
    if reason:
        raise UnsupportedError("method", method, reason, ", ".join(available(device)))
    if spec.calibration:
        # once (a loader's iterator is consumed), before any work
        calibration = calibration_inputs(calibration, method)
    elif calibration is not None:
        raise ConfigError("calibration", type(calibration).__name__, f"None: {method!r} uses no calibration data "
                          "(only int8_static and int8_pt2e do)")
    keep = check_keep_float(model, keep_float)
    if keep and method in ("fp32", *CASTS):
        raise ConfigError("keep_float", list(keep), f"empty for {method!r}, which casts or keeps the whole model")
    copied = copy.deepcopy(model).eval()
    if method == "fp32":
        return copied
    if method in CASTS:
        return Cast(copied, CASTS[method]).eval()
    names = linear_names(copied, split_keep(copied, keep)[0])
    if spec.linear_only and not names:
        raise ConfigError("model", type(model).__name__, f"a model with Linear layers outside keep_float: {method!r} "
                          "quantizes only Linear layers")
    if method == "int8_dynamic":
        return _dynamic(copied, names)
    if method == "int8_static":
        return _static(copied, calibration, keep).eval()
    if method == "int8_pt2e":  # an exported graph: its train/eval switch is torchao's, and it is in eval already
        return static_pt2e(copied, calibration, keep)
    if method == "int4_weight_only":  # tinygemm takes bf16 weights: a bf16 copy, fed and read in float32
        cast = Cast(copied.to(target), torch.bfloat16)
        cast.model = _torchao_quantize(cast.model, method, names)
        return cast.eval()
    if target.type == "cpu" and (warning := inexact_int8_note(method)):
        messages.note(warning)
    if spec.api == "torchao":
        return _torchao_quantize(copied.to(target), method, names).eval()
    return _bnb_quantize(copied.to(target), method, names)

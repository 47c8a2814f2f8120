"""Quantization, the mechanism: store weights (and maybe activations) in fewer bits.

- `affine_qparams`, `quantize_affine`, `dequantize_affine`: affine quantization from scratch,
  ``q = clamp(round(x / scale) + zero_point)``, symmetric or asymmetric, per tensor or per channel; the
  same numbers as torch's observers and `torch.quantize_per_tensor` / `torch.quantize_per_channel`.
- `quantize(model, method, calibration=None)`: a quantized copy by one of `METHODS`: casts (fp16, bf16), int8
  dynamic through the deprecated `torch.ao.quantization.quantize_dynamic` (what most tutorials use) and torchao's
  `quantize_`, int8 and int4 weight-only (torchao), static int8 with calibration (`torch.ao` FX graph mode),
  bitsandbytes' `Linear8bitLt` and 4-bit NF4 (the QLoRA base).
- `fake_quantize_weights`: any bit width, simulated (weights rounded, stored as floats): what accuracy a
  3- or 4-bit model would have, for sensitivity studies.
- `prepare_qat`, `convert_qat`: quantization-aware training: fake-quantize while fine-tuning, then convert.
- `supported(method, device)`: None when ``method`` runs on ``device`` here, else why not.

``int8_static`` needs ``calibration`` (each activation's range). Methods whose kernels run on the CPU only
(``int8_dynamic``, ``int8_static``: torch.ao's x86/fbgemm engine) return a CPU model; the others stay put.

``torch.ao.quantization`` is deprecated since torch 2.10 and warns on every use; labkit uses it on purpose (most
existing code runs it) and, once this module is imported, silences exactly those deprecation warnings.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import logging
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from .. import machine
from ..choices import QUANTIZE_METHODS, SIMULATED_METHODS, QuantizeMethod, check_quantize_method
from ..env import import_bitsandbytes
from ..errors import ConfigError, UnsupportedError

TORCHAO_REQUIREMENT = "torchao>=0.10"
TORCHAO_TESTED = "0.18.0"  # the version labkit's tests run; older ones may lack a config or a kernel
INSTALL_HINT = "install the notebook's extra: pip install 'labkit-finetune[quant]'"
# torch.ao's deprecation notices: one when a submodule is imported, and one whenever a quantized tensor is
# created, which a statically quantized model does in every forward. Only these are silenced, for the
# whole session (a notebook would otherwise show a warning box under every cell that runs such a model).
_DEPRECATIONS = (r"torch\.ao\.quantization is deprecated", r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
                 r"Please use quant_min and quant_max to specify the range for observers")


def _silence_deprecations() -> None:
    for message in _DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message)


_silence_deprecations()


# --- the mechanism from scratch ------------------------------------------------------------------


def _range(bits: int, symmetric: bool) -> tuple[int, int]:
    """The integer range: signed [-2^(b-1), 2^(b-1) - 1] when symmetric, unsigned [0, 2^b - 1] otherwise
    (the ranges of torch's qint8 and quint8 for 8 bits)."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 16:
        raise ConfigError("bits", bits, "an integer from 2 to 16")
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)


def _reduce(x: torch.Tensor, dim: int | None, fn) -> torch.Tensor:
    if dim is None:
        return fn(x)
    return fn(x.transpose(0, dim).reshape(x.shape[dim], -1), dim=1).values


def _shape(t: torch.Tensor, x: torch.Tensor, dim: int | None) -> torch.Tensor:
    """Per-channel parameters shaped to broadcast along ``dim`` of ``x``."""
    if dim is None:
        return t
    shape = [1] * x.dim()
    shape[dim] = -1
    return t.reshape(shape)


def affine_qparams(x: torch.Tensor, bits: int = 8, symmetric: bool = False,
                   dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point that map the range of ``x`` (widened to include 0) onto ``bits``-bit integers.

    Asymmetric: ``scale = (max - min) / (qmax - qmin)``, ``zero_point = qmin - round(min / scale)``.
    Symmetric: ``scale = max|x| / ((qmax - qmin) / 2)``, ``zero_point = 0``. Per channel along ``dim``
    (e.g. 0, a weight's output channels) when ``dim`` is given. The values torch's MinMax observers choose.

    Example:
        >>> scale, zero_point = affine_qparams(layer.weight, symmetric=True, dim=0)
    """
    qmin, qmax = _range(bits, symmetric)
    x = x.detach().float()
    low = torch.clamp(_reduce(x, dim, torch.min), max=0)
    high = torch.clamp(_reduce(x, dim, torch.max), min=0)
    eps = torch.finfo(torch.float32).eps
    if symmetric:
        scale = torch.clamp(torch.maximum(-low, high) / ((qmax - qmin) / 2), min=eps)
        zero_point = torch.zeros_like(scale, dtype=torch.int64)
    else:
        scale = torch.clamp((high - low) / (qmax - qmin), min=eps)
        zero_point = torch.clamp(qmin - torch.round(low / scale), qmin, qmax).to(torch.int64)
    return scale, zero_point


def quantize_affine(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int = 8,
                    symmetric: bool = False, dim: int | None = None) -> torch.Tensor:
    """``clamp(round(x / scale) + zero_point, qmin, qmax)`` as int64, rounding half to even.

    Like torch's kernels it multiplies by ``1 / scale`` rather than dividing, so that the integers are exactly
    torch's (the two differ in the last bit of float32, which moves a value sitting on a rounding tie).
    """
    qmin, qmax = _range(bits, symmetric)
    inverse, zero_point = _shape(1.0 / scale, x, dim), _shape(zero_point, x, dim)
    return torch.clamp(torch.round(x.detach().float() * inverse) + zero_point, qmin, qmax).to(torch.int64)


def dequantize_affine(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                      dim: int | None = None) -> torch.Tensor:
    """``(q - zero_point) * scale``: the float values the integers stand for."""
    return (q - _shape(zero_point, q, dim)).float() * _shape(scale, q, dim)


def fake_quantize_weights(model: nn.Module, bits: int, per_channel: bool = False,
                          keep_float: Iterable[str] = ()) -> nn.Module:
    """A copy of ``model`` with its Conv2d and Linear weights rounded to ``bits``-bit symmetric integers.

    The weights are stored back as the floats they stand for: the accuracy of a ``bits``-bit model, simulated,
    at any bit width.

    Args:
        model: the float model (left alone).
        bits: 2 to 16.
        per_channel: one scale per output channel (else one per tensor).
        keep_float: module names (a name keeps everything under it) to leave as they are.

    Example:
        >>> three_bit = fake_quantize_weights(model, 3, keep_float=("stem",))
    """
    _range(bits, True)
    keep = _check_keep_float(model, keep_float)
    copied = copy.deepcopy(model)
    dim = 0 if per_channel else None
    with torch.no_grad():
        for name, module in copied.named_modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)) and not any(
                    name == k or name.startswith(k + ".") for k in keep):
                w = module.weight
                scale, zero_point = affine_qparams(w, bits, True, dim)
                w.copy_(dequantize_affine(quantize_affine(w, scale, zero_point, bits, True, dim),
                                          scale, zero_point, dim))
    return copied


# --- methods ---------------------------------------------------------------------------------------


Method = QuantizeMethod  # one way to quantize a model; the table of them is `labkit.choices.QUANTIZE_METHODS`
METHODS = QUANTIZE_METHODS
CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16}
INT4_GROUP_SIZES = (128, 64, 32)  # torchao's int4 kernels take these group sizes
INT4_PACKING = "tile_packed_to_4d"  # torchao 0.14+: tinygemm's layout (the default "plain" needs other kernels)


class Cast(nn.Module):
    """``model`` run in ``dtype``: inputs are cast in and outputs back to float32, so it drops into fp32 code."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model = model.to(dtype)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.to(self.dtype)).float()


def _check_method(method: str) -> Method:
    check_quantize_method(method)
    if method not in METHODS:  # a simulated method: no kernel, nothing to look up
        raise ConfigError("method", method, f"one of {list(METHODS)} (a simulated method rounds the weights only)")
    return METHODS[method]


def _torchao(method: str):
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's import warns about torch internals
    try:
        import torchao
        import torchao.quantization
    except ImportError as exc:
        raise UnsupportedError("method", method, f"torchao is not installed ({exc}); {INSTALL_HINT}",
                               "the torch and torch.ao methods") from exc
    return torchao


class _SkipCastNotice(logging.Filter):
    """bitsandbytes' LLM.int8() logs its fp16 cast on every forward (hundreds in a timing loop); 06 says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "inputs will be cast from" not in record.getMessage()


_SKIP_CAST_NOTICE = _SkipCastNotice()


def _bitsandbytes(method: str):
    logging.getLogger("bitsandbytes.autograd._functions").addFilter(_SKIP_CAST_NOTICE)
    try:
        bitsandbytes = import_bitsandbytes()
    except Exception as exc:  # noqa: BLE001 - missing, or broken (a CUDA library mismatch fails on import)
        raise UnsupportedError("method", method, f"bitsandbytes cannot be imported ({type(exc).__name__}: {exc}); "
                               "pip install 'bitsandbytes>=0.50'", "the torch, torch.ao and torchao methods") from exc
    return bitsandbytes


def installed_version(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def supported(method: str, device: torch.device | str = "cpu") -> str | None:
    """None when ``method`` can run on ``device`` here, else why not (a sentence).

    Example:
        >>> supported("int4_weight_only", "cpu")
        "torchao's int4 weight-only kernels run on CUDA GPUs only ..."
    """
    spec = _check_method(method)
    device = torch.device(device)
    if device.type not in spec.devices:
        if method == "int4_weight_only":
            return ("torchao's int4 weight-only kernels run on CUDA GPUs only (tinygemm, compute capability 8.0+); "
                    "for 4 bits on a CPU use 'nf4_bnb'")
        return f"{spec.api}'s {method} kernels run on {' and '.join(spec.devices)} only, not {device.type}"
    if device.type == "cpu" and method in ("int8_dynamic", "int8_static"):
        if not {"x86", "fbgemm", "qnnpack"} & set(torch.backends.quantized.supported_engines):
            return f"this torch build has no quantized CPU engine ({torch.backends.quantized.supported_engines})"
    if spec.api == "torchao" and installed_version("torchao") is None:
        return f"torchao is not installed; {INSTALL_HINT}"
    if spec.api == "bitsandbytes" and installed_version("bitsandbytes") is None:
        return "bitsandbytes is not installed; pip install 'bitsandbytes>=0.50'"
    capability = machine.here().capability
    if method == "int4_weight_only" and capability < (8, 0):
        return (f"torchao's int4 kernels (tinygemm, on bf16 weights) need compute capability 8.0+; this GPU has "
                f"{'.'.join(map(str, capability))}, so for 4 bits use 'nf4_bnb'")
    return None


def available(device: torch.device | str = "cpu") -> list[str]:
    """The methods that can run on ``device`` here."""
    return [name for name in METHODS if supported(name, device) is None]


def _model_device(model: nn.Module) -> torch.device:
    return next(iter(model.parameters()), torch.empty(0)).device


def _linear_names(model: nn.Module, keep_float: Iterable[str]) -> list[str]:
    keep = tuple(keep_float)
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)
            and not any(name == k or name.startswith(k + ".") for k in keep)]


def _check_keep_float(model: nn.Module, keep_float: Iterable[str]) -> tuple[str, ...]:
    """Module names (a name keeps everything under it) or layer types such as ``"LayerNorm"``."""
    keep = tuple(keep_float)
    names = {name for name, _ in model.named_modules()}
    types = {type(m).__name__ for m in model.modules()}
    bad = [k for k in keep if k not in names and k not in types]
    if bad:
        raise ConfigError("keep_float", bad, f"module names of the model (e.g. {sorted(names - {''})[:6]}) or "
                          f"layer types in it (e.g. {sorted(types)[:6]})")
    return keep


def _split_keep(model: nn.Module, keep: tuple[str, ...]) -> tuple[list[str], list[str]]:
    names = {name for name, _ in model.named_modules()}
    return [k for k in keep if k in names], [k for k in keep if k not in names]


def _calibration_inputs(calibration, method: str) -> list[torch.Tensor]:
    if calibration is None:
        raise ConfigError("calibration", None, f"a few batches of training inputs for {method!r} (it fixes the "
                          "activation ranges from them), e.g. labkit.labs.quantization.calibration_batches(cfg, 8)")
    batches = [b[0] if isinstance(b, (tuple, list)) else b for b in calibration]
    if not batches or not all(isinstance(b, torch.Tensor) for b in batches):
        raise ConfigError("calibration", type(calibration).__name__,
                          "a non-empty iterable of input tensors (or (inputs, labels) pairs)")
    return batches


def _fx_qconfig_mapping(model: nn.Module, keep: tuple[str, ...], qat: bool = False):
    from torch.ao.quantization import get_default_qat_qconfig_mapping, get_default_qconfig_mapping

    engine = "x86" if "x86" in torch.backends.quantized.supported_engines else torch.backends.quantized.engine
    mapping = (get_default_qat_qconfig_mapping if qat else get_default_qconfig_mapping)(engine)
    names, type_names = _split_keep(model, keep)
    for name in names:
        mapping.set_module_name(name, None)
    for type_name in type_names:
        for m in model.modules():
            if type(m).__name__ == type_name:
                mapping.set_object_type(type(m), None)
                break
    return mapping


def _static(model: nn.Module, calibration, keep: tuple[str, ...]) -> nn.Module:
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    batches = _calibration_inputs(calibration, "int8_static")
    model = model.cpu().eval()
    prepared = prepare_fx(model, _fx_qconfig_mapping(model, keep), (batches[0].cpu(),))
    with torch.no_grad():
        for batch in batches:  # the observers record each activation's range
            prepared(batch.cpu())
    return convert_fx(prepared)


def _group_size(model: nn.Module, names: list[str]) -> int:
    features = [model.get_submodule(n).in_features for n in names]
    for size in INT4_GROUP_SIZES:
        if all(f % size == 0 for f in features):
            return size
    raise UnsupportedError("method", "int4_weight_only", f"no group size in {INT4_GROUP_SIZES} divides every "
                           f"Linear layer's input width {sorted(set(features))}", "the 8-bit methods")


def _torchao_quantize(model: nn.Module, method: str, names: list[str]) -> nn.Module:
    _torchao(method)
    from torchao.quantization import (
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    wanted = set(names)
    config = {"int8_dynamic_torchao": Int8DynamicActivationInt8WeightConfig,
              "int8_weight_only": Int8WeightOnlyConfig}.get(method)
    config = config() if config else int4_config(Int4WeightOnlyConfig, _group_size(model, names))
    try:
        quantize_(model, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn in wanted)
    except (ImportError, RuntimeError, NotImplementedError, ValueError) as exc:
        raise UnsupportedError("method", method, f"torchao failed ({type(exc).__name__}: {exc})",
                               ", ".join(available(_model_device(model)))) from exc
    # torchao skips a layer it cannot handle without a word; a method that changed nothing is an error.
    changed = [n for n in names if type(model.get_submodule(n).weight) is not nn.Parameter]
    if not changed:
        raise UnsupportedError("method", method, "torchao quantized none of the Linear layers", "the other methods")
    return model


def int4_config(config_class, group_size: int):
    """torchao's int4 weight-only config packed for tinygemm (CUDA sm80+, bf16 weights), which torchao runs alone.

    0.14+ defaults to ``plain``, whose kernels (mslk / fbgemm-gpu-genai) labkit does not install; older: tinygemm.

    Args:
        config_class: ``torchao.quantization.Int4WeightOnlyConfig``. group_size: weights per scale.
    """
    if "int4_packing_format" in {f.name for f in dataclasses.fields(config_class)}:
        return config_class(group_size=group_size, int4_packing_format=INT4_PACKING)
    return config_class(group_size=group_size)


BNB_CPU_BLOCK_N = 32  # bitsandbytes' CPU 4-bit kernel packs a weight's outputs 32 at a time


def _bnb_quantize(model: nn.Module, method: str, names: list[str]) -> nn.Module:
    bnb = _bitsandbytes(method)
    device = _model_device(model)
    if method == "nf4_bnb" and device.type == "cpu":
        # On CPUs with AVX512-BF16, bitsandbytes repacks a 4-bit weight for its CPU kernel at the first eval
        # forward and fails unless the layer's outputs are a multiple of 32 (a 10-class head is not): such
        # layers stay in float, and the model records which.
        kept = [n for n in names if model.get_submodule(n).out_features % BNB_CPU_BLOCK_N]
        names = [n for n in names if n not in kept]
        model.labkit_kept_float = kept
        if not names:
            raise UnsupportedError("method", method, f"bitsandbytes' CPU 4-bit kernel needs Linear layers with a "
                                   f"multiple of {BNB_CPU_BLOCK_N} outputs, "
                                   f"and this model has none ({', '.join(kept)})",
                                   "the 8-bit methods")
    for name in names:
        old = model.get_submodule(name)
        if method == "int8_bnb":
            new = bnb.nn.Linear8bitLt(old.in_features, old.out_features, bias=old.bias is not None,
                                      has_fp16_weights=False, threshold=6.0)
            new.weight = bnb.nn.Int8Params(old.weight.data.cpu(), requires_grad=False, has_fp16_weights=False)
        else:
            # a GPU computes NF4 in its native 16-bit type: bf16 from Ampere on, fp16 before (a T4 emulates bf16)
            compute = (torch.bfloat16 if machine.here().bf16_native else torch.float16) if device.type == "cuda" \
                else torch.float32
            new = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=old.bias is not None,
                                    compute_dtype=compute, quant_type="nf4")
            new.weight = bnb.nn.Params4bit(old.weight.data.cpu(), requires_grad=False, quant_type="nf4")
        if old.bias is not None:
            new.bias = nn.Parameter(old.bias.data.cpu(), requires_grad=False)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new.to(device))  # .to quantizes
    return model.eval()  # the new layers start in training mode, as every new nn.Module does


def quantize(model: nn.Module, method: str, calibration: Iterable | None = None,
             keep_float: Iterable[str] = ()) -> nn.Module:
    """A quantized copy of ``model`` (in eval mode; ``model`` itself is left alone).

    Args:
        model: any float32 model (labkit's or your own).
        method: one of `METHODS`, or a `SIMULATED_METHODS` name (weights rounded, kept in float32).
        calibration: training batches of inputs (or (inputs, labels) pairs); required by ``int8_static``.
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
    spec = _check_method(method)
    device = _model_device(model)
    target = device if device.type in spec.devices else torch.device("cpu")
    reason = supported(method, target)
    if reason:
        raise UnsupportedError("method", method, reason, ", ".join(available(device)))
    if spec.calibration:
        # once (a loader's iterator is consumed), before any work
        calibration = _calibration_inputs(calibration, method)
    elif calibration is not None:
        raise ConfigError("calibration", type(calibration).__name__, f"None: {method!r} uses no calibration data "
                          "(only int8_static does)")
    keep = _check_keep_float(model, keep_float)
    if keep and method in ("fp32", *CASTS):
        raise ConfigError("keep_float", list(keep), f"empty for {method!r}, which casts or keeps the whole model")
    copied = copy.deepcopy(model).eval()
    if method == "fp32":
        return copied
    if method in CASTS:
        return Cast(copied, CASTS[method]).eval()
    names = _linear_names(copied, _split_keep(copied, keep)[0])
    if spec.linear_only and not names:
        raise ConfigError("model", type(model).__name__, f"a model with Linear layers outside keep_float: {method!r} "
                          "quantizes only Linear layers")
    if method == "int8_dynamic":
        from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

        return quantize_dynamic(copied.cpu(), {name: default_dynamic_qconfig for name in names},
                                dtype=torch.qint8).eval()
    if method == "int8_static":
        return _static(copied, calibration, keep).eval()
    if method == "int4_weight_only":  # tinygemm takes bf16 weights: a bf16 copy, fed and read in float32
        cast = Cast(copied.to(target), torch.bfloat16)
        cast.model = _torchao_quantize(cast.model, method, names)
        return cast.eval()
    if spec.api == "torchao":
        return _torchao_quantize(copied.to(target), method, names).eval()
    return _bnb_quantize(copied.to(target), method, names)


# --- quantization-aware training ------------------------------------------------------------------


def prepare_qat(model: nn.Module, example_inputs: torch.Tensor, keep_float: Iterable[str] = ()) -> nn.Module:
    """A copy of ``model`` that fake-quantizes its weights and activations, ready to fine-tune.

    Int8 rounding in the forward, straight-through gradients in the backward; `convert_qat` makes it int8.
    The copy keeps ``labkit_name``, so that `labkit.fit(cfg, model=...)` trains it like the original.

    Example:
        >>> qat = prepare_qat(model, images[:8])
        >>> labkit.fit(cfg, model=qat); int8 = convert_qat(qat)
    """
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    keep = _check_keep_float(model, keep_float)
    copied = copy.deepcopy(model).cpu().train()
    prepared = prepare_qat_fx(copied, _fx_qconfig_mapping(copied, keep, qat=True), (example_inputs.cpu(),))
    prepared.labkit_name = getattr(model, "labkit_name", None)
    return prepared.to(_model_device(model))


def convert_qat(prepared: nn.Module) -> nn.Module:
    """The int8 CPU model of a `prepare_qat` model after its fine-tune (a copy; eval mode)."""
    from torch.ao.quantization.quantize_fx import convert_fx

    if not hasattr(prepared, "graph") or not any("fake_quant" in n or "activation_post_process" in n
                                                 for n, _ in prepared.named_modules()):
        raise ConfigError("prepared", type(prepared).__name__, "a model returned by prepare_qat")
    return convert_fx(copy.deepcopy(prepared).cpu().eval()).eval()

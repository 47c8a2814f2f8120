"""int8 through ``torch.ao.quantization``: dynamic (``quantize_dynamic``), and FX graph mode, static and QAT.

FX graph mode (``prepare_fx`` / ``convert_fx``) traces the model with ``torch.fx``, inserts an observer per
activation, and converts to torch.ao's quantized modules (x86/fbgemm kernels, CPU only). It is what most existing
code runs, and PyTorch is retiring it: ``torch.ao.quantization`` is deprecated since torch 2.10 and warns on every
use. Its successor for static int8 and QAT is PT2E (`labkit.techniques.quantization.pt2e`, in torchao). Once this
module is imported, exactly torch.ao's deprecation warnings are silenced.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from ...errors import ConfigError
from .common import calibration_inputs, check_keep_float, model_device, split_keep

# torch.ao's deprecation notices: one when a submodule is imported, and one whenever a quantized tensor is
# created, which a statically quantized model does in every forward. Only these are silenced, for the
# whole session (a notebook would otherwise show a warning box under every cell that runs such a model).
_DEPRECATIONS = (r"torch\.ao\.quantization is deprecated", r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
                 r"Please use quant_min and quant_max to specify the range for observers")


def _silence_deprecations() -> None:
    for message in _DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message)


_silence_deprecations()


def _fx_qconfig_mapping(model: nn.Module, keep: tuple[str, ...], qat: bool = False):
    from torch.ao.quantization import get_default_qat_qconfig_mapping, get_default_qconfig_mapping

    engine = "x86" if "x86" in torch.backends.quantized.supported_engines else torch.backends.quantized.engine
    mapping = (get_default_qat_qconfig_mapping if qat else get_default_qconfig_mapping)(engine)
    names, type_names = split_keep(model, keep)
    for name in names:
        mapping.set_module_name(name, None)
    for type_name in type_names:
        for m in model.modules():
            if type(m).__name__ == type_name:
                mapping.set_object_type(type(m), None)
                break
    return mapping


def dynamic(model: nn.Module, names: list[str]) -> nn.Module:
    """``model`` (changed in place, on the CPU) with the Linear layers ``names`` int8, activations per batch."""
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

    return quantize_dynamic(model.cpu(), {name: default_dynamic_qconfig for name in names}, dtype=torch.qint8).eval()


def static(model: nn.Module, calibration, keep: tuple[str, ...]) -> nn.Module:
    """``model`` (a copy) calibrated on ``calibration`` and converted to torch.ao's int8 modules."""
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    batches = calibration_inputs(calibration, "int8_static")
    model = model.cpu().eval()
    prepared = prepare_fx(model, _fx_qconfig_mapping(model, keep), (batches[0].cpu(),))
    with torch.no_grad():
        for batch in batches:  # the observers record each activation's range
            prepared(batch.cpu())
    return convert_fx(prepared)


def prepare_qat(model: nn.Module, example_inputs: torch.Tensor, keep_float: Iterable[str] = ()) -> nn.Module:
    """A copy of ``model`` that fake-quantizes its weights and activations, ready to fine-tune.

    Int8 rounding in the forward, straight-through gradients in the backward; `convert_qat` makes it int8.
    The copy keeps ``labkit_name``, so that `labkit.fit(cfg, model=...)` trains it like the original.

    Example:
        >>> qat = prepare_qat(model, images[:8])
        >>> labkit.fit(cfg, model=qat); int8 = convert_qat(qat)
    """
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    keep = check_keep_float(model, keep_float)
    copied = copy.deepcopy(model).cpu().train()
    prepared = prepare_qat_fx(copied, _fx_qconfig_mapping(copied, keep, qat=True), (example_inputs.cpu(),))
    prepared.labkit_name = getattr(model, "labkit_name", None)
    return prepared.to(model_device(model))


def convert_qat(prepared: nn.Module) -> nn.Module:
    """The int8 CPU model of a `prepare_qat` model after its fine-tune (a copy; eval mode)."""
    from torch.ao.quantization.quantize_fx import convert_fx

    if not hasattr(prepared, "graph") or not any("fake_quant" in n or "activation_post_process" in n
                                                 for n, _ in prepared.named_modules()):
        raise ConfigError("prepared", type(prepared).__name__, "a model returned by prepare_qat")
    return convert_fx(copy.deepcopy(prepared).cpu().eval()).eval()


def module_int8_layers(model: nn.Module) -> list[str]:
    """The names of the layers a torch.ao-converted model holds as int8 modules (fused ones count once)."""
    return [name for name, m in model.named_modules() if type(m).__module__.startswith(
        ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized")) and callable(getattr(m, "weight", None))]

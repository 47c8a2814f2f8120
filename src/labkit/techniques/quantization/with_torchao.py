"""torchao's ``quantize_``: int8 dynamic, int8 and int4 weight-only, each Linear weight made a tensor subclass."""

from __future__ import annotations

import dataclasses
import logging

from torch import nn

from ...errors import UnsupportedError
from .common import INSTALL_HINT

INT4_GROUP_SIZES = (128, 64, 32)  # torchao's int4 kernels take these group sizes
INT4_PACKING = "tile_packed_to_4d"  # torchao 0.14+: tinygemm's layout (the default "plain" needs other kernels)


def import_torchao(method: str):
    """torchao, imported; or `UnsupportedError` with the install hint."""
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's import warns about torch internals
    try:
        import torchao
        import torchao.quantization
    except ImportError as exc:
        raise UnsupportedError("method", method, f"torchao is not installed ({exc}); {INSTALL_HINT}",
                               "the torch and torch.ao methods") from exc
    return torchao


def group_size(model: nn.Module, names: list[str]) -> int:
    """The largest of `INT4_GROUP_SIZES` that divides every one of the Linear layers' input widths."""
    features = [model.get_submodule(n).in_features for n in names]
    for size in INT4_GROUP_SIZES:
        if all(f % size == 0 for f in features):
            return size
    raise UnsupportedError("method", "int4_weight_only", f"no group size in {INT4_GROUP_SIZES} divides every "
                           f"Linear layer's input width {sorted(set(features))}", "the 8-bit methods")


def torchao_quantize(model: nn.Module, method: str, names: list[str]) -> nn.Module:
    """``model`` (changed in place) with its Linear layers ``names`` quantized by torchao's config for ``method``."""
    import_torchao(method)
    from torchao.quantization import (
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    wanted = set(names)
    config = {"int8_dynamic_torchao": Int8DynamicActivationInt8WeightConfig,
              "int8_weight_only": Int8WeightOnlyConfig}.get(method)
    config = config() if config else int4_config(Int4WeightOnlyConfig, group_size(model, names))
    try:
        quantize_(model, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn in wanted)
    except (ImportError, RuntimeError, NotImplementedError, ValueError) as exc:
        raise UnsupportedError("method", method, f"torchao failed ({type(exc).__name__}: {exc})",
                               "another method (quantization.available() lists what runs here)") from exc
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

"""Static int8 and QAT through PT2E, the flow that replaces FX graph mode: export, annotate, calibrate, convert.

``torch.export`` captures the model as an ATen graph; a *quantizer* (here torchao's ``X86InductorQuantizer``, int8
weights per channel and uint8 activations per tensor, the x86 recipe of FX graph mode too) annotates which inputs and
outputs to quantize; ``prepare_pt2e`` puts an observer on each (``prepare_qat_pt2e``: a fake-quantize step);
calibration batches (or a fine-tune) set their ranges; ``convert_pt2e`` freezes them. This is the flow PyTorch keeps:
it lives in ``torchao.quantization.pt2e``, while ``torch.ao.quantization``'s FX graph mode (`fx`) is deprecated.

What the converted model is: a ``GraphModule`` whose weights are int8 constants (quantize folded, ``fold_quantize``)
and whose activations pass through quantize -> dequantize pairs, every operation still computed in float32. Only
``torch.compile`` (inductor) fuses those pairs into int8 oneDNN kernels, so eagerly it is slower than fp32, and its
latency is not int8's speed. `store_what_the_graph_reads` makes its ``state_dict`` the constants the graph reads (the
int8 weights, their scales and zero points), so that its file size is the int8 model's.

``keep_float``: module names get no quantization config (``set_module_name_qconfig(name, None)``); a layer type that
the quantizer handles (Conv2d, Linear, pooling) gets none either; one it never quantizes (LayerNorm) already stays
in float.
"""

from __future__ import annotations

import copy
import functools
import importlib
import logging
import types
from collections.abc import Iterable

import torch
from torch import nn

from ...errors import ConfigError, UnsupportedError
from ...project import torchao_requirement
from .common import INSTALL_HINT, TORCHAO_TESTED, calibration_inputs, check_keep_float, installed_version, split_keep

METHOD = "int8_pt2e"
# Importing torchao logs a torch-internal deprecation (KernelPreference registered as a pytree constant) through this
# one logger, which Jupyter shows as a warning box; 06's PT2E cell imports torchao itself, after labkit. Only that
# logger is quietened, to errors.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def import_pt2e():
    """torchao's PT2E modules ``(quantize_pt2e, x86_inductor_quantizer)``; `UnsupportedError` if missing or too old."""
    try:
        quantize_pt2e = importlib.import_module("torchao.quantization.pt2e.quantize_pt2e")
        x86_inductor_quantizer = importlib.import_module("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    except ImportError as exc:
        version = installed_version("torchao")
        why = (f"torchao is not installed; {INSTALL_HINT}" if version is None else
               f"torchao {version} has no PT2E flow (torchao.quantization.pt2e with X86InductorQuantizer: {exc}); "
               f"pip install '{torchao_requirement()}' (the torchao release built for this torch; labkit's tests "
               f"run {TORCHAO_TESTED})")
        raise UnsupportedError("method", METHOD, why, "int8_static (torch.ao's FX graph mode)") from exc
    return quantize_pt2e, x86_inductor_quantizer


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """None when the PT2E flow runs with this torch and torchao (tried once on a two-layer model), else why not.

    torchao's PT2E code calls torch.ao internals of its own era: torchao 0.12 on torch 2.5 fails inside
    ``prepare_pt2e`` (torch 2.5 has no ``AffineQuantizedObserverBase``), after the imports succeed.
    """
    try:
        tiny = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        static_pt2e(tiny, [torch.randn(2, 4)])
    except UnsupportedError as exc:
        return exc.reason
    except Exception as exc:  # noqa: BLE001 - any failure of the library means: not here
        return (f"torchao {installed_version('torchao')}'s PT2E flow fails on torch {torch.__version__} "
                f"({type(exc).__name__}: {str(exc)[:160]}); a newer torch with its torchao runs it")
    return None


def export(model: nn.Module, example_inputs: torch.Tensor) -> torch.fx.GraphModule:
    """``model``'s ATen graph (``torch.export``), its batch dimension left free so that any batch size runs.

    Args:
        model: the model, in the mode to capture (eval for PTQ, train for QAT). example_inputs: a batch of 2 or more.
    """
    if not isinstance(example_inputs, torch.Tensor) or example_inputs.dim() < 1 or len(example_inputs) < 2:
        raise ConfigError("example_inputs", getattr(example_inputs, "shape", type(example_inputs).__name__),
                          "a batch of at least 2 inputs (torch.export fixes a batch of 1 as a constant)")
    batch = torch.export.Dim("batch")
    # strict (TorchDynamo) capture: on torch 2.9 the default non-strict graph lacks the metadata that torchao 0.15's
    # x86 quantizer matches layers by, and it then annotated nothing (found in the Colab image's CI part)
    return torch.export.export(model, (example_inputs,), dynamic_shapes=({0: batch},), strict=True).module()


def _check_annotated(prepared: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``prepared`` if the quantizer put an observer anywhere; else `UnsupportedError` (never a silent float copy)."""
    if not any(name.startswith("activation_post_process") for name, _ in prepared.named_children()):
        raise UnsupportedError("method", METHOD, f"torchao {installed_version('torchao')}'s x86 quantizer annotated "
                               f"no layer of this graph (torch {torch.__version__}), so nothing would be quantized",
                               "int8_static (torch.ao's FX graph mode)")
    return prepared


def x86_quantizer(model: nn.Module, keep_float: Iterable[str] = (), qat: bool = False):
    """torchao's ``X86InductorQuantizer`` with its default int8 config, and none for ``keep_float``.

    Args:
        model: the float model (its module names and layer types). keep_float: names or types left in float.
        qat: the config for quantization-aware training (fake-quantize steps instead of observers).
    """
    _, x86 = import_pt2e()
    keep = check_keep_float(model, keep_float)
    quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config(is_qat=qat))
    names, type_names = split_keep(model, keep)
    for name in names:
        quantizer.set_module_name_qconfig(name, None)
    handled = x86.X86InductorQuantizer.module_function_to_aten_operator_type
    for layer_type in {type(m) for m in model.modules() if type(m).__name__ in type_names}:
        if layer_type in handled:  # a type the quantizer never quantizes (LayerNorm) stays float without a word
            quantizer.set_module_type_qconfig(layer_type, None)
    return quantizer


def static_pt2e(model: nn.Module, calibration, keep_float: Iterable[str] = ()) -> torch.fx.GraphModule:
    """An int8 copy of ``model`` by PT2E: export, ``prepare_pt2e`` with the x86 quantizer, calibrate, convert.

    Args:
        model: the float model (left alone). calibration: batches of training inputs (or (inputs, labels) pairs).
        keep_float: module names or layer types left in float.

    Example:
        >>> int8 = static_pt2e(model, calibration_batches(cfg, 8), keep_float=("head",))
    """
    quantize_pt2e, _ = import_pt2e()
    batches = calibration_inputs(calibration, METHOD)
    model = copy.deepcopy(model).cpu().eval()
    prepared = _check_annotated(quantize_pt2e.prepare_pt2e(export(model, batches[0].cpu()),
                                                           x86_quantizer(model, keep_float)))
    with torch.no_grad():
        for batch in batches:  # the observers record each activation's range
            prepared(batch.cpu())
    return _usable(quantize_pt2e.convert_pt2e(prepared))


def prepare_qat_pt2e(model: nn.Module, example_inputs: torch.Tensor,
                     keep_float: Iterable[str] = ()) -> torch.fx.GraphModule:
    """A PT2E copy of ``model`` that fake-quantizes weights and activations, in training mode, ready to fine-tune.

    ``.train()`` and ``.eval()`` switch its BatchNorm and dropout (`allow_train_eval`); it keeps ``labkit_name``, so
    that `labkit.fit(cfg, model=...)` trains it like the original; `convert_qat_pt2e` makes it int8.

    Example:
        >>> qat = prepare_qat_pt2e(model, images[:8]); labkit.fit(cfg, model=qat); int8 = convert_qat_pt2e(qat)
    """
    quantize_pt2e, _ = import_pt2e()
    copied = copy.deepcopy(model).cpu().train()
    prepared = _check_annotated(quantize_pt2e.prepare_qat_pt2e(export(copied, example_inputs.cpu()),
                                                               x86_quantizer(copied, keep_float, qat=True)))
    prepared.labkit_name = getattr(model, "labkit_name", None)
    return allow_train_eval(prepared).train()


def convert_qat_pt2e(prepared: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The int8 model of a `prepare_qat_pt2e` model after its fine-tune (a copy, on the CPU, in eval mode)."""
    quantize_pt2e, _ = import_pt2e()
    from torchao.quantization.pt2e import FakeQuantizeBase

    if not isinstance(prepared, torch.fx.GraphModule) or not any(
            isinstance(m, FakeQuantizeBase) for m in prepared.modules()):
        raise ConfigError("prepared", type(prepared).__name__, "a model returned by prepare_qat_pt2e")
    copied = allow_train_eval(copy.deepcopy(prepared).cpu()).eval()
    return _usable(quantize_pt2e.convert_pt2e(copied))


def _usable(converted: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A converted graph whose file is the int8 model's and that switches modes as code for an ``nn.Module`` does."""
    return allow_train_eval(store_what_the_graph_reads(converted))


def _train(self, mode: bool = True):
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train

    (move_exported_model_to_train if mode else move_exported_model_to_eval)(self)
    self.training = mode
    return self


def _eval(self):
    return self.train(False)


def allow_train_eval(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``graph`` (changed in place) with ``.train()`` / ``.eval()`` that switch its BatchNorm and dropout and return it.

    An exported graph refuses both; torchao's ``allow_exported_model_train_eval`` allows them but returns None,
    which breaks ``model = model.eval()``.
    """
    graph.train = types.MethodType(_train, graph)
    graph.eval = types.MethodType(_eval, graph)
    return graph


def store_what_the_graph_reads(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``graph`` (changed in place) with every constant it reads in its ``state_dict``, and nothing else.

    ``convert_pt2e`` keeps the folded int8 weights as plain attributes (not saved by ``torch.save(state_dict)``)
    and leaves the float weights it no longer reads registered (saved): the file would be the float model's.
    """
    read = {node.target for node in graph.graph.nodes if node.op == "get_attr"}
    for name in [n for n, _ in graph.named_parameters()] + [n for n, _ in graph.named_buffers()]:
        if name not in read:
            owner, _, leaf = name.rpartition(".")
            delattr(graph.get_submodule(owner) if owner else graph, leaf)
    for name in read:
        owner, _, leaf = name.rpartition(".")
        module = graph.get_submodule(owner) if owner else graph
        value = getattr(module, leaf)
        if isinstance(value, torch.Tensor) and leaf not in module._parameters and leaf not in module._buffers:
            delattr(module, leaf)
            module.register_buffer(leaf, value)
    return graph


def graph_int8_layers(graph: torch.fx.GraphModule) -> list[str]:
    """The module names of the layers whose weight a converted PT2E graph stores in int8 (dequantized per channel)."""
    names = []
    for node in graph.graph.nodes:
        weight = node.args[1] if node.op == "call_function" and len(node.args) > 1 else None
        if isinstance(weight, torch.fx.Node) and "dequantize_per_channel" in str(weight.target):
            stack = node.meta.get("nn_module_stack") or {}
            names.append(list(stack.values())[-1][0] if stack else node.name)
    return list(dict.fromkeys(names))

"""torch.compile on a language model's decoder: what ``RunConfig(compile=True)`` does.

``module.compile()`` compiles a module in place (its state_dict keeps its names, unlike ``torch.compile(module)``,
which wraps it in ``_orig_mod``). labkit compiles each decoder layer, as torchtune does: the layers are alike, so
one compiled graph serves them all and compiling takes a fraction of the whole model's time (measured here: 46 s
for the body's four layers one by one against 62 s for the body at once, cold, on 2 busy cores). The embeddings,
the output layer and the loss stay eager, so chunked cross-entropy and LoRA work unchanged::

    for layer in model.model.layers:
        layer.compile()              # TorchInductor: fused kernels, C++ on a CPU, Triton on a GPU
    loss = loss_fn(model(**batch))   # the first call compiles (tens of seconds), later calls reuse it

Inductor keeps what it compiled in a cache on disk (``/tmp/torchinductor_<user>``): a second process compiling
the same shapes takes seconds (3 s here against 46 s cold).

The first step pays the compilation; labkit times that step apart and reports the difference from a normal step as
``RunResult.compile_time_s``, never inside the step time. A new input shape recompiles, so compiling needs rows of
one width (``packing='pad_max'`` or ``'pack'``). Inductor needs a C++ compiler on a CPU and Triton, on a GPU of
compute capability 7.0 or newer, on a GPU: `compile_problem` says when one is missing.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys

import torch
from torch import nn

from .. import machine
from ..choices import COMPILE_PACKINGS, check_compile  # noqa: F401 - RunConfig's checks, part of this module's API
from ..errors import ConfigError

# Triton compiles for Volta (7.0) and newer; on a P100 (6.0) Inductor raises "Found Tesla P100-PCIE-16GB which is too
# old to be supported by the triton GPU compiler, which is used as the backend. Triton only supports devices of CUDA
# Capability >= 7.0".
TRITON_MIN_CAPABILITY = (7, 0)


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile's default backend cannot run on ``device`` here, or None when it can.

    Example:
        >>> compile_problem(torch.device("cpu"))  # with g++ installed
    """
    if sys.platform == "win32" and torch.__version__ < "2.6":
        return "torch.compile needs torch 2.6 or later on Windows"
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "TorchInductor needs Triton on a GPU, and it is not installed (`pip install triton`)"
        gpu = machine.here()
        if gpu.capability is not None and gpu.capability < TRITON_MIN_CAPABILITY:
            major, minor = TRITON_MIN_CAPABILITY
            return (f"TorchInductor's Triton kernels need a GPU of compute capability {major}.{minor} or newer, and "
                    f"{gpu.gpu} is {gpu.capability[0]}.{gpu.capability[1]} (Triton refuses it as too old)")
        return None
    compilers = [os.environ.get("CXX"), "g++", "c++", "clang++", "cl"]
    if not any(name and shutil.which(name) for name in compilers):
        return "TorchInductor needs a C++ compiler on a CPU (g++, clang++ or MSVC's cl), and none is on PATH"
    return None


def compile_decoder(model: nn.Module) -> nn.Module:
    """Compile each decoder layer of ``model`` in place (a transformers causal LM: ``model.model.layers``); returns
    ``model``.

    Raises `ConfigError` (field ``compile``) for a model without decoder layers.
    """
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ConfigError("compile", True, f"False for {type(model).__name__}: labkit compiles a transformers "
                          "causal LM's decoder layers (model.model.layers)")
    # On a machine without CUDA, building the first kernel logs where it looked for CUDA: not this run's concern.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    for layer in layers:
        layer.compile()
    return model


def eager_only():
    """A context that runs compiled modules eagerly (for instruments, e.g. the FLOP counter), or None when this
    torch cannot (``torch.compiler.set_stance`` came in torch 2.6)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else None

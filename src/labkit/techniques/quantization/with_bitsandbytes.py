"""bitsandbytes: LLM.int8() (``Linear8bitLt``) and 4-bit NF4 (``Linear4bit``, the QLoRA base) for Linear layers."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ... import machine
from ...env import import_bitsandbytes
from ...errors import UnsupportedError
from .common import model_device


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

BNB_CPU_BLOCK_N = 32  # bitsandbytes' CPU 4-bit kernel packs a weight's outputs 32 at a time
NF4_BLOCK_SIZE = 64  # weights per absmax; the CPU kernel reads a row's scales as in_features / 64 of them


def bnb_quantize(model: nn.Module, method: str, names: list[str]) -> nn.Module:
    """``model`` (changed in place) with its Linear layers ``names`` replaced by bitsandbytes' for ``method``."""
    bnb = _bitsandbytes(method)
    device = model_device(model)
    if method == "nf4_bnb" and device.type == "cpu":
        # On CPUs with AVX512-BF16, bitsandbytes repacks a 4-bit weight for its CPU kernel at the first eval
        # forward and fails unless the layer's outputs are a multiple of 32 (a 10-class head is not) and its inputs
        # a multiple of 64 (tiny_llama's 344-wide down_proj is not): such layers stay in float, and the model
        # records which.
        kept = [n for n in names if model.get_submodule(n).out_features % BNB_CPU_BLOCK_N
                or model.get_submodule(n).in_features % NF4_BLOCK_SIZE]
        names = [n for n in names if n not in kept]
        model.labkit_kept_float = kept
        if not names:
            raise UnsupportedError("method", method, f"bitsandbytes' CPU 4-bit kernel needs Linear layers with a "
                                   f"multiple of {BNB_CPU_BLOCK_N} outputs and {NF4_BLOCK_SIZE} inputs, "
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

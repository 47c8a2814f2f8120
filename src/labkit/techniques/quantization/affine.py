"""Affine quantization from scratch: ``q = clamp(round(x / scale) + zero_point)``, and simulated low-bit weights.

Symmetric or asymmetric, per tensor or per channel; the same numbers as torch's observers and
`torch.quantize_per_tensor` / `torch.quantize_per_channel`. `fake_quantize_weights` rounds a model's weights to any
bit width and stores them back as floats: what accuracy a 3- or 4-bit model would have, for sensitivity studies.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from ...errors import ConfigError
from .common import check_keep_float


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
    keep = check_keep_float(model, keep_float)
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

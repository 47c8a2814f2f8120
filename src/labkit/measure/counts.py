"""What can be counted rather than timed: FLOPs of a step, datasheet peak FLOP/s, parameters, a saved model's
bytes, and the noise of an accuracy measured on a test set of a given size."""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import torch


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs of running ``step()`` once (matmuls and convolutions, forward and backward).

    The GPU attention kernels are counted by `sdpa_flops` and `sdpa_backward_flops`, which take grouped-query
    attention (fewer key/value heads than query heads, as SmolLM2 and Qwen2.5 have) as torch 2.10+ does: torch 2.9's
    own formulas assert equal heads, and the counting step raised there.
    """
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_sdpa_formulas()) as counter:
        step()
    return int(counter.get_total_flops())


def sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Forward FLOPs of an SDPA kernel: Q K^T and the scores times V for every query head (GQA's key/value heads are
    shared by several query heads, and the kernel computes each product per query head).

    Example:
        >>> sdpa_flops((2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16))   # 4 query heads over 2 key/value heads
        32768
    """
    batch, heads, queries, query_dim = query_shape
    return 2 * batch * heads * queries * key_shape[2] * (query_dim + value_shape[3])


def sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Backward FLOPs of an SDPA kernel: the gradients of the scores, V, Q and K, twice the forward's products."""
    batch, heads, queries, query_dim = query_shape
    return 2 * batch * heads * queries * key_shape[2] * 2 * (query_dim + value_shape[3])


_SDPA_OPS = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention")


def _sdpa_formulas() -> dict:
    """`sdpa_flops` and `sdpa_backward_flops` for the SDPA kernels this torch has."""
    aten = torch.ops.aten
    formulas = {}
    for name in _SDPA_OPS:
        for op_name, formula in ((name, sdpa_flops), (f"{name}_backward", sdpa_backward_flops)):
            if hasattr(aten, op_name):
                formulas[getattr(aten, op_name)] = formula
    return formulas


# Dense datasheet peaks in FLOP/s by GPU and the dtype of the matmuls. "fp32" is plain FP32 (CUDA
# cores); "tf32" is float32 with TF32 tensor cores (Ampere+). Sparsity figures are not used. Where a
# PCIe card differs from the SXM one, the PCIe row is matched first ("Tesla V100-PCIE-16GB").
PEAK_FLOPS = {
    "T4": {"fp32": 8.1e12, "fp16": 65e12},
    "P100 PCIE": {"fp32": 9.3e12, "fp16": 18.7e12},
    "P100": {"fp32": 10.6e12, "fp16": 21.2e12},
    "V100 PCIE": {"fp32": 14e12, "fp16": 112e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12},
    "L4": {"fp32": 30.3e12, "tf32": 60e12, "fp16": 121e12, "bf16": 121e12},
    "A10": {"fp32": 31.2e12, "tf32": 62.5e12, "fp16": 125e12, "bf16": 125e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
    "H100 PCIE": {"fp32": 51e12, "tf32": 378e12, "fp16": 756e12, "bf16": 756e12},
    "H100 NVL": {"fp32": 60e12, "tf32": 418e12, "fp16": 835e12, "bf16": 835e12},
    "H100": {"fp32": 67e12, "tf32": 494e12, "fp16": 989e12, "bf16": 989e12},
    "H200": {"fp32": 67e12, "tf32": 494e12, "fp16": 989e12, "bf16": 989e12},
}


def peak_flops(gpu_name: str | None, precision: str, tf32: bool = False) -> float | None:
    """Datasheet peak FLOP/s of ``gpu_name`` for ``precision`` (fp32/fp16/bf16); None when unknown.

    Example:
        >>> peak_flops("Tesla T4", "fp16")
        65000000000000.0
    """
    if not gpu_name:
        return None
    key = "tf32" if precision == "fp32" and tf32 else precision
    tokens = gpu_name.upper().replace("-", " ").split()  # "Tesla P100-PCIE-16GB" -> [..., "P100", "PCIE", ...]
    for name, table in PEAK_FLOPS.items():  # more specific rows come first
        if all(part in tokens for part in name.split()):
            return table.get(key, table["fp32"] if key == "tf32" else None)
    return None


def model_size_bytes(model: torch.nn.Module) -> int:
    """Size of the serialised ``state_dict`` (what ``torch.save`` writes), in bytes."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


def _weights_in(p: torch.Tensor) -> int:
    # bitsandbytes packs two 4-bit weights into a byte and keeps the real shape in the tensor's quant_state
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    return math.prod(shape) if shape is not None else p.numel()


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts; a 4-bit weight counts its real number of weights."""
    total = sum(_weights_in(p) for p in model.parameters())
    trainable = sum(_weights_in(p) for p in model.parameters() if p.requires_grad)
    return total, trainable


def accuracy_noise(accuracy: float, test_size: int) -> float:
    """The smallest accuracy difference between two runs that is not test-set noise (about 95 % confidence).

    Two accuracies measured on ``test_size`` images each differ by chance with a standard error of about
    sqrt(2 p (1 - p) / test_size); twice that is the threshold. It ignores seed-to-seed variation of the
    training itself, so it is a lower bound.
    """
    p = min(max(float(accuracy), 1 / test_size), 1 - 1 / test_size)
    return 2 * math.sqrt(2 * p * (1 - p) / test_size)

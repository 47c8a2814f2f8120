"""Whether this CPU multiplies int8 matrices exactly.

torchao's int8 dynamic method and bitsandbytes' int8 layers compute on a CPU with ``torch._int_mm`` (int8 x int8,
summed in int32). oneDNN computes it exactly where the CPU has VNNI (AVX512-VNNI, AVX-VNNI, AMX). Without VNNI (AVX2
only, or AVX512 before Cascade Lake) its kernel adds pairs of int8 products in 16 bits first, and a pair above 32,767
saturates: measured here with oneDNN held to AVX2, a model's outputs moved by about 20 % (against 0.6 % with VNNI).
torch.ao's ``int8_dynamic`` (fbgemm, with reduced-range activations) is not affected.
"""

from __future__ import annotations

import functools

import torch

# int8 methods whose CPU path multiplies through torch._int_mm
INT_MM_METHODS = ("int8_dynamic_torchao", "int8_bnb")


@functools.lru_cache(maxsize=1)
def cpu_int_mm_error() -> float | None:
    """``torch._int_mm``'s largest error on this CPU, as a share of the largest exact entry (0.0 where exact; None
    where this torch has no CPU kernel for it, so the methods take another path).

    The probe is random int8 matrices of the full range, where many pairs of products exceed 16 bits.
    """
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8, generator=generator)
    b = torch.randint(-128, 128, (64, 32), dtype=torch.int8, generator=generator)
    exact = a.to(torch.int64) @ b.to(torch.int64)
    try:
        got = torch._int_mm(a, b).to(torch.int64)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    return float((got - exact).abs().max() / exact.abs().max())


def inexact_int8_note(method: str) -> str | None:
    """What a learner should know before trusting ``method``'s CPU results here; None where the CPU is exact."""
    if method not in INT_MM_METHODS:
        return None
    error = cpu_int_mm_error()
    if not error:  # exact, or no such kernel here
        return None
    return (f"this CPU has no VNNI, so torch._int_mm (which {method} multiplies with here) saturates: it was off "
            f"by up to {error:.0%} of the largest entry of an exact int8 product, and the model's outputs move "
            f"with it; int8_dynamic (torch.ao) is not affected, and a GPU or a CPU with VNNI computes it exactly")

"""Notebook 06, section 1: one weight quantized four ways (symmetric or not, per tensor or per channel), its error."""

from __future__ import annotations

import pandas as pd
import torch

from ...messages import worded
from ...techniques import quantization


def scheme_errors(weights, bits: int = 8) -> pd.DataFrame:
    """Each weight quantized and dequantized four ways (symmetric or not, per tensor or per channel).

    Args:
        weights: a tensor, or a dict name -> tensor. bits: the integer width.

    Returns:
        ``weight``, ``scheme``, ``granularity``, ``mean_abs_error``, ``max_abs_error``, ``relative_error`` (norm
        of the error / norm of the weight).
    """
    weights = weights if isinstance(weights, dict) else {"weight": weights}
    rows = []
    for name, weight in weights.items():
        w = weight.detach().float().cpu()
        for symmetric in (False, True):
            for dim in (None, 0):
                scale, zero_point = quantization.affine_qparams(w, bits, symmetric, dim)
                q = quantization.quantize_affine(w, scale, zero_point, bits, symmetric, dim)
                restored = quantization.dequantize_affine(q, scale, zero_point, dim)
                error = (restored - w).abs()
                relative = torch.linalg.vector_norm(restored - w) / torch.linalg.vector_norm(w)
                rows.append({"weight": name, "scheme": "symmetric" if symmetric else "asymmetric",
                             "granularity": "per tensor" if dim is None else "per channel",
                             "mean_abs_error": float(error.mean()), "max_abs_error": float(error.max()),
                             "relative_error": float(relative)})
    return pd.DataFrame(rows)


@worded
def scheme_finding(errors: pd.DataFrame) -> str:
    """One line: per weight, the scheme with the smallest error, and how much per channel cut the symmetric error.

    Args:
        errors: `scheme_errors`' frame.
    """
    parts = []
    for name, rows in errors.groupby("weight", sort=False):
        best = rows.loc[rows.relative_error.idxmin()]
        sym = rows[rows.scheme == "symmetric"].set_index("granularity").relative_error
        parts.append(f"{name}: smallest error {best.scheme} {best.granularity} ({best.relative_error:.2%}), "
                     f"symmetric per tensor / per channel: {sym['per tensor'] / sym['per channel']:.1f}x the error")
    return "; ".join(parts) + "."

"""Section 1 of notebook 08: a LoRA layer as it is often copied from blog posts, run to show what goes wrong."""

from __future__ import annotations

import inspect

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ...labresult import LabResult
from ...techniques.lora import LoRALinear
from .base import ALPHA


class BlogLoRALayer(nn.Module):
    """A LoRA layer as widely copied from blog posts, kept as it is: wrong on purpose (see the problems)."""

    def __init__(self, in_features, out_features, rank=4):
        super().__init__()
        self.A = nn.Parameter(torch.randn(in_features, rank))
        self.B = nn.Parameter(torch.zeros(rank, out_features))

    def forward(self, x):
        return x @ self.weight.T + x @ self.A @ self.B


def blog_snippet() -> str:
    """`BlogLoRALayer` as source text."""
    return inspect.getsource(BlogLoRALayer)


def blog_snippet_problems(in_features: int = 128, out_features: int = 384, rank: int = 4,
                          alpha: float = ALPHA) -> LabResult:
    """Run `BlogLoRALayer` and measure each of its four problems (columns ``problem``, ``what_happens``)."""
    torch.manual_seed(0)
    x = torch.randn(4, in_features)
    blog = BlogLoRALayer(in_features, out_features, rank)
    try:
        blog(x)
        happened = "it ran"
    except AttributeError as error:
        happened = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    good = LoRALinear(nn.Linear(in_features, out_features), rank, alpha)
    a_std = float(blog.A.detach().std())
    rows = [("1. no base weight", happened),
            ("2. A, B transposed", _merge_transposed(rank)),
            ("3. no alpha / rank", f"the update is {1 / good.scaling:.3g}x the scaled one (alpha / rank = "
                                   f"{alpha / rank:g})"),
            ("4. A from randn", f"A's std is {a_std:.2f}, {a_std / float(good.lora_A.detach().std()):.0f}x "
                                "nn.Linear's")]
    return LabResult(pd.DataFrame(rows, columns=["problem", "what_happens"]))


def _merge_transposed(rank: int) -> str:
    """Merging the blog layer's update (A @ B, in x out) into W (out x in): an error, or silence on a square layer."""
    torch.manual_seed(0)
    wide = nn.Linear(128, 384)
    A, B = torch.randn(128, rank), torch.randn(rank, 384)
    try:
        wide.weight.data + A @ B
        wide_says = "runs"
    except RuntimeError:
        wide_says = "RuntimeError"
    square = nn.Linear(128, 128)
    A, B = torch.randn(128, rank) * 0.1, torch.randn(rank, 128) * 0.1
    x = torch.randn(8, 128)
    with torch.no_grad():
        unmerged = square(x) + x @ A @ B
        merged = F.linear(x, square.weight + A @ B, square.bias)
    return (f"merging into 128 -> 384: {wide_says}; into 128 -> 128: no error, outputs off by up to "
            f"{float((merged - unmerged).abs().max()):.3g}")

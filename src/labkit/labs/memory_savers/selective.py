"""Section 2 of notebook 03: ways of checkpointing a block, measured on a stack of MLP blocks."""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from ... import measure
from ...display import number
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...units import mib


def mlp_blocks(seed: int = 0, width: int = 256, depth: int = 4) -> nn.Sequential:
    """``depth`` transformer-style MLP blocks (Linear, GELU, Linear; 4 x ``width`` inside), seeded."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                           for _ in range(depth)])


def activation_peak(blocks: nn.Module, forward, x: torch.Tensor) -> tuple[int, list[torch.Tensor], torch.Tensor]:
    """Peak activation bytes of ``forward(blocks, x)`` and its backward (MemTracker), the gradients and the output."""
    blocks.zero_grad(set_to_none=True)
    holder = {}

    def step():
        out = forward(blocks, x)
        holder["out"] = out.detach()
        out.square().mean().backward()

    optimizer = torch.optim.SGD(blocks.parameters(), lr=0.0)  # the tracker files state by optimizer
    breakdown = measure.track_step_memory(step, blocks, optimizer, x.device)
    grads = [None if p.grad is None else p.grad.clone() for p in blocks.parameters()]
    blocks.zero_grad(set_to_none=True)
    return breakdown.peak_by_category.get("activations", 0), grads, holder["out"]


class Variants(LabResult):
    shown = ("variant", "activation_bytes", "activation_ratio", "flops_ratio", "step_time_s", "max_grad_diff")

    @worded
    def finding(self) -> str:
        base = self.frame.iloc[0]
        parts = [f"{row['variant']} {number(row['activation_ratio'])}x the activations, "
                 f"{number(row['flops_ratio'])}x the FLOPs, time "
                 f"{compare(Measured.row(row, 'step_time_s'), Measured.row(base, 'step_time_s'), ('faster', 'slower'))}"
                 for _, row in self.frame.iloc[1:].iterrows()]
        return (f"Against {base['variant']} ({mib(base['activation_bytes'], '.3g')} of activations): "
                + "; ".join(parts) + ".")


def checkpoint_variants(variants: dict, width: int = 256, depth: int = 4, batch_size: int = 512,
                        repeats: int = 5) -> Variants:
    """Each way of running a block (name -> ``run(block, x)``) on `mlp_blocks`, against the first."""
    if not variants or not all(callable(v) for v in variants.values()):
        raise ConfigError("variants", variants, "a dict of name -> run(block, x) functions")
    blocks = mlp_blocks(width=width, depth=depth)
    x = torch.randn(batch_size, width, generator=torch.Generator().manual_seed(1))
    rows, base_grads = [], None
    for name, run in variants.items():
        def forward(stack, t, run=run):
            for block in stack:
                t = run(block, t)
            return t

        act, grads, _ = activation_peak(blocks, forward, x)
        flops = measure.count_flops(lambda: forward(blocks, x).square().mean().backward())
        blocks.zero_grad(set_to_none=True)
        timer = measure.StepTimer(x.device)
        for index in range(repeats + 1):  # the first pass warms up
            if index:
                timer.start()
            forward(blocks, x).square().mean().backward()
            if index:
                timer.stop()
            blocks.zero_grad(set_to_none=True)
        base_grads = base_grads or grads
        diff = max(float((a - b).abs().max()) for a, b in zip(grads, base_grads, strict=True))
        median, p10, p90 = measure.spread(timer.times_s())
        rows.append({"variant": name, "activation_bytes": act, "flops": flops, "step_time_s": median,
                     "step_time_p10_s": p10, "step_time_p90_s": p90, "max_grad_diff": diff})
    frame = pd.DataFrame(rows)
    for column, key in (("activation_ratio", "activation_bytes"), ("flops_ratio", "flops"),
                        ("time_ratio", "step_time_s")):
        frame[column] = frame[key] / frame[key].iloc[0]
    return Variants(frame)

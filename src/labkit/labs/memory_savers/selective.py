"""Section 2 of notebook 03, selective checkpointing: ways of running a block (plain, checkpointed, with a
policy that saves some operations' outputs), measured on a stack of transformer-style MLP blocks."""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from ... import measure
from ...display import number
from ...errors import ConfigError
from ...messages import worded
from ...units import mib
from ._shared import timing_noise


def mlp_blocks(seed: int = 0, width: int = 256, depth: int = 4) -> nn.Sequential:
    """``depth`` MLP blocks (Linear, GELU, Linear: a transformer's feed-forward part) as an nn.Sequential.

    Args:
        seed: for the weights. width: the blocks' input and output features (4 x width inside). depth: blocks.
    """
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                           for _ in range(depth)])


def activation_peak(blocks: nn.Module, forward, x: torch.Tensor) -> tuple[int, list[torch.Tensor], torch.Tensor]:
    """Peak activation bytes of ``forward(blocks, x)`` and its backward (MemTracker), the gradients and the output.

    Args:
        blocks: the model. forward: ``forward(blocks, x)``. x: the input.
    """
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


def checkpoint_variants(variants: dict, width: int = 256, depth: int = 4, batch_size: int = 512,
                        repeats: int = 5) -> pd.DataFrame:
    """Each way of running a block, on `mlp_blocks`: activations, FLOPs, time, and the gradients' difference.

    Args:
        variants: name -> ``run(block, x)``; the first is the baseline the ratios compare with.
        width, depth: the blocks' size. batch_size: rows of the input. repeats: timed forward + backward passes.

    Returns:
        A frame: ``variant``, ``activation_bytes``, ``flops``, ``step_time_s`` (median) with ``step_time_p10_s``
        and ``step_time_p90_s``, ``activation_ratio``, ``flops_ratio``, ``time_ratio``, ``max_grad_diff``.

    Example:
        >>> checkpoint_variants({"plain": lambda b, x: b(x), "selective": my_selective})
    """
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
        for index in range(repeats + 1):
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
    base = frame.iloc[0]
    for column, key in (("activation_ratio", "activation_bytes"), ("flops_ratio", "flops"),
                        ("time_ratio", "step_time_s")):
        frame[column] = frame[key] / base[key]
    return frame


@worded
def variants_finding(frame: pd.DataFrame) -> str:
    """Each variant's activations, FLOPs and (where beyond the noise) time against the first, in one line."""
    base = frame.iloc[0]
    parts = []
    for _, row in frame.iloc[1:].iterrows():
        noise = timing_noise(row, base)
        time = f"time {number(row['time_ratio'])}x"
        time = {"outside": time, "within": "time within the noise"}.get(noise.split()[0], f"{time} ({noise})")
        parts.append(f"{row['variant']} {number(row['activation_ratio'])}x the activations, "
                     f"{number(row['flops_ratio'])}x the FLOPs, {time}")
    start = f"Against {base['variant']} ({mib(base['activation_bytes'], '.3g')} of activations): "
    return start + "; ".join(parts) + "."

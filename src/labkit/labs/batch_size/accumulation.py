"""Section 4 of notebook 02: gradient accumulation against the whole batch, and its memory and time."""

from __future__ import annotations

import math

import pandas as pd
import torch.nn.functional as F
from torch import nn

from ... import models, results
from ...config import RunConfig
from ...display import quantity
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...runsetup import set_up
from ...units import change, mib, ratio
from ...validate import is_int
from ._shared import succeeded

BATCHNORM_MODES = ("train", "eval", "none")


def without_batchnorm(model: nn.Module) -> nn.Module:
    """``model`` with every BatchNorm layer replaced by ``nn.Identity`` (in place)."""
    if isinstance(model, nn.modules.batchnorm._BatchNorm):
        return nn.Identity()
    for name, child in model.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, nn.Identity())
        else:
            without_batchnorm(child)
    return model


def _gap(cfg: RunConfig, accum_steps: int, batchnorm: str) -> dict:
    if batchnorm not in BATCHNORM_MODES:
        raise ConfigError("batchnorm", batchnorm, "'train', 'eval' or 'none' (removed)")
    if not is_int(accum_steps) or accum_steps < 1 or cfg.batch_size % accum_steps:
        raise ConfigError("accum_steps", accum_steps, f"a divisor of batch_size={cfg.batch_size}")
    s = set_up(cfg)  # TF32 as cfg says: it would add its own rounding (~1e-3) to the comparison
    micro = cfg.batch_size // accum_steps
    if batchnorm == "train" and micro < 2 and models.has_batchnorm(s.model):
        raise ConfigError("accum_steps", accum_steps, f"at most batch_size / 2 = {cfg.batch_size // 2}: BatchNorm "
                                                      "in train mode needs at least 2 samples per micro-batch")
    model = (without_batchnorm(s.model) if batchnorm == "none" else s.model).eval()  # dropout off
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(batchnorm == "train")
    batch = s.batch()
    start = {k: v.clone() for k, v in model.state_dict().items()}  # BatchNorm's running statistics too
    params = [p for p in model.parameters() if p.requires_grad]

    def gradients(chunks: int) -> list:
        model.load_state_dict(start)
        model.zero_grad(set_to_none=True)
        for x, y in zip(batch.images.chunk(chunks), batch.labels.chunk(chunks), strict=True):
            (F.cross_entropy(model(x), y) / chunks).backward()
        return [p.grad.detach().clone() for p in params]

    whole, accumulated = gradients(1), gradients(accum_steps)
    diff = max(float((a - b).abs().max()) for a, b in zip(whole, accumulated, strict=True))
    largest = max(float(g.abs().max()) for g in whole)
    return {"batchnorm": batchnorm, "accum_steps": accum_steps, "micro_batch_size": micro, "max_abs_grad_diff": diff,
            "max_abs_grad": largest, "relative_diff": diff / largest if largest else math.nan}


class AccumulationGaps(LabResult):
    shown = ("batchnorm", "micro_batch_size", "max_abs_grad_diff", "relative_diff")

    @worded
    def finding(self) -> str:
        gaps = ", ".join(f"{row.relative_diff:.1e} with BatchNorm {row.batchnorm}" for row in self.frame.itertuples())
        return f"Largest gradient difference relative to the largest entry: {gaps}."


def accumulation_table(cfg: RunConfig, accum_steps: int, modes=BATCHNORM_MODES) -> AccumulationGaps:
    """One batch's gradient against the same batch in ``accum_steps`` micro-batches, per BatchNorm mode."""
    return AccumulationGaps(pd.DataFrame([_gap(cfg, accum_steps, mode) for mode in modes]))


def peak_and_step(base, most) -> str:
    """``peak A -> B (50% less), step C -> D: 1.5x (slower)`` for two runs' rows."""
    c = compare(Measured.row(most, "step_time_s"), Measured.row(base, "step_time_s"), words=("faster", "slower"))
    return (f"peak {mib(base['peak_memory_bytes'], '.3g')} -> {mib(most['peak_memory_bytes'], '.3g')} "
            f"({change(ratio(most['peak_memory_bytes'], base['peak_memory_bytes']))}), step "
            f"{quantity('step_time_s', base['step_time_s'])} -> {quantity('step_time_s', most['step_time_s'])}: {c}")


class Accumulation(LabResult):
    shown = ("grad_accum", "batch_size", "peak_memory_bytes", "step_time_s")

    @worded
    def finding(self) -> str:
        ok = succeeded(self.frame).sort_values("grad_accum")
        if ok.empty:
            return "No run finished."
        base, most = ok.iloc[0], ok.iloc[-1]
        return (f"grad_accum={int(most['grad_accum'])} against {int(base['grad_accum'])}, the same batch of "
                f"{int(base['batch_size'])} in micro-batches of {int(most['batch_size'] // most['grad_accum'])}: "
                f"{peak_and_step(base, most)}.")


def accumulation_sweep(cfg: RunConfig, grad_accum=(1, 2, 4, 8), refresh: bool = False) -> Accumulation:
    """One cached run of ``cfg`` per number of accumulation steps."""
    return Accumulation(results.sweep(cfg, refresh=refresh, grad_accum=list(grad_accum)))

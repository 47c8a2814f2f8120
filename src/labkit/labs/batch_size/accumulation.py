"""Section 4 of notebook 02: gradient accumulation gives the whole batch's gradient, except where BatchNorm
normalises each micro-batch on its own; what it does to peak memory and step time."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ... import data, models
from ...config import RunConfig
from ...display import number, quantity
from ...env import resolve_device, set_tf32
from ...errors import ConfigError
from ...messages import worded
from ...train import run_splits
from ...units import change, mib, ratio
from ...validate import is_int
from ._shared import apart

BATCHNORM_MODES = ("train", "eval", "none")


def without_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` by ``nn.Identity`` (in place) and return it.

    Example:
        >>> model = without_batchnorm(models.build("small_cnn", 10)[0])
    """
    if isinstance(model, nn.modules.batchnorm._BatchNorm):
        return nn.Identity()
    for name, child in model.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, nn.Identity())
        else:
            without_batchnorm(child)
    return model


@dataclass
class AccumulationGap:
    """How far accumulated gradients are from the whole batch's: largest absolute difference, and
    relative to the largest gradient entry."""

    accum_steps: int
    batchnorm: str
    max_abs_diff: float
    max_abs_grad: float

    @property
    def relative(self) -> float:
        return self.max_abs_diff / self.max_abs_grad if self.max_abs_grad else math.nan


def _accumulation_gap(cfg: RunConfig, accum_steps: int, batchnorm: str) -> AccumulationGap:
    if batchnorm not in BATCHNORM_MODES:
        raise ConfigError("batchnorm", batchnorm, "'train' (as in training), 'eval' (running statistics) or "
                                                  "'none' (BatchNorm layers removed)")
    if not is_int(accum_steps) or accum_steps < 1 or cfg.batch_size % accum_steps:
        raise ConfigError("accum_steps", accum_steps, f"a divisor of batch_size={cfg.batch_size} "
                                                      "(each micro-batch is batch_size / accum_steps samples)")
    device = resolve_device(cfg.device)
    set_tf32(cfg.tf32)  # TF32 would add its own rounding (~1e-3) to the comparison
    split = run_splits(cfg)["train"]
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)[0]
    micro = cfg.batch_size // accum_steps
    if batchnorm == "none":
        model = without_batchnorm(model)
    elif batchnorm == "train" and micro < 2 and models.has_batchnorm(model):
        raise ConfigError("accum_steps", accum_steps, f"at most batch_size / 2 = {cfg.batch_size // 2}: BatchNorm "
                                                      "in train mode needs at least 2 samples per micro-batch")
    model = model.to(device).eval()  # dropout off: only the grouping of the samples differs
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(batchnorm == "train")
    x = data.to_model_input(split.images[:cfg.batch_size], split, device, size=cfg.image_size)
    y = split.labels[:cfg.batch_size].to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}  # BatchNorm's running statistics too
    params = [p for p in model.parameters() if p.requires_grad]

    def gradients(chunks: int) -> list[torch.Tensor]:
        model.load_state_dict(start)
        model.zero_grad(set_to_none=True)
        for micro_x, micro_y in zip(x.chunk(chunks), y.chunk(chunks), strict=True):
            (F.cross_entropy(model(micro_x), micro_y) / chunks).backward()
        return [p.grad.detach().clone() for p in params]

    whole, accumulated = gradients(1), gradients(accum_steps)
    diff = max(float((a - b).abs().max()) for a, b in zip(whole, accumulated, strict=True))
    largest = max(float(g.abs().max()) for g in whole)
    return AccumulationGap(accum_steps, batchnorm, diff, largest)


def accumulation_gap(cfg: RunConfig, accum_steps: int, batchnorm: str = "train") -> float:
    """Largest absolute difference between one batch's gradients and the same batch accumulated over micro-batches.

    Each micro-batch's loss is divided by ``accum_steps``; both start from the same weights, in fp32, dropout off.
    Without BatchNorm, or with it in eval mode, the gap is float rounding; in train mode it is real.

    Args:
        cfg: the model, dataset, batch size (``cfg.batch_size`` training samples), seed and device.
        accum_steps: micro-batches; must divide ``cfg.batch_size``.
        batchnorm: ``train``, ``eval`` or ``none`` (BatchNorm replaced by identity, see `without_batchnorm`).

    Example:
        >>> accumulation_gap(cfg, 4, batchnorm="none"), accumulation_gap(cfg, 4, batchnorm="train")
        (7.5e-09, 0.41)
    """
    return _accumulation_gap(cfg, accum_steps, batchnorm).max_abs_diff


def accumulation_table(cfg: RunConfig, accum_steps: int):
    """`accumulation_gap` for BatchNorm in train mode, in eval mode and removed, as a DataFrame.

    Args:
        cfg: as in `accumulation_gap`. accum_steps: micro-batches; must divide ``cfg.batch_size``.

    Returns:
        ``batchnorm``, ``accum_steps``, ``micro_batch_size``, ``max_abs_grad_diff``, ``max_abs_grad``,
        ``relative_diff`` (the gap over the largest gradient entry).

    Example:
        >>> accumulation_table(cfg, accum_steps=4)
    """
    rows = []
    for mode in BATCHNORM_MODES:
        gap = _accumulation_gap(cfg, accum_steps, mode)
        rows.append({"batchnorm": mode, "accum_steps": accum_steps, "micro_batch_size": cfg.batch_size // accum_steps,
                     "max_abs_grad_diff": gap.max_abs_diff, "max_abs_grad": gap.max_abs_grad,
                     "relative_diff": gap.relative})
    return pd.DataFrame(rows)


@worded
def accumulation_finding(df) -> str:
    """What the most accumulation steps did to peak memory and step time against none, from a ``grad_accum`` sweep."""
    ok = df[df["error"].isna()] if "error" in df else df
    ok = ok.sort_values("grad_accum")
    base, most = ok.iloc[0], ok.iloc[-1]
    slower, faster = apart(most, base, "step_time"), apart(base, most, "step_time")
    if slower is None or faster is None:
        noise = "no timing spread measured"
    elif slower or faster:
        noise = "outside the p10-p90 spreads"
    else:
        noise = "within the p10-p90 spreads: no measurable change"
    return (f"grad_accum={int(most['grad_accum'])} against {int(base['grad_accum'])}, the same batch of "
            f"{int(base['batch_size'])} in micro-batches of {int(most['batch_size'] // most['grad_accum'])}: peak "
            f"{mib(base['peak_memory_bytes'], '.3g')} -> {mib(most['peak_memory_bytes'], '.3g')} "
            f"({change(ratio(most['peak_memory_bytes'], base['peak_memory_bytes']))}), step "
            f"{quantity('step_time_s', base['step_time_s'])} -> {quantity('step_time_s', most['step_time_s'])} "
            f"({number(most['step_time_s'] / base['step_time_s'])}x, {noise}).")

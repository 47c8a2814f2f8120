"""Notebook 01, sections 1, 5 and 6: the three formats, what fp16 loses to underflow, the GradScaler's scale step
by step, and which ops autocast runs in which dtype (probed on the installed PyTorch)."""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F

from ... import data, results, train
from ...env import profile
from ...messages import note
from ...techniques.precision import DTYPES, Precision, autocast

FP16_SMALLEST_SUBNORMAL = 2.0**-24  # ~6e-8: anything smaller in magnitude rounds to 0 in fp16
FP16_SMALLEST_NORMAL = 2.0**-14  # ~6e-5: below it fp16 loses precision (subnormals)
FP16_MAX = 65504.0


def formats() -> pd.DataFrame:
    """fp32, fp16 and bf16 side by side, from ``torch.finfo``: bits, range and precision.

    Example:
        >>> formats().set_index("format").loc["fp16", "max"]
        65504.0
    """
    rows = []
    for name, dtype in {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.items():
        info = torch.finfo(dtype)
        mantissa = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
        rows.append({"format": name, "bits": info.bits, "exponent bits": info.bits - 1 - mantissa,
                     "mantissa bits": mantissa, "max": info.max, "smallest normal": info.tiny,
                     "smallest subnormal": info.smallest_normal * info.eps, "eps (precision near 1)": info.eps})
    return pd.DataFrame(rows)


def _first_batch(trainer):
    images, labels = next(iter(trainer.loader))
    x = data.to_model_input(images, trainer.train_split, trainer.device, trainer.cfg.channels_last,
                             trainer.cfg.image_size)
    return x, labels.to(trainer.device)


def _gradients(model, x, y, precision: Precision, device, loss_multiplier: float, scale: float) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with autocast(precision, device):
        loss = F.cross_entropy(model(x), y) * loss_multiplier
    (loss * scale).backward()
    return [p.grad.detach().float() / scale for p in model.parameters() if p.grad is not None]


def gradient_underflow(cfg, loss_multipliers=(1.0,), scale: float = 2.0**16) -> pd.DataFrame:
    """Count the gradient elements fp16 zeroes (non-zero in float32, exactly 0 in fp16), unscaled and scaled.

    Args:
        cfg: the run whose model and first batch are used (its precision is ignored).
        loss_multipliers: multiply the loss by each, e.g. 1e-3 to stand for a small loss.
        scale: the loss scale of the scaled run (2**16 is a GradScaler's initial scale).

    Returns:
        One row per (loss multiplier, run: fp32, fp16 unscaled, fp16 scaled): ``zeroed_gradients``,
        ``zeroed_fraction``, ``max_rel_error`` (largest |g - g_fp32| / max|g_fp32| over the parameter tensors),
        ``num_gradients``, ``fp32_below_fp16_subnormal`` (float32 gradient elements already below fp16's range).

    Example:
        >>> gradient_underflow(cfg, loss_multipliers=(1.0, 1e-3))[["run", "zeroed_gradients"]]
    """
    if isinstance(loss_multipliers, (int, float)):
        loss_multipliers = (loss_multipliers,)
    trainer = train.Trainer(cfg.replace(precision="fp32", evaluate=False))
    model, device = trainer.model, trainer.device
    x, y = _first_batch(trainer)
    fp16 = Precision("fp16", "fp16")
    rows = []
    for multiplier in loss_multipliers:
        runs = {
            "fp32": _gradients(model, x, y, Precision("fp32", "fp32"), device, multiplier, 1.0),
            "fp16, no scaling": _gradients(model, x, y, fp16, device, multiplier, 1.0),
            f"fp16, loss scaled by {scale:g}": _gradients(model, x, y, fp16, device, multiplier, scale),
        }
        reference = runs["fp32"]
        total = sum(g.numel() for g in reference)
        below = sum(int(((g != 0) & (g.abs() < FP16_SMALLEST_SUBNORMAL)).sum()) for g in reference)
        for run, grads in runs.items():
            pairs = list(zip(reference, grads, strict=True))
            zeroed = sum(int(((r != 0) & (g == 0)).sum()) for r, g in pairs)
            error = max(float((g - r).abs().max() / r.abs().max()) for r, g in pairs if r.abs().max() > 0)
            rows.append({"loss_multiplier": multiplier, "run": run, "zeroed_gradients": zeroed,
                         "zeroed_fraction": zeroed / total, "max_rel_error": error, "num_gradients": total,
                         "fp32_below_fp16_subnormal": below})
    model.zero_grad(set_to_none=True)
    return pd.DataFrame(rows)


def scaler_trace(cfg, steps: int | None = None, init_scale: float = 2.0**16, growth_interval: int = 2000,
                 refresh: bool = False):
    """Train in fp16 with a GradScaler and record its scale and the skipped steps, step by step (cached).

    Args:
        cfg: the run to train (its precision is set to fp16).
        steps: optimizer steps (default ``cfg.max_steps``; fewer where fp16 is emulated).
        init_scale: the scaler's first scale.
        growth_interval: clean steps in a row after which the scaler doubles the scale.
        refresh: train again instead of reading the cache.

    Returns:
        One row per optimizer step: ``step``, ``scale`` (used in that step), ``skipped``, ``loss``.

    Example:
        >>> tr = scaler_trace(cfg, steps=30); tr.skipped.sum()
    """
    trace = results.cached_frame("mp-scaler-trace", [cfg], lambda: _trace_scaler(cfg, steps, init_scale,
                                                                                   growth_interval),
                                 refresh=refresh, steps=steps, init_scale=init_scale, growth_interval=growth_interval)
    planned = steps or cfg.max_steps
    if planned and len(trace) < planned:  # said on every call, the cached one too
        note(f"fp16 is emulated here, so the scaler trace covers {len(trace)} of {planned} steps "
             f"(the {profile().name} profile's limit for emulated runs)")
    return trace


def _trace_scaler(cfg, steps: int | None, init_scale: float, growth_interval: int) -> pd.DataFrame:
    trainer = train.Trainer(cfg.replace(precision="fp16", evaluate=False))
    trainer.scaler = torch.amp.GradScaler(trainer.device.type, init_scale=init_scale,
                                          growth_interval=growth_interval)
    steps = steps or cfg.max_steps or len(trainer.loader)
    limit = train.emulated_step_limit(trainer.profile)
    if trainer.precision.emulated and steps > limit:
        steps = limit
    rows = []
    for step, (images, labels) in enumerate(trainer.batches(steps), start=1):
        scale = trainer.scaler.get_scale()  # reading it synchronises: fine here, nothing is timed
        loss = float(trainer.step(images, labels))
        rows.append({"step": step, "scale": scale, "skipped": trainer.scaler.get_scale() < scale, "loss": loss})
    return pd.DataFrame(rows)


AUTOCAST_PROBES = {
    # name: (what it stands for, function of a float32 input x of shape (8, 16))
    "linear (matmul)": lambda x: torch.nn.functional.linear(x, torch.ones(16, 16, device=x.device)),
    "conv2d": lambda x: torch.nn.functional.conv2d(x.view(8, 1, 4, 4), torch.ones(2, 1, 3, 3, device=x.device)),
    "relu": torch.relu,
    "add": lambda x: x + 1,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (16,)),
    "exp": torch.exp,
    "sum": torch.sum,
    "cross_entropy (loss)": lambda x: torch.nn.functional.cross_entropy(x, torch.zeros(8, dtype=torch.long,
                                                                                       device=x.device)),
    "mse_loss (loss)": lambda x: torch.nn.functional.mse_loss(x, torch.zeros_like(x)),
}


def autocast_dtypes(device: torch.device | str = "cpu", dtype: str = "bf16"):
    """What autocast does to each common op on ``device``, probed on the installed PyTorch (the lists differ
    between CPU and CUDA and between versions): each op runs under autocast on a float32 and a ``dtype`` input.

    Args:
        device: where to run the probes.
        dtype: ``fp16`` or ``bf16``.

    Returns:
        ``op``, ``from float32`` and ``from low precision`` (the output dtypes), ``autocast policy``.

    Example:
        >>> autocast_dtypes("cpu", "bf16").set_index("op").loc["softmax", "autocast policy"]
        'float32'
    """
    device = torch.device(device)
    low = DTYPES[dtype]
    x = torch.randn(8, 16, device=device)
    rows = []
    with torch.autocast(device.type, dtype=low):
        for op, fn in AUTOCAST_PROBES.items():
            from_fp32, from_low = fn(x).dtype, fn(x.to(low)).dtype
            if from_fp32 == low:
                policy = "low precision"
            elif from_low == torch.float32:
                policy = "float32"
            else:
                policy = "follows its input"
            rows.append({"op": op, "from float32": str(from_fp32).replace("torch.", ""),
                         "from low precision": str(from_low).replace("torch.", ""), "autocast policy": policy})
    return pd.DataFrame(rows)

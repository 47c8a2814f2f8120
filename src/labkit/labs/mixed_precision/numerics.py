"""Notebook 01, sections 1, 5 and 6: the three formats, what fp16 loses to underflow, the GradScaler's scale step
by step, and which ops autocast runs in which dtype (probed on the installed PyTorch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from ... import results, train
from ...env import profile
from ...labresult import LabResult
from ...messages import note, worded
from ...runsetup import set_up
from ...techniques.precision import DTYPES, Precision, autocast

FP16_SMALLEST_SUBNORMAL = 2.0**-24  # ~6e-8: anything smaller in magnitude rounds to 0 in fp16


def formats() -> LabResult:
    """fp32, fp16 and bf16 side by side, from ``torch.finfo``: bits, range and precision."""
    rows = []
    for name, dtype, mantissa in (("fp32", torch.float32, 23), ("fp16", torch.float16, 10),
                                  ("bf16", torch.bfloat16, 7)):
        info = torch.finfo(dtype)
        rows.append({"format": name, "bits": info.bits, "exponent bits": info.bits - 1 - mantissa,
                     "mantissa bits": mantissa, "max": info.max, "smallest normal": info.tiny,
                     "smallest subnormal": info.smallest_normal * info.eps, "eps (precision near 1)": info.eps})
    return LabResult(pd.DataFrame(rows), columns=["format", "exponent bits", "mantissa bits", "max", "smallest normal",
                                                  "smallest subnormal", "eps (precision near 1)"])


def _gradients(model, x, y, precision: Precision, device, loss_multiplier: float, scale: float) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with autocast(precision, device):
        loss = F.cross_entropy(model(x), y) * loss_multiplier
    (loss * scale).backward()
    return [p.grad.detach().float() / scale for p in model.parameters() if p.grad is not None]


@dataclass
class Underflow(LabResult):
    """Gradient elements fp16 zeroes (non-zero in float32, exactly 0 in fp16), unscaled and scaled."""

    shown = ("loss_multiplier", "run", "zeroed_gradients", "zeroed_fraction", "max_rel_error")


def gradient_underflow(cfg, loss_multipliers=(1.0,), scale: float = 2.0**16) -> Underflow:
    """The gradients of ``cfg``'s first batch in fp32, in fp16 and in fp16 with the loss scaled by ``scale``, the
    loss multiplied by each of ``loss_multipliers`` (1e-3 stands for a small loss); ``max_rel_error`` is the
    largest |g - g_fp32| / max|g_fp32| over the parameter tensors."""
    if isinstance(loss_multipliers, (int, float)):
        loss_multipliers = (loss_multipliers,)
    s = set_up(cfg.replace(precision="fp32", evaluate=False), techniques=True)
    batch, fp16 = s.batch(), Precision("fp16", "fp16")
    rows = []
    for multiplier in loss_multipliers:
        arms = (("fp32", Precision("fp32", "fp32"), 1.0), ("fp16, no scaling", fp16, 1.0),
                (f"fp16, loss scaled by {scale:g}", fp16, scale))
        runs = {run: _gradients(s.model, batch.images, batch.labels, precision, s.device, multiplier, factor)
                for run, precision, factor in arms}
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
    return Underflow(pd.DataFrame(rows))


@dataclass
class ScalerTrace(LabResult):
    """One row per optimizer step of an fp16 run: the GradScaler's ``scale``, ``skipped``, ``loss``."""

    shown = ("step", "scale", "skipped", "loss")

    @worded
    def finding(self) -> str:
        first, last = (f"2**{math.log2(s):.0f}" for s in self.frame["scale"].iloc[[0, -1]])
        return (f"{int(self.frame['skipped'].sum())} of {len(self.frame)} optimizer steps were skipped (inf/NaN "
                f"gradients); the scale went from {first} to {last} by the last step.")


def scaler_trace(cfg, steps: int | None = None, init_scale: float = 2.0**16, growth_interval: int = 2000,
                 refresh: bool = False) -> ScalerTrace:
    """Train ``cfg`` in fp16 with a GradScaler for ``steps`` (default ``cfg.max_steps``; fewer where fp16 is
    emulated) and record its scale and the skipped steps (cached)."""
    trace = results.cached_frame("mp-scaler-trace", [cfg], lambda: _trace_scaler(cfg, steps, init_scale,
                                                                                   growth_interval),
                                 refresh=refresh, steps=steps, init_scale=init_scale, growth_interval=growth_interval)
    planned = steps or cfg.max_steps
    if planned and len(trace) < planned:  # said on every call, the cached one too
        note(f"fp16 is emulated here, so the scaler trace covers {len(trace)} of {planned} steps "
             f"(the {profile().name} profile's limit for emulated runs)")
    return ScalerTrace(trace)


def _trace_scaler(cfg, steps: int | None, init_scale: float, growth_interval: int) -> pd.DataFrame:
    trainer = train.Trainer(cfg.replace(precision="fp16", evaluate=False))
    trainer.scaler = torch.amp.GradScaler(trainer.device.type, init_scale=init_scale,
                                          growth_interval=growth_interval)
    steps = steps or cfg.max_steps or len(trainer.loader)
    if trainer.precision.emulated:
        steps = min(steps, train.emulated_step_limit(trainer.profile))
    rows = []
    for step, (images, labels) in enumerate(trainer.batches(steps), start=1):
        scale = trainer.scaler.get_scale()  # reading it synchronises: fine here, nothing is timed
        loss = float(trainer.step(images, labels))
        rows.append({"step": step, "scale": scale, "skipped": trainer.scaler.get_scale() < scale, "loss": loss})
    return pd.DataFrame(rows)


AUTOCAST_PROBES = {  # name: a function of a float32 input x of shape (8, 16)
    "linear (matmul)": lambda x: F.linear(x, torch.ones(16, 16, device=x.device)),
    "conv2d": lambda x: F.conv2d(x.view(8, 1, 4, 4), torch.ones(2, 1, 3, 3, device=x.device)),
    "relu": torch.relu,
    "add": lambda x: x + 1,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "layer_norm": lambda x: F.layer_norm(x, (16,)),
    "exp": torch.exp,
    "sum": torch.sum,
    "cross_entropy (loss)": lambda x: F.cross_entropy(x, torch.zeros(8, dtype=torch.long, device=x.device)),
    "mse_loss (loss)": lambda x: F.mse_loss(x, torch.zeros_like(x)),
}


def autocast_dtypes(device: torch.device | str = "cpu", dtype: str = "bf16") -> LabResult:
    """Each of `AUTOCAST_PROBES` under autocast to ``dtype`` on ``device``, from a float32 and a ``dtype`` input:
    the output dtypes and the policy they show (the lists differ by device and PyTorch version)."""
    device, low = torch.device(device), DTYPES[dtype]
    x = torch.randn(8, 16, device=device)
    rows = []
    with torch.autocast(device.type, dtype=low):
        for op, fn in AUTOCAST_PROBES.items():
            from_fp32, from_low = fn(x).dtype, fn(x.to(low)).dtype
            policy = ("low precision" if from_fp32 == low else "float32" if from_low == torch.float32
                      else "follows its input")
            rows.append({"op": op, "from float32": str(from_fp32).replace("torch.", ""),
                         "from low precision": str(from_low).replace("torch.", ""), "autocast policy": policy})
    return LabResult(pd.DataFrame(rows))

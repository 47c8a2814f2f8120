"""Notebook 01, section 8: mixed precision on a language model, and the fp16-weights pitfall learners hit on a T4."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config import RunConfig
from ...messages import worded
from ...runsetup import set_up
from ...techniques.precision import autocast, grad_scaler, resolve_precision
from ...techniques.token_loss import forward_inputs, token_loss_sum
from ...units import change_between
from ...workloads import lm_speed_config
from .comparison import SetupRuns, compare, setup_label, speed_phrase


@dataclass
class LanguageModel(SetupRuns):
    """fp32 against ``low`` on the profile's language model."""

    shown = ("setup", "model", "step_time_s", "tokens_per_s", "peak_memory_bytes", "mem_activations_bytes")
    low: str = "bf16"

    @worded
    def finding(self) -> str:
        rows = {row["setup"]: row for _, row in self.frame.iterrows()}
        base, row = rows["fp32"], rows[setup_label(self.low)]
        if isinstance(row.get("error"), str):
            return f"{setup_label(self.low)} did not run on {base['model']}: {row['error']}"
        return (f"On {base['model']}: {setup_label(self.low)} ran {speed_phrase(row, base)}, "
                f"{row['tokens_per_s']:,.0f} tokens/s against {base['tokens_per_s']:,.0f}; peak memory "
                f"{change_between(row['peak_memory_bytes'], base['peak_memory_bytes'])}, activations "
                f"{change_between(row['mem_activations_bytes'], base['mem_activations_bytes'])}.")


def lm_compare(low: str, refresh: bool = False, **fields) -> LanguageModel:
    """fp32 against ``low`` on `labkit.workloads.lm_speed_config` (``fields`` override it), cached."""
    setups = {"fp32": {"precision": "fp32", "tf32": False}, setup_label(low): {"precision": low, "tf32": False}}
    return LanguageModel(compare(lm_speed_config(**fields), setups=setups, refresh=refresh, progress=False).frame,
                         low=low)


def _one_step(model: torch.nn.Module, batch, device: torch.device) -> float:
    precision = resolve_precision("fp16", device)
    scaler = grad_scaler(precision, device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with autocast(precision, device):
        loss = token_loss_sum(model(**forward_inputs(batch)).logits, batch.labels) / batch.counts().label_tokens
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # unscales the gradients first: this is where fp16 ones are refused
    scaler.update()
    return float(loss.detach())


def fp16_weights_pitfall(model_name: str = "tiny_llama", device: str = "cpu") -> dict:
    """One fp16-autocast step with a GradScaler on a model loaded in fp16, then on the same model in float32:
    ``error`` (what the first raised, or None), ``fixed_loss``, ``trainable_dtype`` (of the fp16 model)."""
    s = set_up(RunConfig(model=model_name, dataset="digits_sort", pretrained=False, batch_size=8, train_size=8,
                         seq_len=32, device=device, seed=0))
    batch = s.batch()
    loaded_in_fp16 = s.model.half()  # what from_pretrained(..., torch_dtype=torch.float16) gives
    trainable_dtype = str(next(p.dtype for p in loaded_in_fp16.parameters() if p.requires_grad))
    error = None
    try:
        _one_step(loaded_in_fp16, batch, s.device)
    except ValueError as exc:  # GradScaler: "Attempting to unscale FP16 gradients."
        error = str(exc)
    fixed_loss = _one_step(loaded_in_fp16.float(), batch, s.device)  # float32 trainable weights, fp16 autocast
    return {"error": error, "fixed_loss": fixed_loss, "trainable_dtype": trainable_dtype}

"""Section 5 of notebook 08: QLoRA, LoRA over a 4-bit NF4 base (bitsandbytes' ``Linear4bit``) against a 16-bit base.
Each setup is built, trained and dropped in turn, so that a 1.5B model never sits in memory twice."""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import results, train
from ...config import RunConfig
from ...env import profile, resolve_device
from ...finetune.qlora import half_base, nf4_lora, qlora_dtypes, qlora_optimizer
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques.lora import ALL_LINEAR, add_lora, lora_layers
from ...units import mib
from .base import ALPHA, LORA_LR, QLORA_MODELS, fresh_model

# QLoRA's runs measure memory and step time over a few steps, unscored (Qwen2.5-1.5B: about a second a step on a T4)
QLORA_STEP_SHARE = 0.1
QLORA_COLUMNS = ("setup", "model", "base_weight_bytes", "bits_per_4bit_weight", "peak_memory_bytes",
                 "mem_parameters_bytes", "mem_activations_bytes", "step_time_s", "step_time_p10_s", "step_time_p90_s",
                 "tokens_per_s", "accuracy", "num_trainable_params", "optimizer", "precision_used", "steps", "error",
                 "warnings")
_FROM_RUN = ("peak_memory_bytes", "step_time_s", "step_time_p10_s", "step_time_p90_s", "tokens_per_s", "accuracy",
             "num_trainable_params", "precision_used", "steps", "error")  # a RunResult's, by the same names
BASE16 = "16-bit base"
NF4 = "NF4 base (QLoRA)"
# bits per weight of NF4 with double quantization: 4-bit codes, an 8-bit scale per block of 64, a float32 scale per
# 256 blocks (QLoRA's recipe and bitsandbytes' default)
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)


def base_linear_bytes(model: nn.Module) -> tuple[int, float | None]:
    """Bytes of the frozen base Linear weights, and the bits a 4-bit weight takes with its scales (or None)."""
    total, packed_bytes, packed_weights = 0, 0, 0
    for layer in lora_layers(model).values():
        weight = layer.base.weight
        size = weight.numel() * weight.element_size()
        if (state := getattr(weight, "quant_state", None)) is not None:
            nested = getattr(state, "state2", None)  # double quantization: the 8-bit scales' own scales and table
            size += sum(t.numel() * t.element_size() for t in [state.absmax, *([nested.absmax] if nested else [])])
            packed_bytes += size
            packed_weights += layer.base.in_features * layer.base.out_features
            size += nested.code.numel() * nested.code.element_size() if nested else 0  # in the bytes, not the bits
        total += size
    return total, (8 * packed_bytes / packed_weights if packed_weights else None)


def qlora_model(cfg: RunConfig, setup: str, rank: int = 8) -> nn.Module | str:
    """LoRA (``all-linear``) on ``cfg.model`` with a `BASE16` or `NF4` base, or why it cannot run here."""
    device = resolve_device(cfg.device)
    model = fresh_model(cfg, pretrained=True)
    if setup == BASE16:
        half, adapters, _ = qlora_dtypes(device)
        half_base(model, half)
        return add_lora(model, rank, ALPHA, ALL_LINEAR, dtype=adapters)
    return nf4_lora(model, device, rank, ALPHA)


def qlora_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` as QLoRA's runs take it: `QLORA_MODELS`' model, 16 bits, `QLORA_STEP_SHARE` of the steps, unscored."""
    prof = profile()
    name, pretrained = QLORA_MODELS[prof.name]
    device = resolve_device(cfg.device)
    fewest = prof.warmup_steps + train.PROFILING_STEPS + 2  # a few timed steps after the untimed ones
    steps = max(fewest, math.ceil((cfg.max_steps or prof.max_steps) * QLORA_STEP_SHARE))
    return cfg.replace(model=name, pretrained=pretrained, precision=qlora_dtypes(device)[2], lr=LORA_LR,
                       optimizer=qlora_optimizer(device), max_steps=steps, epochs=1, evaluate=False)


@dataclass
class QLoRAComparison(LabResult):
    """LoRA on a 16-bit base and on an NF4 base, one row each (``error`` says why one did not run here)."""

    shown = ("setup", "model", "base_weight_bytes", "bits_per_4bit_weight", "peak_memory_bytes", "step_time_s",
             "tokens_per_s")

    @worded
    def finding(self) -> str:
        rows = self.frame.set_index("setup")
        half, nf4 = rows.loc[BASE16], rows.loc[NF4]
        if isinstance(half.get("error"), str) and half.get("error"):
            return f"The 16-bit base did not run here: {half.error}."
        if isinstance(nf4.get("error"), str) and nf4.get("error"):
            return f"QLoRA did not run here: {nf4.error}. The 16-bit base alone: peak {mib(half.peak_memory_bytes)}."
        saved = half.base_weight_bytes - nf4.base_weight_bytes
        verdict = (f"the weights saved were {saved / half.peak_memory_bytes:.0%} of the 16-bit peak"
                   if nf4.peak_memory_bytes < half.peak_memory_bytes else
                   "no saving: the weights are a small part of this peak")
        step = compare(Measured.row(nf4, "step_time_s"), Measured.row(half, "step_time_s"), ("faster", "slower"))
        return (f"On {half.model}, NF4 weights {nf4.base_weight_bytes / half.base_weight_bytes:.0%} of the 16-bit "
                f"base's ({mib(half.base_weight_bytes)} -> {mib(nf4.base_weight_bytes)}, "
                f"{nf4.bits_per_4bit_weight:.3g} bits a 4-bit weight); peak {mib(half.peak_memory_bytes)} -> "
                f"{mib(nf4.peak_memory_bytes)} ({nf4.peak_memory_bytes / half.peak_memory_bytes:.2f}x): {verdict}; "
                f"step time {step}.")


def qlora_comparison(cfg: RunConfig, rank: int = 8, refresh: bool = False) -> QLoRAComparison:
    """Fine-tune LoRA on each base of `qlora_model` (cached), as `qlora_config` sets the run."""
    run_cfg = qlora_config(cfg)
    frame = results.cached_frame("lora-qlora", [run_cfg], lambda: pd.DataFrame(
        [_qlora_row(run_cfg, setup, rank) for setup in (BASE16, NF4)]).reindex(columns=list(QLORA_COLUMNS)),
        refresh=refresh, rank=rank)
    return QLoRAComparison(frame)


def _qlora_row(cfg: RunConfig, setup: str, rank: int) -> dict:
    model = qlora_model(cfg, setup, rank)
    if isinstance(model, str):
        return {"setup": setup, "model": cfg.model, "error": model}
    base_bytes, bits = base_linear_bytes(model)
    row = {"setup": setup, "model": cfg.model, "base_weight_bytes": base_bytes, "bits_per_4bit_weight": bits,
           "optimizer": cfg.optimizer}
    try:
        result = train.fit(cfg, model=model, progress=False)
    except Exception as exc:  # out of memory, a non-finite loss (fp16 overflow), a torch error: this row's error
        result, row["error"] = None, f"{type(exc).__name__}: {exc}"
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if result is None:
        return row
    result.model = None
    return {**row, **{c: getattr(result, c) for c in _FROM_RUN}, "mem_parameters_bytes": result.memory.get(
        "parameters"), "mem_activations_bytes": result.memory.get("activations"), "warnings": " ".join(result.warnings)}

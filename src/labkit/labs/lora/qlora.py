"""Section 6 of notebook 08: QLoRA, LoRA over a 4-bit NF4 base (bitsandbytes' ``Linear4bit``) against a 16-bit base.

Three setups fine-tune LoRA on every Linear layer in 16-bit autocast (bf16; fp16 on a GPU without native bf16,
`qlora_dtypes`): a 16-bit base; an NF4 base computing in 16 bits and passing them on, as a 16-bit model does
(QLoRA); and the same NF4 layers as bitsandbytes ships them, which return their input's dtype (float32 after a
LayerNorm under autocast).
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch
from torch import nn

from ... import machine, models, results, train
from ...config import RunConfig
from ...env import profile, resolve_device
from ...messages import worded
from ...techniques import quantization
from ...techniques.lora import ALL_LINEAR, add_lora, lora_layers, matching_linears
from ...units import mib
from .base import ALPHA, LORA_LR, fresh_model

# QLoRA's runs take this share of the profile's steps (at least a few timed ones): memory and step time settle
# within a few steps, and the bases are compared with each other, at the same steps.
QLORA_STEP_SHARE = 0.3
QLORA_COLUMNS = ("setup", "base_weight_bytes", "peak_memory_bytes", "mem_parameters_bytes", "mem_activations_bytes",
                 "step_time_s", "step_time_p10_s", "step_time_p90_s", "accuracy", "num_trainable_params",
                 "precision_used", "steps", "error", "warnings")


def _base_linear_bytes(model: nn.Module) -> int:
    """Bytes of the frozen base Linear layers' weights (4-bit ones with their block scales)."""
    total = 0
    for layer in lora_layers(model).values():
        weight = layer.base.weight
        total += weight.numel() * weight.element_size()
        state = getattr(weight, "quant_state", None)
        if state is not None:  # one scale per block of 64; double quantization stores them in 8 bits plus their own
            total += state.absmax.numel() * state.absmax.element_size()
            nested = getattr(state, "state2", None)
            if nested is not None:
                total += nested.absmax.numel() * nested.absmax.element_size()
                total += nested.code.numel() * nested.code.element_size()
    return total


NF4 = "NF4 base (QLoRA)"
# bits per weight of NF4 with double quantization: 4-bit codes, an 8-bit scale per block of 64, a float32 scale per
# 256 of those (QLoRA's recipe and bitsandbytes' default)
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
NF4_FLOAT32 = "NF4 base, float32 out"


BASE16 = "16-bit base"


def qlora_dtypes(device: torch.device) -> tuple[torch.dtype, torch.dtype, str]:
    """The 16-bit dtype of the base and NF4's compute, the adapters' dtype, and the run's precision.

    bf16 where it is native (Ampere+, and on a CPU, where autocast supports it best); fp16 on a GPU without
    native bf16 (a T4 would emulate bf16), with float32 adapters: a GradScaler cannot unscale fp16 gradients.

    Args:
        device: where the fine-tune runs.
    """
    if torch.device(device).type == "cuda" and not machine.here().bf16_native:
        return torch.float16, torch.float32, "fp16"
    return torch.bfloat16, torch.bfloat16, "bf16"


def _cast_out(dtype: torch.dtype):
    def hook(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
        return output.to(dtype)

    return hook


def qlora_models(cfg: RunConfig, rank: int = 8) -> dict[str, nn.Module | str]:
    """LoRA (``all-linear``) on three copies of the pretrained model, by setup name.

    Args:
        cfg: the workload. rank: the LoRA rank.

    Returns:
        dict: `BASE16` (16-bit Linear layers, `qlora_dtypes`), `NF4` (QLoRA: ``Linear4bit`` computing in 16 bits
        and passing them on) and `NF4_FLOAT32` (the same layers as shipped, returning their input's dtype). Where
        NF4 cannot run, its value is the reason.
    """
    device = resolve_device(cfg.device)
    half, adapters, _ = qlora_dtypes(device)
    model = fresh_model(cfg, pretrained=True)
    base = copy.deepcopy(model)
    for name in matching_linears(base, ALL_LINEAR):
        base.get_submodule(name).to(half)
    built = {BASE16: add_lora(base, rank, ALPHA, ALL_LINEAR, dtype=adapters).to(device)}
    reason = quantization.supported("nf4_bnb", device)
    head = [name for name, m in model.named_modules() if m is models.named_stages(model)[-1][1]]
    for setup in (NF4, NF4_FLOAT32):
        if reason is not None:
            built[setup] = reason
            continue
        nf4 = quantization.quantize(model.to(device), "nf4_bnb", keep_float=head)
        for layer in nf4.modules():
            if hasattr(layer, "compute_dtype"):  # QLoRA computes in 16 bits (labkit's quantize picks float32 on a CPU)
                layer.compute_dtype = half
                if setup == NF4:
                    layer.register_forward_hook(_cast_out(half))
        built[setup] = add_lora(nf4, rank, ALPHA, ALL_LINEAR, dtype=adapters)
    return built


def qlora_comparison(cfg: RunConfig, rank: int = 8, refresh: bool = False) -> pd.DataFrame:
    """Fine-tune LoRA on each of `qlora_models` in 16-bit autocast, for `QLORA_STEP_SHARE` of the steps (cached).

    Args:
        cfg: the workload. rank: the LoRA rank. refresh: run again.

    Returns:
        DataFrame: `QLORA_COLUMNS`; base_weight_bytes are the frozen Linear weights, error says why NF4 did not
        run here, if it did not.
    """
    prof = profile()
    fewest = prof.warmup_steps + train.PROFILING_STEPS + 2  # a few timed steps after the untimed ones
    steps = max(fewest, math.ceil((cfg.max_steps or prof.max_steps) * QLORA_STEP_SHARE))
    run_cfg = cfg.replace(precision=qlora_dtypes(resolve_device(cfg.device))[2], lr=LORA_LR, max_steps=steps, epochs=1)
    return results.cached_frame("lora-qlora", [run_cfg], lambda: _qlora_frame(run_cfg, rank),
                                refresh=refresh, rank=rank)


def _qlora_frame(cfg: RunConfig, rank: int) -> pd.DataFrame:
    return pd.DataFrame(_qlora_rows(cfg, rank)).reindex(columns=list(QLORA_COLUMNS))


def _qlora_rows(cfg: RunConfig, rank: int) -> list[dict]:
    rows = []
    for setup, model in qlora_models(cfg, rank).items():
        if isinstance(model, str):
            rows.append({"setup": setup, "error": model})
            continue
        base_bytes = _base_linear_bytes(model)
        result = train.fit(cfg, model=model, progress=False)
        rows.append({"setup": setup, "base_weight_bytes": base_bytes, "peak_memory_bytes": result.peak_memory_bytes,
                     "mem_parameters_bytes": result.memory.get("parameters"),
                     "mem_activations_bytes": result.memory.get("activations"), "step_time_s": result.step_time_s,
                     "step_time_p10_s": result.step_time_p10_s, "step_time_p90_s": result.step_time_p90_s,
                     "accuracy": result.accuracy, "num_trainable_params": result.num_trainable_params,
                     "precision_used": result.precision_used, "steps": result.steps, "error": result.error,
                     "warnings": " ".join(result.warnings)})
    return rows


@worded
def qlora_finding(frame: pd.DataFrame) -> str:
    """One line: the NF4 weights' share of bf16's, whether the peak fell, and what float32 outputs cost.

    Args:
        frame: `qlora_comparison`'s.
    """
    rows = frame.set_index("setup")
    bf16, nf4, shipped = rows.loc[BASE16], rows.loc[NF4], rows.loc[NF4_FLOAT32]
    if isinstance(nf4.get("error"), str) and nf4.get("error"):
        return f"QLoRA did not run here: {nf4.error}. The 16-bit base alone: peak {mib(bf16.peak_memory_bytes)}."
    peak = nf4.peak_memory_bytes / bf16.peak_memory_bytes
    saved = bf16.peak_memory_bytes - nf4.peak_memory_bytes
    share_of_peak = (bf16.base_weight_bytes - nf4.base_weight_bytes) / bf16.peak_memory_bytes
    verdict = (f"the weights saved were {share_of_peak:.0%} of the peak" if saved > 0 else
               "no saving: the weights are a small part of this peak")
    return (f"NF4 weights {nf4.base_weight_bytes / bf16.base_weight_bytes:.0%} of the 16-bit base's "
            f"({mib(bf16.base_weight_bytes)} -> {mib(nf4.base_weight_bytes)}); peak {mib(bf16.peak_memory_bytes)} -> "
            f"{mib(nf4.peak_memory_bytes)} ({peak:.2f}x): {verdict}; as shipped (float32 out) the activations are "
            f"{shipped.mem_activations_bytes / nf4.mem_activations_bytes:.2f}x QLoRA's.")

"""Section 5 of notebook 08: QLoRA, LoRA over a 4-bit NF4 base (bitsandbytes' ``Linear4bit``) against a 16-bit base.

The model is `QLORA_MODELS`' for the profile (weights matter more in a larger one). Two setups fine-tune LoRA on
every Linear layer of the decoder in 16-bit autocast (bf16; fp16 on a GPU without native bf16, `qlora_dtypes`): a
16-bit base, and an NF4 base with double quantization computing in 16 bits and passing them on, as a 16-bit model
does (QLoRA; bitsandbytes' layers would return their input's dtype). The output layer stays in 16 bits, as QLoRA
keeps it, or in float32 with the embeddings where it is tied to them (Qwen2.5, SmolLM2), so that the residual stream
stays float32. A run that fails (out of memory, an fp16 overflow) is a row with its ``error``. On a CPU
bitsandbytes' 4-bit kernel takes only layers of 32k outputs and 64k inputs; the others stay in 16 bits
(`labkit.techniques.quantization`), and ``bits_per_4bit_weight`` counts the quantized ones. Where CUDA is present the
adapters train with bitsandbytes' paged 8-bit AdamW (`qlora_optimizer`), as QLoRA did. Each setup is
built, trained and dropped in turn, so that a 1.5B model never sits in memory twice.
"""

from __future__ import annotations

import gc
import math

import pandas as pd
import torch
from torch import nn

from ... import machine, models, results, train
from ...config import RunConfig
from ...env import profile, resolve_device
from ...messages import worded
from ...techniques import quantization
from ...techniques.lora import ALL_LINEAR, add_lora, linear_names, lora_layers, matching_linears
from ...units import mib
from .base import ALPHA, LORA_LR, QLORA_MODELS, fresh_model

# QLoRA's section measures memory and step time, which a few timed steps show; it does not score the runs (on a T4
# each step of Qwen2.5-1.5B is about a second, and a test split of 5,000 rows two minutes more a run).
QLORA_STEP_SHARE = 0.1
QLORA_COLUMNS = ("setup", "model", "base_weight_bytes", "bits_per_4bit_weight", "peak_memory_bytes",
                 "mem_parameters_bytes", "mem_activations_bytes", "step_time_s", "step_time_p10_s", "step_time_p90_s",
                 "tokens_per_s", "accuracy", "num_trainable_params", "optimizer", "precision_used", "steps", "error",
                 "warnings")


def _layer_bytes(weight: torch.Tensor) -> tuple[int, int]:
    """A base weight's bytes, and of them its lookup tables (a 4-bit layer's 256-entry map of its 8-bit scales)."""
    total, tables = weight.numel() * weight.element_size(), 0
    state = getattr(weight, "quant_state", None)
    if state is not None:  # one scale per block of 64; double quantization stores them in 8 bits plus their own
        total += state.absmax.numel() * state.absmax.element_size()
        nested = getattr(state, "state2", None)
        if nested is not None:
            tables = nested.code.numel() * nested.code.element_size()
            total += nested.absmax.numel() * nested.absmax.element_size() + tables
    return total, tables


def base_linear_bytes(model: nn.Module) -> tuple[int, float | None]:
    """Bytes of the frozen base Linear layers' weights (4-bit ones with their block scales and lookup table), and
    the bits each 4-bit weight takes with its scales (None without 4-bit layers).

    Args:
        model: a LoRA model (`qlora_model`'s). Each 4-bit layer also keeps a 1 kB lookup table of its 8-bit scales:
            it counts in the bytes, not in the bits per weight (half a bit a weight on a 128 x 128 layer, 0.001 on
            a 1.5B model's).
    """
    total, packed_bytes, packed_weights = 0, 0, 0
    for layer in lora_layers(model).values():
        size, tables = _layer_bytes(layer.base.weight)
        total += size
        if getattr(layer.base.weight, "quant_state", None) is not None:
            packed_bytes += size - tables
            packed_weights += layer.base.in_features * layer.base.out_features
    return total, (8 * packed_bytes / packed_weights if packed_weights else None)


NF4 = "NF4 base (QLoRA)"
# bits per weight of NF4 with double quantization: 4-bit codes, an 8-bit scale per block of 64, a float32 scale per
# 256 of those (QLoRA's recipe and bitsandbytes' default)
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)


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


def qlora_optimizer(device: torch.device) -> str:
    """QLoRA's optimizer: bitsandbytes' paged 8-bit AdamW on CUDA (its state pages out on a spike), else AdamW.

    Args:
        device: where the fine-tune runs (paging needs CUDA's unified memory).
    """
    if torch.device(device).type == "cuda" and quantization.installed_version("bitsandbytes"):
        return "paged_adamw8bit"
    return "adamw"


def _cast_out(dtype: torch.dtype):
    def hook(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
        return output.to(dtype)

    return hook


def qlora_model(cfg: RunConfig, setup: str, rank: int = 8) -> nn.Module | str:
    """LoRA (``all-linear``) of ``rank`` on ``cfg.model`` with the base of ``setup``, or why it cannot run here.

    Args:
        cfg: the run (`qlora_config`). setup: `BASE16` (16-bit Linear layers, `qlora_dtypes`) or `NF4` (QLoRA:
            ``Linear4bit`` with double quantization, computing in 16 bits and passing them on). rank: the LoRA rank.
    """
    device = resolve_device(cfg.device)
    half, adapters, _ = qlora_dtypes(device)
    if setup != BASE16 and (reason := quantization.supported("nf4_bnb", device)) is not None:
        return reason
    model = fresh_model(cfg, pretrained=True)
    chosen = matching_linears(model, ALL_LINEAR)
    others = [name for name in linear_names(model) if name not in chosen]  # the output layer: 16-bit in both
    # ... unless it is tied to the token embeddings: casting it would cast them, and the residual stream they start
    # would run in 16 bits (fp16 overflows it in Qwen2 checkpoints); tied, both stay float32, as PEFT's
    # prepare_model_for_kbit_training keeps every layer that is not quantized
    for name in chosen + ([] if models.output_layer_tied(model) else others):
        model.get_submodule(name).to(half)
    if setup == BASE16:
        return add_lora(model, rank, ALPHA, ALL_LINEAR, dtype=adapters)
    nf4 = quantization.quantize(model.to(device), "nf4_bnb", keep_float=others)
    del model
    for layer in nf4.modules():
        if hasattr(layer, "compute_dtype"):  # QLoRA computes in 16 bits (labkit's quantize picks float32 on a CPU)
            layer.compute_dtype = half
            layer.register_forward_hook(_cast_out(half))
    return add_lora(nf4, rank, ALPHA, ALL_LINEAR, dtype=adapters)


def qlora_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` as QLoRA's runs take it: the profile's `QLORA_MODELS` model, 16-bit autocast, LoRA's learning rate,
    `qlora_optimizer`, and `QLORA_STEP_SHARE` of the steps (at least a few timed ones), not evaluated.

    Args:
        cfg: the notebook's workload (its data and seed).
    """
    prof = profile()
    name, pretrained = QLORA_MODELS[prof.name]
    device = resolve_device(cfg.device)
    fewest = prof.warmup_steps + train.PROFILING_STEPS + 2  # a few timed steps after the untimed ones
    steps = max(fewest, math.ceil((cfg.max_steps or prof.max_steps) * QLORA_STEP_SHARE))
    return cfg.replace(model=name, pretrained=pretrained, precision=qlora_dtypes(device)[2], lr=LORA_LR,
                       optimizer=qlora_optimizer(device), max_steps=steps, epochs=1, evaluate=False)


def qlora_comparison(cfg: RunConfig, rank: int = 8, refresh: bool = False) -> pd.DataFrame:
    """Fine-tune LoRA on each base of `qlora_model` (cached), as `qlora_config` sets the run.

    Args:
        cfg: the workload. rank: the LoRA rank. refresh: run again.

    Returns:
        DataFrame: `QLORA_COLUMNS`; base_weight_bytes are the frozen Linear weights, error says why NF4 did not
        run here, if it did not.
    """
    run_cfg = qlora_config(cfg)
    return results.cached_frame("lora-qlora", [run_cfg], lambda: _qlora_frame(run_cfg, rank),
                                refresh=refresh, rank=rank)


def _qlora_frame(cfg: RunConfig, rank: int) -> pd.DataFrame:
    return pd.DataFrame([_qlora_row(cfg, setup, rank) for setup in (BASE16, NF4)]).reindex(
        columns=list(QLORA_COLUMNS))


def _qlora_row(cfg: RunConfig, setup: str, rank: int) -> dict:
    model = qlora_model(cfg, setup, rank)
    if isinstance(model, str):
        return {"setup": setup, "model": cfg.model, "error": model}
    base_bytes, bits = base_linear_bytes(model)
    try:
        result = train.fit(cfg, model=model, progress=False)
    except Exception as exc:  # out of memory, a non-finite loss (fp16 overflow), a torch error: this row's error
        result = None
        error = f"{type(exc).__name__}: {exc}"
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if result is None:
        return {"setup": setup, "model": cfg.model, "base_weight_bytes": base_bytes, "bits_per_4bit_weight": bits,
                "optimizer": cfg.optimizer, "error": error}
    result.model = None
    return {"setup": setup, "model": cfg.model, "base_weight_bytes": base_bytes, "bits_per_4bit_weight": bits,
            "peak_memory_bytes": result.peak_memory_bytes, "mem_parameters_bytes": result.memory.get("parameters"),
            "mem_activations_bytes": result.memory.get("activations"), "step_time_s": result.step_time_s,
            "step_time_p10_s": result.step_time_p10_s, "step_time_p90_s": result.step_time_p90_s,
            "tokens_per_s": result.tokens_per_s, "accuracy": result.accuracy,
            "num_trainable_params": result.num_trainable_params, "optimizer": cfg.optimizer,
            "precision_used": result.precision_used, "steps": result.steps, "error": result.error,
            "warnings": " ".join(result.warnings)}


@worded
def qlora_finding(frame: pd.DataFrame) -> str:
    """One line: the NF4 weights' share of the 16-bit base's, and whether the peak fell with them.

    Args:
        frame: `qlora_comparison`'s.
    """
    rows = frame.set_index("setup")
    half, nf4 = rows.loc[BASE16], rows.loc[NF4]
    if isinstance(half.get("error"), str) and half.get("error"):
        return f"The 16-bit base did not run here: {half.error}."
    if isinstance(nf4.get("error"), str) and nf4.get("error"):
        return f"QLoRA did not run here: {nf4.error}. The 16-bit base alone: peak {mib(half.peak_memory_bytes)}."
    peak = nf4.peak_memory_bytes / half.peak_memory_bytes
    saved = half.peak_memory_bytes - nf4.peak_memory_bytes
    share_of_peak = (half.base_weight_bytes - nf4.base_weight_bytes) / half.peak_memory_bytes
    verdict = (f"the weights saved were {share_of_peak:.0%} of the 16-bit peak" if saved > 0 else
               "no saving: the weights are a small part of this peak")
    return (f"On {half.model}, NF4 weights {nf4.base_weight_bytes / half.base_weight_bytes:.0%} of the 16-bit "
            f"base's ({mib(half.base_weight_bytes)} -> {mib(nf4.base_weight_bytes)}, "
            f"{nf4.bits_per_4bit_weight:.3g} bits a 4-bit weight); peak {mib(half.peak_memory_bytes)} -> "
            f"{mib(nf4.peak_memory_bytes)} ({peak:.2f}x): {verdict}; step time "
            f"{nf4.step_time_s / half.step_time_s:.2f}x.")

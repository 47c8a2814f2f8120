"""QLoRA's model: LoRA adapters over a base whose decoder linear layers are 4-bit NF4 (bitsandbytes' ``Linear4bit``,
Dettmers et al. 2023), computing in 16 bits; and the same adapters over a 16-bit base, the comparison it is made
against. Notebook 08 and a learner's own fine-tune (`labkit.finetune`) build it here: it joins two mechanisms
(`labkit.techniques.quantization`, `labkit.techniques.lora`), which do not import each other.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import machine, models
from ..techniques import quantization
from ..techniques.lora import ALL_LINEAR, add_lora, linear_names, matching_linears


def qlora_dtypes(device: torch.device) -> tuple[torch.dtype, torch.dtype, str]:
    """The base's 16-bit dtype, the adapters' and the run's precision: fp16 and float32 adapters without native bf16
    on a GPU (a GradScaler cannot unscale fp16 gradients), else bf16."""
    if torch.device(device).type == "cuda" and not machine.here().bf16_native:
        return torch.float16, torch.float32, "fp16"
    return torch.bfloat16, torch.bfloat16, "bf16"


def qlora_optimizer(device: torch.device) -> str:
    """Bitsandbytes' paged 8-bit AdamW on CUDA (its state pages out on a spike, as QLoRA's did), else AdamW."""
    if torch.device(device).type == "cuda" and quantization.installed_version("bitsandbytes"):
        return "paged_adamw8bit"
    return "adamw"


def half_base(model: nn.Module, half: torch.dtype, targets=ALL_LINEAR) -> list[str]:
    """Cast ``model``'s ``targets`` linear layers to ``half`` (in place), and its other linear layers unless the output
    layer is tied to the token embeddings; returns the other linear layers' names (the ones NF4 leaves in float)."""
    chosen = matching_linears(model, targets)
    others = [name for name in linear_names(model) if name not in chosen]
    # a tied output layer stays float32: casting it would cast the embeddings, and the residual stream they start
    # would run in 16 bits (fp16 overflows it in Qwen2 checkpoints), as PEFT's prepare_model_for_kbit_training keeps
    for name in chosen + ([] if models.output_layer_tied(model) else others):
        model.get_submodule(name).to(half)
    return others


def nf4_lora(model: nn.Module, device: torch.device, rank: int, alpha: float, targets=ALL_LINEAR) -> nn.Module | str:
    """LoRA of ``rank`` over ``model`` with its ``targets`` in NF4 on ``device`` (a copy), or why this device cannot."""
    half, adapters, _ = qlora_dtypes(device)
    if (reason := quantization.supported("nf4_bnb", device)) is not None:
        return reason
    others = half_base(model, half, targets)
    nf4 = quantization.quantize(model.to(device), "nf4_bnb", keep_float=others)
    for layer in nf4.modules():
        if hasattr(layer, "compute_dtype"):  # QLoRA computes in 16 bits (labkit's quantize picks float32 on a CPU)
            layer.compute_dtype = half
            layer.register_forward_hook(lambda module, inputs, output: output.to(half))
    return add_lora(nf4, rank, alpha, targets, dtype=adapters)

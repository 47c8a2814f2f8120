"""Section 9 of notebook 01: mixed precision on a language model, and the fp16-weights pitfall learners hit on a T4.

`lm_compare` runs `labkit.workloads.lm_speed_config` (the profile's Llama on packed pydoc_text) in fp32 and in the
machine's low precision (bf16 where native, fp16 + GradScaler on a T4): tokens/s, step time and its spread, peak
memory and activations. `fp16_weights_pitfall` trains one step of a model whose weights were loaded in fp16 under
fp16 autocast with a GradScaler, as a T4 learner often does, catches the error, and trains the same step again with
the trainable weights in float32.
"""

from __future__ import annotations

import pandas as pd
import torch

from ... import text
from ...messages import worded
from ...models import build_language_model
from ...techniques.precision import autocast, grad_scaler, resolve_precision
from ...techniques.token_loss import forward_inputs, token_loss_sum
from ...units import change_between
from ...workloads import lm_speed_config
from .comparison import compare, low_setup, speed_phrase, table


def lm_compare(low: str, refresh: bool = False, **fields) -> pd.DataFrame:
    """fp32 against ``low`` on the profile's language model (cached runs); `table`'s frame with tokens/s.

    Args:
        low: ``bf16`` or ``fp16`` (`labkit.techniques.precision.low_precision_for`).
        refresh: train again. fields: `lm_speed_config` fields (e.g. ``batch_size=8``).

    Example:
        >>> lm_compare("bf16")[["setup", "tokens_per_s", "peak_memory_bytes"]]
    """
    setups = {"fp32": {"precision": "fp32", "tf32": False}, low_setup(low): {"precision": low, "tf32": False}}
    return table(compare(lm_speed_config(**fields), setups, refresh=refresh, progress=False))


@worded
def lm_finding(frame: pd.DataFrame, low: str) -> str:
    """One line: the low precision's speed against fp32's (real only outside the noise), tokens/s and memory."""
    rows = {row["setup"]: row for _, row in frame.iterrows()}
    base, row = rows["fp32"], rows[low_setup(low)]
    if isinstance(row.get("error"), str):
        return f"{low_setup(low)} did not run on {base['model']}: {row['error']}"
    return (f"On {base['model']}: {low_setup(low)} ran {speed_phrase(row, base)}, {row['tokens_per_s']:,.0f} "
            f"tokens/s against {base['tokens_per_s']:,.0f}; peak memory "
            f"{change_between(row['peak_memory_bytes'], base['peak_memory_bytes'])}, activations "
            f"{change_between(row['mem_activations_bytes'], base['mem_activations_bytes'])}.")


def _one_step(model: torch.nn.Module, batch: text.TokenBatch, device: torch.device) -> float:
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
    """One fp16-autocast step with a GradScaler on a model loaded in fp16, then on the same model in float32.

    Args:
        model_name: a labkit Llama (random weights). device: where to run (a CPU runs fp16 autocast too).

    Returns:
        dict: ``error`` (what the fp16-weights step raised, None if it did not), ``fixed_loss`` (the float32-weights
        step's loss), ``trainable_dtype`` (the fp16 model's trainable parameters' dtype).
    """
    device = torch.device(device)
    torch.manual_seed(0)
    split = text.load_text_splits("digits_sort", 8, 1, 1, seq_len=32)["train"]
    batch = text.collate([split[i] for i in range(8)]).to(device)
    model = build_language_model(model_name, split.tokenizer.vocab_size, pretrained=False)[0].to(device)
    loaded_in_fp16 = model.half()  # what from_pretrained(..., torch_dtype=torch.float16) gives
    trainable_dtype = str(next(p.dtype for p in loaded_in_fp16.parameters() if p.requires_grad))
    error = None
    try:
        _one_step(loaded_in_fp16, batch, device)
    except ValueError as exc:  # GradScaler: "Attempting to unscale FP16 gradients."
        error = str(exc)
    fixed_loss = _one_step(loaded_in_fp16.float(), batch, device)  # trainable weights in float32, autocast in fp16
    return {"error": error, "fixed_loss": fixed_loss, "trainable_dtype": trainable_dtype}

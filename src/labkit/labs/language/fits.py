"""Section 10 of notebook 10, what fits a T4: fine-tuning memory by formula (`labkit.capacity.lm_training_memory`)
for models of 0.1B to 7B parameters, each fully fine-tuned, with LoRA and with QLoRA, against a T4's 15 GiB and the
learner's own GPU."""

from __future__ import annotations

import pandas as pd
import torch

from ...capacity.lm_memory import decoder_shape, lm_training_memory
from ...display import number
from ...messages import worded
from ...models.hub import DecoderShape

T4_USABLE_BYTES = 15 * 2**30  # a T4's 16 GiB, less what CUDA's context and the allocator's caching take
# mistralai/Mistral-7B-v0.1's config.json (Apache-2.0): not built by labkit, only sized here.
MISTRAL_7B = DecoderShape(4096, 14336, 32, 32, 8, 32000, False, 32768)
SIZES = {"SmolLM2-135M": "smollm2_135m", "Qwen2.5-0.5B": "qwen2.5_0.5b", "Qwen2.5-1.5B": "qwen2.5_1.5b",
         "Mistral-7B": MISTRAL_7B}
METHOD_NAMES = {"full": "full fine-tune", "lora": "LoRA", "qlora": "QLoRA"}
SETTINGS = {"seq_len": 512, "micro_batch": 4, "precision": "fp16", "checkpointing": True, "lora_rank": 16,
            "lora_targets": "all"}


def own_gpu_bytes() -> int | None:
    """This machine's first GPU's memory in bytes, or None without one."""
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def t4_table(gpu_bytes: int | None = None, **settings) -> pd.DataFrame:
    """Fine-tuning memory for each model in `SIZES` x full / LoRA / QLoRA, and whether it fits a T4 and your GPU.

    Args:
        gpu_bytes: your GPU's memory (None: this machine's, if it has one).
        settings: `lm_training_memory` arguments replacing `SETTINGS` (512 tokens x 4 rows, fp16 autocast,
            per-layer checkpointing, rank-16 adapters on every linear layer, AdamW).

    Returns:
        A frame: ``model``, ``num_params``, ``method``, ``total_bytes``, ``fits_t4``, ``fits_your_gpu`` (``no GPU``
        without one), and the categories (``weights_bytes``, ...).

    Example:
        >>> t4_table()[["model", "method", "total_bytes", "fits_t4"]]
    """
    settings = {**SETTINGS, **settings}
    gpu_bytes = own_gpu_bytes() if gpu_bytes is None else gpu_bytes
    rows = []
    for label, model in SIZES.items():
        for method, name in METHOD_NAMES.items():
            parts = lm_training_memory(model, method, **settings)
            total = parts.pop("total")
            rows.append({"model": label, "num_params": decoder_shape(model).num_parameters(), "method": name,
                         "total_bytes": total, "fits_t4": "yes" if total <= T4_USABLE_BYTES else "no",
                         "fits_your_gpu": "no GPU" if gpu_bytes is None else ("yes" if total <= gpu_bytes else "no"),
                         **{f"{k}_bytes": v for k, v in parts.items()}})
    return pd.DataFrame(rows)


@worded
def t4_finding(table: pd.DataFrame) -> str:
    """The largest model each method fits on a T4, and what the largest one needs with QLoRA."""
    parts = []
    for method in METHOD_NAMES.values():
        rows = table[(table["method"] == method) & (table["fits_t4"] == "yes")]
        largest = rows.loc[rows["num_params"].idxmax(), "model"] if len(rows) else "no model here"
        parts.append(f"{method} up to {largest}")
    biggest = table[table["num_params"] == table["num_params"].max()].set_index("method")
    gib = {m: number(biggest.loc[m, "total_bytes"] / 2**30) for m in METHOD_NAMES.values()}
    return (f"On a T4 (15 GiB usable): {'; '.join(parts)}. {biggest.iloc[0]['model']} needs {gib['full fine-tune']} "
            f"GiB fully fine-tuned, {gib['LoRA']} GiB with LoRA and {gib['QLoRA']} GiB with QLoRA.")

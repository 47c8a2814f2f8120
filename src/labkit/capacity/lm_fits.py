"""What fits a GPU: fine-tuning memory by formula (`lm_training_memory`) for decoder models of 0.1B to 7B parameters,
each fully fine-tuned, with LoRA and with QLoRA, against a T4's usable memory and the learner's own GPU.

Notebooks 08 (LoRA) and 10 (language models) print it; `lm_training_memory` states its error against measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .. import machine
from ..display import number
from ..labresult import LabResult
from ..messages import worded
from ..models.hub import HUB_MODELS, DecoderShape
from .lm_memory import decoder_shape, lm_training_memory

T4_USABLE_BYTES = machine.T4_TORCH_BYTES  # a T4's 16 GB as torch sees it: 14.56 GiB (`labkit.machine`)
# mistralai/Mistral-7B-v0.1's config.json (Apache-2.0): not built by labkit, only sized here.
MISTRAL_7B = DecoderShape(4096, 14336, 32, 32, 8, 32000, False, 32768)
# The published shapes (never `labkit.models.hub.shrunk_shape`'s): a plan is about the models learners download.
SIZES = {"SmolLM2-135M": HUB_MODELS["smollm2_135m"].shape, "Qwen2.5-0.5B": HUB_MODELS["qwen2.5_0.5b"].shape,
         "Qwen2.5-1.5B": HUB_MODELS["qwen2.5_1.5b"].shape, "Mistral-7B": MISTRAL_7B}
METHOD_NAMES = {"full": "full fine-tune", "lora": "LoRA", "qlora": "QLoRA"}
SETTINGS = {"seq_len": 512, "micro_batch": 4, "precision": "fp16", "checkpointing": True, "lora_rank": 16,
            "lora_targets": "all"}


def own_gpu_bytes() -> int | None:
    """What a run may use on this machine's first GPU (`labkit.machine.gpu_budget_bytes`: a described machine's
    memory, or what is free on a real one), or None without one."""
    return machine.gpu_budget_bytes()


def fits_table(gpu_bytes: int | None = None, **settings) -> pd.DataFrame:
    """Fine-tuning memory for each model in `SIZES` x full / LoRA / QLoRA, and whether it fits a T4 and your GPU.

    Args:
        gpu_bytes: your GPU's memory (None: this machine's, if it has one).
        settings: `lm_training_memory` arguments replacing `SETTINGS` (512 tokens x 4 rows, fp16 autocast,
            per-layer checkpointing, rank-16 adapters on every linear layer, AdamW).

    Returns:
        A frame: ``model``, ``num_params``, ``method``, ``total_bytes``, ``fits_t4``, ``fits_your_gpu`` (``no GPU``
        without one), and the categories (``weights_bytes``, ...).

    Example:
        >>> fits_table()[["model", "method", "total_bytes", "fits_t4"]]
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


@dataclass
class Fits(LabResult):
    """`fits_table`'s rows; the finding names the largest model each method fits where ``column`` (``fits_t4`` or
    ``fits_your_gpu``) says yes, on ``where``, and what the largest model needs with each method."""

    shown = ("model", "num_params", "method", "total_bytes", "fits_t4", "fits_your_gpu")
    column: str = "fits_t4"
    where: str = "a T4 (15 GiB usable)"

    @worded
    def finding(self) -> str:
        table, parts = self.frame, []
        for method in METHOD_NAMES.values():
            rows = table[(table["method"] == method) & (table[self.column] == "yes")]
            parts.append(f"{method} up to {rows.loc[rows['num_params'].idxmax(), 'model']}" if len(rows) else
                         f"{method}: none of these models")
        largest = table[table["num_params"] == table["num_params"].max()].set_index("method")
        gib = {key: number(largest.loc[name, "total_bytes"] / 2**30) for key, name in METHOD_NAMES.items()}
        return (f"On {self.where}: {'; '.join(parts)}. {largest.iloc[0]['model']} needs {gib['full']} GiB fully "
                f"fine-tuned, {gib['lora']} GiB with LoRA and {gib['qlora']} GiB with QLoRA.")


def gpu_fits(gpu_bytes: int | None = None, gpu_name: str | None = None, **settings) -> Fits:
    """`Fits` on your GPU (``gpu_bytes``, ``gpu_name``; default: this machine's), or on a T4 where there is none."""
    table = fits_table(gpu_bytes, **settings)
    if (table["fits_your_gpu"] == "no GPU").all():
        return Fits(table, column="fits_t4", where="a T4 (no GPU here)")
    return Fits(table, column="fits_your_gpu", where=gpu_name or "your GPU")

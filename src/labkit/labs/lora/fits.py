"""Section 6 of notebook 08, what fits my GPU: the formula (`labkit.capacity.lm_training_memory`) checked against
the peaks measured here, then applied to models of 0.1B to 7B parameters for a T4 and for the learner's GPU.

`estimate_check` runs full fine-tuning and LoRA (rank 8 on q and v, and on every linear layer) of the workload's
model in float32 with rows of one width, so that the formula sees exactly the tokens the run had, and sets the
formula's figure beside `labkit.fit`'s measured peak.
"""

from __future__ import annotations

import pandas as pd

from ... import results, train
from ...capacity.lm_fits import METHOD_NAMES, fits_table
from ...capacity.lm_memory import lm_training_memory
from ...config import RunConfig
from ...display import number
from ...env import profile
from ...messages import worded
from ...models.language import LANGUAGE_MODELS
from ...techniques.lora import ALL_LINEAR
from .base import ATTENTION, MERGE_RANK, lora_config

# The error `lm_training_memory` states for LoRA and full fine-tuning on labkit's Llamas, fp32 on a CPU (measured
# -12 % to +1 %: LoRA on q and v alone comes out lowest); the check below holds the live runs to it.
ESTIMATE_ERROR = 0.15
CHECK_SEQ_LEN = 32  # digits_sort's rows padded to one width: the formula's tokens are the run's


def check_configs(cfg: RunConfig, rank: int = MERGE_RANK) -> dict[str, RunConfig]:
    """The runs `estimate_check` measures, by label: full fine-tuning and LoRA on q,v and on every linear layer."""
    prof = profile()
    fixed = cfg.replace(packing="pad_max", seq_len=CHECK_SEQ_LEN, precision="fp32", evaluate=False, epochs=1,
                        max_steps=prof.warmup_steps + train.PROFILING_STEPS + 1)
    return {"full fine-tune": fixed, f"LoRA q,v r{rank}": lora_config(fixed, rank, "q_proj,v_proj"),
            f"LoRA all-linear r{rank}": lora_config(fixed, rank, ALL_LINEAR)}


def _estimate(run: RunConfig, vocab_size: int) -> int:
    method = "lora" if run.lora_rank else "full"
    targets = "all" if run.lora_targets == ALL_LINEAR else tuple(run.lora_targets or ATTENTION)
    return lm_training_memory(run.model, method, seq_len=run.seq_len, micro_batch=run.batch_size // run.grad_accum,
                              precision="fp32", lora_rank=run.lora_rank or 8, lora_targets=targets,
                              checkpointing=bool(run.checkpointing), attn_implementation=run.attn_implementation,
                              vocab_size=vocab_size if run.model in LANGUAGE_MODELS else None)["total"]


def estimate_check(cfg: RunConfig, rank: int = MERGE_RANK, refresh: bool = False) -> pd.DataFrame:
    """The formula's peak against the measured one for `check_configs` (cached runs).

    Args:
        cfg: the workload. rank: the LoRA rank. refresh: run again.

    Returns:
        DataFrame: setup, estimate_bytes, peak_memory_bytes (measured), estimate_error (estimate / measured - 1),
        tokens_per_step (one micro-batch's).
    """
    runs = check_configs(cfg, rank)
    done = results.run_configs(runs.values(), refresh=refresh, progress=False)
    vocab = train.run_splits(cfg, training=False)["train"].tokenizer.vocab_size
    rows = []
    for (label, run), result in zip(runs.items(), done, strict=True):
        estimate = _estimate(run, vocab)
        rows.append({"setup": label, "estimate_bytes": estimate, "peak_memory_bytes": result.peak_memory_bytes,
                     "estimate_error": estimate / result.peak_memory_bytes - 1 if result.peak_memory_bytes else None,
                     "tokens_per_step": run.seq_len * run.batch_size // run.grad_accum})
    return pd.DataFrame(rows)


@worded
def estimate_finding(frame: pd.DataFrame) -> str:
    """One line: how far the formula landed from each measured peak, against the error it states."""
    worst = frame.estimate_error.abs().max()
    parts = ", ".join(f"{row.setup} {row.estimate_error:+.1%}" for row in frame.itertuples())
    verdict = "within" if worst <= ESTIMATE_ERROR else "OUTSIDE"
    return (f"The formula against the measured peak at {frame.tokens_per_step.iloc[0]:,} tokens a step: {parts}; "
            f"{verdict} the ±{ESTIMATE_ERROR:.0%} it states.")


def gpu_table(gpu_bytes: int | None = None, seq_len: int = 512, micro_batch: int = 4) -> pd.DataFrame:
    """`labkit.capacity.fits_table` for 0.1B to 7B models at ``seq_len`` x ``micro_batch``: T4 and your GPU.

    Args:
        gpu_bytes: your GPU's memory (None: this machine's, if it has one). seq_len, micro_batch: tokens per row,
            rows per micro-batch (fp16 autocast, per-layer checkpointing, rank-16 adapters on every linear layer).
    """
    return fits_table(gpu_bytes, seq_len=seq_len, micro_batch=micro_batch)


@worded
def gpu_finding(table: pd.DataFrame, gpu_name: str | None = None) -> str:
    """The largest model each method fits on your GPU (or on a T4, with no GPU here).

    Args:
        table: `gpu_table`'s. gpu_name: your GPU's name, for the line.
    """
    column, where = ("fits_t4", "a T4 (no GPU here)") if (table.fits_your_gpu == "no GPU").all() else (
        "fits_your_gpu", gpu_name or "your GPU")
    parts = []
    for method in METHOD_NAMES.values():
        rows = table[(table["method"] == method) & (table[column] == "yes")]
        parts.append(f"{method} up to {rows.loc[rows.num_params.idxmax(), 'model']}" if len(rows) else
                     f"{method}: none of these models")
    largest = table[table.num_params == table.num_params.max()].set_index("method").total_bytes
    return (f"On {where}: {'; '.join(parts)}. The largest here needs "
            f"{number(largest[METHOD_NAMES['qlora']] / 2**30)} GiB with QLoRA and "
            f"{number(largest[METHOD_NAMES['full']] / 2**30)} GiB fully fine-tuned.")

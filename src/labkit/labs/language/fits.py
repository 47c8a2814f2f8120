"""Section 10 of notebook 10: fine-tuning memory by formula (`labkit.capacity.lm_training_memory`) for 0.1B-7B
models, fully fine-tuned, with LoRA and with QLoRA, against a T4 and the learner's GPU."""

from __future__ import annotations

from ...capacity.lm_fits import Fits, fits_table


def t4_fits(gpu_bytes: int | None = None, seq_len: int = 512, micro_batch: int = 4) -> Fits:
    """`labkit.capacity.lm_fits.Fits` on a T4 at ``seq_len`` x ``micro_batch`` (fp16, per-layer checkpointing,
    rank-16 adapters on every linear layer), with your GPU's column (``gpu_bytes`` None: this machine's)."""
    return Fits(fits_table(gpu_bytes, seq_len=seq_len, micro_batch=micro_batch))

"""Notebook 10 (language models): what makes language-model fine-tuning fast and small, one module per section."""

from .accumulation import accumulation_rules
from .attention import attention_memory
from .fits import t4_fits
from .kv_cache import cache_bytes_per_token, generation_speed, gqa_cache_sizes
from .ladder import RUNGS, speed_ladder
from .logits import chunked_loss_peaks, logits_sizes
from .packing import cross_document_check, packing_runs
from .speed import checkpointing_runs, compile_runs, optimizer_kernels, speed_config
from .throughput import flops_check
from .tokens import token_counts

__all__ = [
    "RUNGS", "accumulation_rules", "attention_memory", "cache_bytes_per_token", "checkpointing_runs",
    "chunked_loss_peaks", "compile_runs", "cross_document_check", "flops_check", "generation_speed", "gqa_cache_sizes",
    "logits_sizes", "optimizer_kernels", "packing_runs", "speed_config", "speed_ladder", "t4_fits", "token_counts",
]

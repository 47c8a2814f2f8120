"""Notebook 08 (LoRA and QLoRA) on a language model: its experiments, one module per section."""

from .base import QLORA_MODELS, TARGETS, fresh_model, library_versions, workload
from .counts import merge_comparison, paper_count, peft_comparison, peft_roundtrip, target_table
from .fits import ESTIMATE_ERROR, estimate_check, gpu_table
from .layer import blog_snippet, blog_snippet_problems
from .qlora import NF4_BITS, qlora_comparison
from .sweep import panel_config, panel_run, rank_sweep

__all__ = [
    "ESTIMATE_ERROR", "NF4_BITS", "QLORA_MODELS", "TARGETS", "blog_snippet", "blog_snippet_problems",
    "estimate_check", "fresh_model", "gpu_table", "library_versions", "merge_comparison", "panel_config",
    "panel_run", "paper_count", "peft_comparison", "peft_roundtrip", "qlora_comparison", "rank_sweep",
    "target_table", "workload",
]

"""Notebook 08 (LoRA and QLoRA): its experiments, one module per section; the notebook explains them.

- `layer`: `BlogLoRALayer`, a LoRA layer as widely copied from blog posts, and what goes wrong with it.
- `counts`: trainable parameters per rank and targets; the LoRA paper's 294,912; `peft_comparison` against PEFT.
- `sweep`: `rank_sweep`, rank 1-64 on ``qkv`` and on every Linear layer against full fine-tuning and head-only.
- `transformer`: a transformers model fine-tuned with PEFT (a hub model at ``full`` online, a local one otherwise).
- `qlora`: the base in 4-bit NF4 (bitsandbytes) against a 16-bit base, LoRA on both.
- `merge`: merged against unmerged inference; `panel`: the panel's run.

The mechanism is in `labkit.techniques.lora`. PEFT and transformers (the ``lora`` extra) are imported only by the
functions that use them, so that ``import labkit`` never pays for them.
"""

from .base import (
    ALPHA,
    ATTENTION,
    LORA_LR,
    MERGE_RANK,
    RANKS,
    TARGETS,
    VIT,
    library_versions,
    lora_config,
    targets_label,
    workload,
)
from .counts import PAPER, copy_adapters, paper_count, peft_comparison, target_table, to_peft
from .layer import BlogLoRALayer, blog_snippet, blog_snippet_problems
from .merge import merge_comparison, merge_finding
from .panel import LoRARun, panel_config, panel_run
from .qlora import (
    BASE16,
    NF4,
    NF4_BITS,
    NF4_FLOAT32,
    QLORA_COLUMNS,
    QLORA_STEP_SHARE,
    qlora_comparison,
    qlora_finding,
    qlora_models,
)
from .sweep import own_count_numbers, rank_sweep, sweep_chart_frame, sweep_configs, sweep_finding
from .transformer import (
    HUB_MODEL,
    SMALL_VIT,
    TRANSFORMER_STEPS,
    attention_targets,
    load_transformer,
    small_vit_from_tiny_vit,
    transformer_finding,
    transformer_finetune,
    transformer_source,
)

__all__ = [
    "ALPHA", "ATTENTION", "BASE16", "HUB_MODEL", "LORA_LR", "MERGE_RANK", "NF4", "NF4_BITS",
    "NF4_FLOAT32",
    "PAPER", "QLORA_COLUMNS", "QLORA_STEP_SHARE", "RANKS", "SMALL_VIT", "TARGETS", "TRANSFORMER_STEPS", "VIT",
    "BlogLoRALayer", "LoRARun", "attention_targets", "blog_snippet", "blog_snippet_problems", "copy_adapters",
    "library_versions", "load_transformer", "lora_config", "merge_comparison", "merge_finding", "own_count_numbers",
    "paper_count", "panel_config", "panel_run", "peft_comparison", "qlora_comparison", "qlora_finding",
    "qlora_models", "rank_sweep", "small_vit_from_tiny_vit", "sweep_chart_frame", "sweep_configs", "sweep_finding",
    "target_table", "targets_label", "to_peft", "transformer_finding", "transformer_finetune", "transformer_source",
    "workload"
]

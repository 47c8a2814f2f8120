"""Notebook 08 (LoRA and QLoRA) on a language model: its experiments, one module per section; the notebook explains.

- `base`: the workload (labkit's pretrained ``tiny_llama``, SmolLM2-135M at ``full``, on ``digits_sort``), LoRA's
  settings, the optional libraries.
- `layer`: `BlogLoRALayer`, a LoRA layer as widely copied from blog posts, and what goes wrong with it.
- `counts`: trainable parameters per rank and targets; the LoRA paper's 294,912; `peft_comparison` and
  `peft_roundtrip` against PEFT (outputs, gradients, ``save_pretrained``, reload, merge).
- `sweep`: `rank_sweep`, rank 1-64 on q,v and on every Linear layer against full fine-tuning and head-only.
- `qlora`: the base in 4-bit NF4 (bitsandbytes) against a 16-bit base, LoRA on both.
- `fits`: the memory formula checked against measured peaks, and what fits your GPU.
- `merge`: merged against unmerged inference; `panel`: the panel's run.

The mechanism is in `labkit.techniques.lora`. PEFT and transformers (the ``lora`` extra) are imported only by the
functions that use them, so that ``import labkit`` never pays for them.
"""

from .base import (
    ALPHA,
    ATTENTION,
    DATASET,
    FULL_LR,
    LM_MODELS,
    LORA_LR,
    MERGE_RANK,
    QLORA_MODELS,
    RANKS,
    TARGETS,
    fresh_model,
    library_versions,
    lora_config,
    targets_label,
    workload,
)
from .counts import (
    PAPER,
    copy_adapters,
    paper_count,
    peft_comparison,
    peft_roundtrip,
    roundtrip_finding,
    target_table,
    to_peft,
)
from .fits import CHECK_SEQ_LEN, ESTIMATE_ERROR, check_configs, estimate_check, estimate_finding, gpu_finding, gpu_table
from .layer import BlogLoRALayer, blog_snippet, blog_snippet_problems
from .merge import merge_comparison, merge_finding
from .panel import LoRARun, panel_config, panel_run
from .qlora import (
    BASE16,
    NF4,
    NF4_BITS,
    QLORA_COLUMNS,
    QLORA_STEP_SHARE,
    base_linear_bytes,
    qlora_comparison,
    qlora_config,
    qlora_dtypes,
    qlora_finding,
    qlora_model,
    qlora_optimizer,
)
from .sweep import own_count_numbers, rank_sweep, sweep_chart_frame, sweep_configs, sweep_finding

__all__ = [
    "ALPHA", "ATTENTION", "BASE16", "CHECK_SEQ_LEN", "DATASET", "ESTIMATE_ERROR", "FULL_LR", "LM_MODELS", "LORA_LR",
    "MERGE_RANK", "NF4", "NF4_BITS", "PAPER", "QLORA_COLUMNS", "QLORA_MODELS", "QLORA_STEP_SHARE", "RANKS", "TARGETS",
    "BlogLoRALayer", "LoRARun", "base_linear_bytes", "blog_snippet", "blog_snippet_problems", "check_configs",
    "copy_adapters", "estimate_check", "estimate_finding", "fresh_model", "gpu_finding", "gpu_table",
    "library_versions", "lora_config", "merge_comparison", "merge_finding", "own_count_numbers", "paper_count",
    "panel_config", "panel_run", "peft_comparison", "peft_roundtrip", "qlora_comparison", "qlora_config",
    "qlora_dtypes", "qlora_finding", "qlora_model", "qlora_optimizer", "rank_sweep", "roundtrip_finding",
    "sweep_chart_frame", "sweep_configs", "sweep_finding", "target_table", "targets_label", "to_peft", "workload",
]

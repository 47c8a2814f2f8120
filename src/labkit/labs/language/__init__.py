"""Notebook 10 (language models): what makes language-model fine-tuning fast and small. Its experiments, one module
per notebook section, and one verdict line per finding from their live numbers.

- `tokens` (1): characters against the pydoc BPE, a batch counted in tokens.
- `throughput` (2): 6 N + attention FLOPs per token against torch's FLOP counter, tokens/s, FLOP/s and MFU.
- `attention` (3): sequence length against memory, eager attention's L^2 probabilities against SDPA.
- `packing` (4): padding against packing on real text, and the cross-document pitfall (a cache in training).
- `accumulation` (5): gradient accumulation's two rules for token losses, the old one's error measured.
- `logits` (6): the logits' bytes (rows x length x vocabulary in fp32) and chunked cross-entropy's peaks.
- `speed` (7): per-layer checkpointing, AdamW's three kernels, torch.compile.
- `kv_cache` (8): generation with and without the KV cache, its bytes per token, GQA against MHA.
- `ladder` (9): one config climbed rung by rung.
- `fits` (10): what fits a T4: full fine-tuning, LoRA and QLoRA memory by formula for 0.1B-7B models.

A difference in time is called real only outside both runs' p10-p90 spreads (`labkit.measure.separated`). The
mechanisms are in `labkit.techniques` (`token_loss`, `chunked_loss`, `layer_checkpointing`, `compiling`) and
`labkit.text` (tokenizers, padding and packing).
"""

from .accumulation import RULES, accumulation_finding, accumulation_gradients, accumulation_losses
from .attention import IMPLEMENTATIONS, attention_finding, attention_memory, growth_exponent, probabilities_bytes
from .fits import SETTINGS, SIZES, T4_USABLE_BYTES, t4_finding, t4_table
from .kv_cache import (
    cache_bytes_per_token,
    cache_tensors_bytes,
    generate_greedy,
    generation_finding,
    generation_speed,
    gqa_cache_sizes,
    gqa_finding,
)
from .ladder import RUNGS, Ladder, ladder_configs, speed_ladder
from .logits import VOCAB_SIZES, chunked_loss_peaks, logits_finding, logits_sizes
from .packing import cross_document_check, cross_document_finding, packing_finding, packing_runs
from .speed import (
    OPTIMIZER_IMPLS,
    checkpointing_finding,
    checkpointing_runs,
    compile_finding,
    compile_runs,
    optimizer_finding,
    optimizer_kernels,
    speed_config,
)
from .throughput import flops_check, flops_finding, flops_per_token, lm_config, matmul_parameters
from .tokens import TOKENIZATIONS, batch_finding, batch_in_tokens, length_summary, paragraph_lengths, tokens_finding

__all__ = [
    "IMPLEMENTATIONS", "OPTIMIZER_IMPLS", "RULES", "RUNGS", "TOKENIZATIONS", "VOCAB_SIZES", "Ladder",
    "accumulation_finding", "accumulation_gradients", "accumulation_losses", "attention_finding", "attention_memory",
    "batch_finding", "batch_in_tokens", "cache_bytes_per_token", "cache_tensors_bytes", "checkpointing_finding",
    "checkpointing_runs", "chunked_loss_peaks", "compile_finding", "compile_runs", "cross_document_check",
    "cross_document_finding", "flops_check", "flops_finding", "flops_per_token", "generate_greedy",
    "generation_finding", "generation_speed", "gqa_cache_sizes", "gqa_finding", "growth_exponent", "ladder_configs",
    "length_summary", "lm_config", "logits_finding", "logits_sizes", "matmul_parameters", "optimizer_finding",
    "optimizer_kernels", "packing_finding", "packing_runs", "paragraph_lengths", "probabilities_bytes",
    "speed_config", "speed_ladder", "tokens_finding", "SETTINGS", "SIZES", "T4_USABLE_BYTES", "t4_finding", "t4_table",
]

"""Notebook 03 (memory savers): its experiments, and one verdict line per finding from their live numbers.

- `accounting`: `calculator_check`, `rounding_allowance`, `scale_table`, `optimizer_claim`: the bytes-per-parameter
  calculator (`labkit.capacity.training_memory`) checked against a measured step and applied to 7B and 175B models.
- `tradeoff`: `checkpoint_tradeoff`, `tradeoff_finding`: gradient checkpointing over the number of segments,
  memory against time, beside the cost model of Chen et al. 2016 (the sqrt(n) rule).
- `selective`: `checkpoint_variants`, `variants_finding`, `mlp_blocks`, `activation_peak`: plain, full and
  selective checkpointing on a stack of MLP blocks.
- `eight_bit`: `optimizer_state_table`, `state_summary`, `eight_bit_savings`, `eight_bit_numbers`,
  `eight_bit_finding`: bitsandbytes' 8-bit AdamW tensor by tensor, and why small tensors keep 32-bit state.
- `staged`: `staged_runs`: baseline, +AMP, +checkpointing, +8-bit optimizer and all together.
- `language`: `lm_staged`, `lm_finding`, `hub_scale_table`: the staged view on the profile's language model, and
  full fine-tuning's bytes per parameter for the hub models and a 7B one.

A step-time difference is called real only when the runs' p10-p90 spreads do not overlap. The mechanisms are in
`labkit.techniques.checkpointing` and `labkit.techniques.optimizers`.
"""

from .accounting import (
    CUDA_ROUNDING_BYTES,
    calculator_check,
    optimizer_claim,
    rounding_allowance,
    scale_table,
)
from .eight_bit import (
    BNB_BLOCK,
    eight_bit_finding,
    eight_bit_numbers,
    eight_bit_savings,
    optimizer_state_table,
    state_summary,
)
from .language import LM_SETUPS, hub_scale_table, lm_finding, lm_staged
from .selective import activation_peak, checkpoint_variants, mlp_blocks, variants_finding
from .staged import STAGES, StagedRuns, staged_runs
from .tradeoff import checkpoint_tradeoff, tradeoff_finding

__all__ = [
    "BNB_BLOCK", "CUDA_ROUNDING_BYTES", "LM_SETUPS", "STAGES", "StagedRuns", "activation_peak", "calculator_check",
    "checkpoint_tradeoff", "checkpoint_variants", "eight_bit_finding", "eight_bit_numbers", "eight_bit_savings",
    "hub_scale_table", "lm_finding", "lm_staged", "mlp_blocks", "optimizer_claim", "optimizer_state_table",
    "rounding_allowance", "scale_table", "staged_runs", "state_summary", "tradeoff_finding", "variants_finding",
]

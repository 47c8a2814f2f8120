"""Notebook 03 (memory savers): its experiments, each returning its frame and finding."""

from .accounting import calculator_check, optimizer_claim, scale_table
from .eight_bit import eight_bit_savings, optimizer_state_table
from .language import hub_scale_table, lm_staged
from .selective import checkpoint_variants
from .staged import staged_runs
from .tradeoff import checkpoint_tradeoff

__all__ = ["calculator_check", "checkpoint_tradeoff", "checkpoint_variants", "eight_bit_savings", "hub_scale_table",
           "lm_staged", "optimizer_claim", "optimizer_state_table", "scale_table", "staged_runs"]

"""Notebook 01 (mixed precision): fp32, TF32, fp16 with a GradScaler and bf16, measured and explained."""

from .comparison import SETUPS, compare, layouts, memory_savings, table
from .language import fp16_weights_pitfall, lm_compare
from .numerics import autocast_dtypes, formats, gradient_underflow, scaler_trace

__all__ = ["SETUPS", "autocast_dtypes", "compare", "formats", "fp16_weights_pitfall", "gradient_underflow", "layouts",
           "lm_compare", "memory_savings", "scaler_trace", "table"]

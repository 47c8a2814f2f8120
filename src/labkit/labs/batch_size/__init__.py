"""Notebook 02 (batch size): its experiments, each returning its frame and finding."""

from .accumulation import accumulation_sweep, accumulation_table, without_batchnorm
from .language import lm_accumulation
from .learning_rate import compare_lr_scaling, run_with_lr_scaling
from .prediction import estimate_frame, line_vs_search, max_batch_numbers, prediction_table
from .sweep import batch_sweep

__all__ = ["accumulation_sweep", "accumulation_table", "batch_sweep", "compare_lr_scaling", "estimate_frame",
           "line_vs_search", "lm_accumulation", "max_batch_numbers", "prediction_table", "run_with_lr_scaling",
           "without_batchnorm"]

"""Notebook 06 (quantization): its experiments, each returning its table and finding."""

from .language import ALL_INT8, FP32, HEAD_FLOAT, lm_quantization
from .methods import (
    TABLE_METHODS,
    flows,
    method_comparison,
    methods_table,
    panel_estimate,
    panel_run,
    stacking,
)
from .sensitivity import KEEP_FLOAT_CHOICES, SIMULATED_BITS, scheme_errors, sensitivity
from .workload import calibration_batches, fine_tuned, library_versions, qat_vs_ptq, workloads

__all__ = [
    "ALL_INT8", "FP32", "HEAD_FLOAT", "KEEP_FLOAT_CHOICES", "SIMULATED_BITS", "TABLE_METHODS", "calibration_batches",
    "fine_tuned", "flows", "library_versions", "lm_quantization", "method_comparison", "methods_table",
    "panel_estimate", "panel_run", "qat_vs_ptq", "scheme_errors", "sensitivity", "stacking",
    "workloads",
]

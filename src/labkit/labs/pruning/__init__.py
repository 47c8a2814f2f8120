"""Notebook 04 (pruning): its experiments, one module per section; the mechanisms are in `labkit.techniques.pruning`."""

from ...inference import accuracy, example_batch
from .channels import own_flops, structured
from .common import fine_tuned
from .panel import METHODS, panel_estimate, panel_run
from .rise import repeats
from .sensitivity import compare_ratios, sensitivity_scan
from .storage import largest_layer, semi_structured, sparse_storage
from .zeros import per_layer_sparsity, puzzle

__all__ = ["METHODS", "accuracy", "compare_ratios", "example_batch", "fine_tuned", "largest_layer", "own_flops",
           "panel_estimate", "panel_run", "per_layer_sparsity", "puzzle", "repeats", "semi_structured",
           "sensitivity_scan", "sparse_storage", "structured"]


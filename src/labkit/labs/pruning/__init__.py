"""Notebook 04 (pruning): its experiments, one module per section, and a one-line verdict per finding.

- `zeros` (section 1): magnitude pruning at 20-80 % leaves the file size, the inference memory and the latency
  where they were; only accuracy moves (`puzzle`, `puzzle_finding`, `per_layer_sparsity`).
- `storage` (section 2): the largest weight in COO and CSR against dense, in bytes and matmul time
  (`sparse_storage`, `storage_finding`); 2:4 sparsity (`semi_structured`).
- `sensitivity` (section 3): each layer pruned alone on the validation split; per-layer ratios chosen from it
  against one uniform ratio (`sensitivity_scan`, `choose_ratios`, `compare_ratios`, `ratios_finding`).
- `channels` (section 4): channels removed and the layers rebuilt (`structured`, `structured_finding`).
- `rise` (section 5): "accuracy rose after pruning", repeated over random seeds (`repeats`, `rise_finding`).
- `panel` (section 6): what the notebook's panel runs (`panel_run`, `panel_estimate`).

The explanation lives in the notebook; the mechanisms in `labkit.techniques.pruning`.
"""

from .channels import (
    RECALIBRATION_BATCHES,
    default_recovery_steps,
    flops_finding,
    flops_numbers,
    layer_flops,
    recover,
    structured,
    structured_finding,
    train_batches,
)
from .common import (
    LATENCY_BATCH,
    LATENCY_ROUNDS,
    _splits,
    accuracy,
    example_batch,
    fine_tuned,
    forward_flops,
    latencies,
    latencies_with_band,
    latency_band,
    nonzero_params,
)
from .panel import METHODS, PruneRun, panel_estimate, panel_run
from .rise import REPEAT_SEEDS, RISE_AMOUNTS, repeats, rise_finding, rise_summary
from .sensitivity import (
    SCAN_SPARSITIES,
    choose_ratios,
    compare_ratios,
    overall_sparsity,
    ratios_finding,
    ratios_line,
    sensitivity_scan,
)
from .storage import (
    STORAGE_SPARSITIES,
    SemiStructured,
    break_even,
    largest_layer,
    semi_structured,
    sparse_storage,
    storage_finding,
    storage_long,
    storage_numbers,
)
from .zeros import PUZZLE_AMOUNTS, per_layer_sparsity, puzzle, puzzle_finding

__all__ = [
    "LATENCY_BATCH", "LATENCY_ROUNDS", "METHODS", "PUZZLE_AMOUNTS", "RECALIBRATION_BATCHES", "REPEAT_SEEDS",
    "RISE_AMOUNTS", "SCAN_SPARSITIES", "STORAGE_SPARSITIES", "PruneRun", "SemiStructured", "_splits", "accuracy",
    "break_even", "choose_ratios", "compare_ratios", "default_recovery_steps", "example_batch", "fine_tuned",
    "flops_finding", "flops_numbers", "forward_flops", "largest_layer", "latencies", "latencies_with_band",
    "latency_band", "layer_flops", "nonzero_params", "overall_sparsity", "panel_estimate", "panel_run",
    "per_layer_sparsity", "puzzle", "puzzle_finding", "ratios_finding", "ratios_line", "recover", "repeats",
    "rise_finding", "rise_summary", "semi_structured", "sensitivity_scan", "sparse_storage", "storage_finding",
    "storage_long", "storage_numbers", "structured", "structured_finding", "train_batches",
]

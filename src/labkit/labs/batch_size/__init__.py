"""Notebook 02 (batch size): its experiments, and one verdict line per finding from their live numbers.

- `batch_sweep`: one run per batch size for the same number of epochs. Rows have `labkit.sweep`'s columns plus
  ``steps_per_epoch`` (train_size // batch_size); ``epoch_time_s`` (median step time x steps per epoch, warm-up
  excluded) with its spread ``epoch_time_p10_s`` / ``epoch_time_p90_s`` (the step times' 10th and 90th
  percentiles x steps); ``lr``, ``lr_scaling``, ``base_batch_size``; ``inference_time_s`` (predicting the test
  split in batches of that size: median latency of one batch x batches, the last counted as full) with
  ``inference_time_p10_s`` / ``inference_time_p90_s``, ``inference_per_sample_s`` and ``inference_batch_latency_s``.
  `folk_claims` tests four popular claims about the batch size against it; `epoch_time_floor`.
- `compare_lr_scaling`, `lr_scaling_finding`, `run_with_lr_scaling`: the same lr, the lr scaled with the batch
  (`labkit.techniques.optimizers.scale_lr`), and scaled with a warm-up.
- `accumulation_gap`, `accumulation_table`, `without_batchnorm`, `accumulation_finding`: gradient accumulation
  gives the gradient of the whole batch, except where BatchNorm normalises each micro-batch on its own.
- `lm_accumulation`, `lm_accumulation_finding`: a language model's step in tokens, split into micro-batches whose
  summed token losses are divided by the step's label tokens: the same losses, less memory.
- `prediction_table`, `prediction_finding`, `estimate_frame`: memory predicted from two batch sizes, checked
  against measured steps (`labkit.capacity`); `max_batch_numbers`, `line_vs_search` for the exercise.

A timing difference is called real only when the two runs' p10-p90 spreads do not overlap; an accuracy
difference only when it exceeds the test-set noise (`labkit.measure.accuracy_noise`).
"""

from .accumulation import (
    BATCHNORM_MODES,
    AccumulationGap,
    accumulation_finding,
    accumulation_gap,
    accumulation_table,
    without_batchnorm,
)
from .language import LM_ACCUM, LM_ROWS, lm_accumulation, lm_accumulation_finding
from .learning_rate import LR_SETTINGS, compare_lr_scaling, lr_scaling_finding, run_with_lr_scaling
from .prediction import (
    estimate_frame,
    line_vs_search,
    max_batch_numbers,
    prediction_finding,
    prediction_table,
)
from .sweep import FOLK_CLAIMS, INFERENCE_COLUMNS, batch_sweep, epoch_time_floor, folk_claims

__all__ = [
    "LM_ACCUM", "LM_ROWS", "lm_accumulation", "lm_accumulation_finding",
    "BATCHNORM_MODES", "FOLK_CLAIMS", "INFERENCE_COLUMNS", "LR_SETTINGS", "AccumulationGap",
    "accumulation_finding", "accumulation_gap", "accumulation_table", "batch_sweep", "compare_lr_scaling",
    "epoch_time_floor", "estimate_frame", "folk_claims", "line_vs_search", "lr_scaling_finding", "max_batch_numbers",
    "prediction_finding", "prediction_table", "run_with_lr_scaling", "without_batchnorm",
]

"""Notebook 05 (layer freezing): its experiments, one module per section, and a one-line verdict per finding.

- `levels` (sections 1 and 3): what each level freezes (`level_table`); one fine-tune per level from the same
  pretrained start and for the same steps (`level_sweep`, `levels_finding`); the popular claim that heavy
  freezing costs more accuracy than it saves time, checked (`tradeoff_finding`); the learner's own numbers for
  exercise ``05.own_backward`` (`backward_numbers`, `backward_check`).
- `backward` (section 3.1): the backward pass counted layer by layer (`backward_profile`).
- `batchnorm` (section 4): frozen BatchNorm layers in eval mode or not (`batchnorm_demo`).
- `caching` (section 5): the frozen body's output computed once, the head trained on it (`feature_caching`).
- `schedules` (section 6): gradual unfreezing and discriminative learning rates (`schedule_runs`).

The explanation lives in the notebook; the mechanism in `labkit.techniques.freezing`.
"""

from .backward import _layer_forward_flops, _model_and_batch, backward_profile
from .batchnorm import BatchNormDemo, batchnorm_demo
from .caching import FeatureCaching, feature_caching
from .common import GFLOP, _typical_step_s
from .levels import (
    SWEEP_LEVELS,
    backward_check,
    backward_numbers,
    level_sweep,
    level_table,
    levels_finding,
    time_band,
    tradeoff_finding,
)
from .schedules import SCHEDULES, schedule_finding, schedule_runs

__all__ = [
    "GFLOP", "SCHEDULES", "SWEEP_LEVELS", "BatchNormDemo", "FeatureCaching", "_layer_forward_flops", "_model_and_batch",
    "_typical_step_s", "backward_check", "backward_numbers", "backward_profile", "batchnorm_demo", "feature_caching",
    "level_sweep", "level_table", "levels_finding", "schedule_finding", "schedule_runs", "time_band",
    "tradeoff_finding",
]

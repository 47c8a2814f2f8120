"""Notebook 05 (layer freezing): its experiments, one module per section; the mechanism is in
`labkit.techniques.freezing`."""

from .backward import backward_profile
from .batchnorm import batchnorm_demo
from .caching import feature_caching
from .levels import level_sweep, level_table
from .schedules import SCHEDULES, schedule_runs

__all__ = ["SCHEDULES", "backward_profile", "batchnorm_demo", "feature_caching", "level_sweep", "level_table",
           "schedule_runs"]


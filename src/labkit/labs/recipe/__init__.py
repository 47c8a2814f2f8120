"""Notebook 09's experiments: the staged recipe, the profiled step, the doctor's broken configs, the summary."""

from .language import LM_RECIPE_PATH, lm_stages
from .panel import HANG, broken, doctor_config, panel_config, panel_run
from .profiler import PROFILE_TOP, op_kind, profile_pair, profiler_precision, quiet_native_output, trace_folder
from .stages import RECIPE_PATH, recipe_stages, stacked_configs, staged, workload
from .summary import reference_rows, summary

__all__ = [
    "HANG", "LM_RECIPE_PATH", "PROFILE_TOP", "RECIPE_PATH", "broken", "doctor_config", "lm_stages", "op_kind",
    "panel_config", "panel_run", "profile_pair", "profiler_precision", "quiet_native_output", "recipe_stages",
    "reference_rows", "stacked_configs", "staged", "summary", "trace_folder", "workload",
]

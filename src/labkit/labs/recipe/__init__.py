"""Notebook 09 (the recipe): its experiments, one module per section; the notebook explains them.

- `stages`: a staged recipe (a YAML `RunConfig`, `RECIPE_PATH`) applied stage by stage in the given order, each
  stage alone, and in the order those measurements suggest (`staged`, `measured_order`).
- `profiler`: one training step under ``torch.profiler`` before and after mixed precision (`profile_step`).
- `panel`: the broken configs handed to `labkit.doctor` (`BROKEN`, `broken`), and the panel's run.
- `language`: a language model's recipe (`LM_RECIPE_PATH`) stacked in the given order (`lm_stages`).
- `summary`: what each technique of notebooks 01-08 bought on this machine, from the learner's cached runs.
"""

from .language import LM_RECIPE_PATH, lm_recipe_finding, lm_stages
from .panel import BROKEN, DOCTOR_STEPS, HANG, RecipeRun, broken, doctor_config, panel_config, panel_run
from .profiler import (
    CASTS,
    OP_KINDS,
    PROFILE_TOP,
    ProfiledStep,
    kinds_frame,
    kinds_table,
    op_kind,
    operator_rows,
    profile_finding,
    profile_pair,
    profile_step,
    profiler_precision,
    quiet_native_output,
    trace_folder,
)
from .stages import (
    ALONE,
    GIVEN,
    MEASURED,
    OWN_STACK,
    RECIPE_PATH,
    STAGE_COLUMNS,
    Recipe,
    Stage,
    changes_nothing,
    measured_order,
    order_finding,
    own_stack_numbers,
    recipe_finding,
    recipe_stages,
    stacked_configs,
    stacked_memory_ratio,
    stage_chart_frame,
    stage_rows,
    stage_table,
    staged,
    workload,
)
from .summary import SUMMARY_COLUMNS, Technique, cached_runs, reference_rows, summary, summary_finding

__all__ = [
    "LM_RECIPE_PATH", "lm_recipe_finding", "lm_stages", "stage_rows",
    "ALONE", "BROKEN", "CASTS", "DOCTOR_STEPS", "GIVEN", "HANG", "MEASURED", "OP_KINDS", "OWN_STACK", "PROFILE_TOP",
    "RECIPE_PATH",
    "STAGE_COLUMNS", "SUMMARY_COLUMNS", "ProfiledStep", "Recipe", "RecipeRun", "Stage", "Technique", "broken",
    "cached_runs", "changes_nothing", "doctor_config", "kinds_frame", "kinds_table", "measured_order", "op_kind",
    "operator_rows",
    "order_finding",
    "own_stack_numbers", "panel_config", "panel_run", "profile_finding", "profile_pair", "profile_step",
    "profiler_precision", "quiet_native_output", "recipe_finding", "recipe_stages", "reference_rows",
    "stacked_configs", "stacked_memory_ratio", "stage_chart_frame", "stage_table", "staged", "summary",
    "summary_finding", "trace_folder", "workload",
]

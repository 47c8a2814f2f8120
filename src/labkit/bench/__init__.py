"""Entry point ``labkit bench``: reference results measured here, labelled with the GPU, date and versions.

- `notebooks` (``labkit bench [NOTEBOOK ...]``): notebooks 00-03's experiments at a profile, one file per part.
- `suite` (``labkit bench --suite gpu``): every GPU-only measurement of notebooks 01-10, within a time budget, each
  part's file written as it finishes, a failure recorded and the rest run; its docstring gives the sizing.
- `suite_workloads`: the suite's runs by key, and the label (``workload``, ``fallback``) each file carries.
- `parts`: one function per reference file, calling its notebook's lab; `common`: naming, provenance, writing.

Meant for a real GPU; it runs anywhere (a CPU gives CPU figures, labelled so). Each notebook loads its own
parts, e.g. ``labkit.load_reference("01_mixed_precision-compare*")``.
"""

from .common import CPU_BUDGET_BYTES, EMULATED_GPU_BYTES, Part
from .notebooks import EXPERIMENTS, run_bench
from .suite import DEFAULT_BUDGET_S, GPU_SUITE, SUITE_STEPS, SUITES, SuitePart, SuiteReport, run_suite
from .suite_workloads import Workload, suite_vision_workload

__all__ = [
    "CPU_BUDGET_BYTES", "DEFAULT_BUDGET_S", "EMULATED_GPU_BYTES", "EXPERIMENTS", "GPU_SUITE", "SUITES", "SUITE_STEPS",
    "Part", "SuitePart", "SuiteReport", "Workload", "run_bench", "run_suite", "suite_vision_workload",
]

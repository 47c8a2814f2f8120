"""Notebook 07 (distributed data parallel): its experiments, each a torchrun job or two."""

from .beyond import fsdp_comparison, fsdp_sizing
from .data_parallel import dp_vs_ddp
from .equivalence import equivalence
from .faults import fault_demo
from .jobs import uses_batch_statistics, workload
from .language import language_jobs, language_workload
from .panel import panel_estimate, panel_run
from .plain import mechanism_config
from .scaling import accumulation, bucket_sweep, scaling

__all__ = [
    "accumulation", "bucket_sweep", "dp_vs_ddp", "equivalence", "fault_demo", "fsdp_comparison", "fsdp_sizing",
    "language_jobs", "language_workload", "mechanism_config", "panel_estimate", "panel_run",
    "scaling", "uses_batch_statistics", "workload",
]

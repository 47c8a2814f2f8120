"""Notebook 07 (distributed data parallel): torchrun jobs launched from the notebook, their figures, one-line findings.

One module per part of the notebook:

- `jobs`: `launch`, one data-parallel `fit` over N processes with torchrun on labkit's worker (`labkit.worker`),
  cached; how many ranks this machine runs; a job as a table row. `failures` reads how a failed job ended into a
  `DistributedError` naming the rank.
- `data_parallel` (section 1): ``nn.DataParallel`` against DDP, where there are two or more GPUs.
- `plain` (section 2): what the notebook's plain DDP script needs, and `run_script` to start it.
- `equivalence` (section 3): one process against N on the same global batch.
- `scaling` (section 4): throughput over world sizes, gradient buckets, ``no_sync`` under accumulation.
- `faults` (section 5): a rank that raises, exits or hangs, and how the job ends.
- `beyond` (section 6): the multi-node command, FSDP2 against DDP, FSDP's memory per GPU.
- `panel` (section 7): what the notebook's panel runs.

The mechanism is in `labkit.techniques.distributed`; `labkit.train.Trainer` applies it inside a process group; the
explanations are in the notebook.
"""

from .beyond import fsdp_comparison, fsdp_finding, fsdp_sizing, multi_node_commands
from .data_parallel import CLAIMED_DP_DDP, DataParallelComparison, data_parallel_fit, dp_vs_ddp
from .equivalence import EARLY_STEPS, Equivalence, equivalence
from .faults import FaultDemo, fault_demo
from .jobs import (
    FAIL_HOW,
    START_UP_S,
    VIT,
    WORKER,
    cpu_cores,
    job_row,
    jobs_frame,
    launch,
    max_processes,
    planned_steps,
    thread_budget,
    threads_per_rank,
    time_verdict,
    uses_batch_statistics,
    workload,
)
from .panel import DistRun, panel_estimate, panel_run
from .plain import mechanism_config, plain_exit, plain_setup, plain_summary, plain_write, run_script
from .scaling import accumulation_finding, bucket_finding, bucket_sweep, scaling, scaling_finding, world_sizes

__all__ = [
    "CLAIMED_DP_DDP", "EARLY_STEPS", "FAIL_HOW", "START_UP_S", "VIT", "WORKER", "DataParallelComparison", "DistRun",
    "Equivalence", "FaultDemo", "accumulation_finding", "bucket_finding", "bucket_sweep", "cpu_cores",
    "data_parallel_fit", "dp_vs_ddp", "equivalence", "fault_demo", "fsdp_comparison", "fsdp_finding", "fsdp_sizing",
    "job_row", "jobs_frame", "launch", "max_processes", "mechanism_config", "multi_node_commands", "panel_estimate",
    "panel_run", "planned_steps", "plain_exit", "plain_setup", "plain_summary", "plain_write", "run_script",
    "scaling", "scaling_finding", "thread_budget", "threads_per_rank", "time_verdict", "uses_batch_statistics",
    "workload", "world_sizes",
]

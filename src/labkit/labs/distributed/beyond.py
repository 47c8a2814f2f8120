"""Notebook 07, section 6: beyond one machine (the multi-node command) and beyond one copy per GPU (FSDP2)."""

from __future__ import annotations

import pandas as pd

from ...capacity import training_memory
from ...config import RunConfig
from ...messages import worded
from ...techniques import distributed
from .jobs import launch, time_verdict

FSDP_WORLD_SIZES = (2, 4, 8, 16)


def multi_node_commands(nproc: int = 4, nnodes: int = 2, endpoint: str = "10.0.0.1:29500") -> list[str]:
    """The command each of ``nnodes`` machines runs for one job, as a learner would type it.

    Args:
        nproc: processes per machine. nnodes: machines. endpoint: the rendezvous ``host:port``.
    """
    script = ["-m", "labkit.worker", "--config", "run.json", "--out", "out/"]
    commands = []
    for rank in range(nnodes):
        flags = distributed.torchrun_command(script, nproc, nnodes=nnodes, node_rank=rank,
                                             rdzv_endpoint=endpoint)[3:-len(script)]
        commands.append(" \\\n    ".join(["torchrun", *flags, distributed.shell(script)]))
    return commands


def fsdp_comparison(cfg: RunConfig, nproc: int = 2, progress: bool = True) -> pd.DataFrame:
    """The same job with DDP (a whole copy per rank) and FSDP2 (1/N per rank): what each rank holds, time, loss.

    Args:
        cfg: the run. nproc: processes. progress: show the bars.
    """
    rows = []
    for strategy in distributed.STRATEGIES:
        job = launch(cfg, nproc=nproc, strategy=strategy, progress=progress)
        rank0 = job.distributed["ranks"][0]
        rows.append({"strategy": strategy, "world_size": nproc, "parameter_bytes": rank0["parameter_bytes"],
                     "optimizer_state_bytes": rank0["optimizer_state_bytes"],
                     "peak_memory_bytes": job.peak_memory_bytes, "step_time_s": job.step_time_s,
                     "step_time_p10_s": job.step_time_p10_s, "step_time_p90_s": job.step_time_p90_s,
                     "comm_share": (job.distributed.get("communication") or {}).get("share"),
                     "final_loss": job.losses[-1], "accuracy": job.accuracy,
                     "weights_sha256": job.distributed["weights_sha256"][0], "losses": job.losses})
    return pd.DataFrame(rows)


@worded
def fsdp_finding(frame: pd.DataFrame) -> str:
    """One line: what FSDP held per rank against DDP, its step time against DDP's spread, and the loss gap.

    Args:
        frame: `fsdp_comparison`'s frame.
    """
    ddp, fsdp = frame.iloc[0], frame.iloc[1]
    n = int(fsdp.world_size)
    loss_gap = max(abs(a - b) for a, b in zip(ddp.losses, fsdp.losses, strict=True))
    return (f"Per rank, FSDP held {fsdp.parameter_bytes / ddp.parameter_bytes:.0%} of DDP's parameter bytes and "
            f"{fsdp.optimizer_state_bytes / ddp.optimizer_state_bytes:.0%} of its optimizer state (1/{n} = "
            f"{1 / n:.0%}); its steps took {fsdp.step_time_s / ddp.step_time_s:.2f}x DDP's "
            f"({time_verdict(fsdp, ddp)}); the losses differ by at most {loss_gap:.1e}.")


def fsdp_sizing(num_params: float = 7e9, gpu_bytes: float = 16e9, precision: str = "fp32") -> pd.DataFrame:
    """Training memory per GPU with AdamW, whole (DDP) or sharded over N GPUs (FSDP), activations not counted.

    Args:
        num_params: the model's parameters. gpu_bytes: one GPU's memory. precision: the weights' precision.

    Returns:
        ``strategy``, ``gpus``, ``per_gpu_bytes`` (from `labkit.training_memory`), ``fits`` (in ``gpu_bytes``).
    """
    total = training_memory(num_params, precision=precision, optimizer="adamw")["total"]
    rows = [{"strategy": "DDP (a copy per GPU)", "gpus": 1, "per_gpu_bytes": total, "fits": total <= gpu_bytes}]
    rows += [{"strategy": "FSDP (1/N per GPU)", "gpus": n, "per_gpu_bytes": total / n, "fits": total / n <= gpu_bytes}
             for n in FSDP_WORLD_SIZES]
    return pd.DataFrame(rows)

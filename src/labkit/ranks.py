"""A launched job's figures as table rows, job by job and rank by rank, and two jobs side by side: how far apart
their losses and weights ended, and how well N ranks scaled against one.

Each rank of a `labkit.launcher.launch` job reports its own tokens, rates and memory (`RunResult.distributed`'s
``ranks``); these turn them into table rows, the same for DDP (a whole copy per rank) and FSDP2 (1/N per rank).
"""

from __future__ import annotations

import pandas as pd

from .result import RunResult
from .techniques.distributed import weights_difference


def job_row(result: RunResult) -> dict:
    """One `labkit.launcher.launch` job's headline figures as a table row."""
    job = result.distributed
    ranks = job["ranks"]
    return dict(
        world_size=job["world_size"], backend=job["backend"], strategy=job.get("strategy", "ddp"),
        grad_accum=result.config["grad_accum"], bucket_cap_mb=job.get("bucket_cap_mb"),
        samples_per_rank=job["samples_per_rank"], threads_per_rank=job.get("threads_per_rank"),
        step_time_s=result.step_time_s, step_time_p10_s=result.step_time_p10_s,
        step_time_p90_s=result.step_time_p90_s, throughput=result.throughput,
        allreduces_per_step=ranks[0]["allreduces_per_step"],
        allreduced_per_step_bytes=job.get("allreduce_bytes_per_step"),
        comm_share=(job.get("communication") or {}).get("share"),
        parameter_bytes=ranks[0].get("parameter_bytes"), optimizer_state_bytes=ranks[0].get("optimizer_state_bytes"),
        peak_memory_bytes=result.peak_memory_bytes, accuracy=result.accuracy,
        final_loss=result.losses[-1] if result.losses else None, losses=result.losses,
        identical_weights=len(set(job["weights_sha256"])) == 1, launch_time_s=job.get("launch_time_s"),
    )


def jobs_frame(jobs: list[RunResult]) -> pd.DataFrame:
    return pd.DataFrame([job_row(job) for job in jobs])


def loss_gap(a: list, b: list, steps: int | None = None) -> float:
    """The largest difference between two loss curves' first ``steps`` values."""
    return max(abs(x - y) for x, y in zip(a[:steps], b[:steps], strict=True))


MEMORY_PARTS = ("parameters", "gradients", "optimizer_state", "activations", "other")


def rank_rows(job: RunResult, name: str) -> list[dict]:
    """One row per rank of ``job``: its label tokens over the timed steps, its tokens/s and real tokens/s, its
    parameter, gradient and optimizer-state bytes (its shard under FSDP2), and its memory by category at its peak."""
    info = job.distributed
    share = (info.get("communication") or {}).get("share")
    rows = []
    for rank in info["ranks"]:
        memory = rank.get("memory_at_peak") or {}
        rows.append(dict(job=name, strategy=info.get("strategy", "ddp"), process_rank=rank["rank"],
                         label_tokens=(rank.get("counts") or {}).get("label_tokens"),
                         tokens_per_s=rank.get("tokens_per_s"), real_tokens_per_s=rank.get("real_tokens_per_s"),
                         parameter_bytes=rank.get("parameter_bytes"), gradient_bytes=rank.get("gradient_bytes"),
                         optimizer_state_bytes=rank.get("optimizer_state_bytes"),
                         peak_memory_bytes=rank.get("peak_memory_bytes"), comm_share=share,
                         **{f"{part}_at_peak_bytes": memory.get(part, 0) for part in MEMORY_PARTS}))
    return rows


def rank_frame(jobs: dict[str, RunResult]) -> pd.DataFrame:
    """`rank_rows` of every job, named by its key."""
    return pd.DataFrame([row for name, job in jobs.items() for row in rank_rows(job, name)])


def weights_gap(a: RunResult, b: RunResult) -> float:
    """The largest difference between two jobs' final weights (their sampled values, `weights_sample`)."""
    return weights_difference(a.distributed["weights_sample"], b.distributed["weights_sample"])


def rate(job: RunResult) -> float:
    """The job's tokens/s (a language model), else its samples/s."""
    return job.tokens_per_s if job.tokens_per_s else job.throughput


def scaling_efficiency(one: RunResult, many: RunResult) -> float:
    """N ranks' rate over N times one process's: 1.0 when N ranks did the work N times faster."""
    return rate(many) / (many.distributed["world_size"] * rate(one))

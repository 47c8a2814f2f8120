"""Notebook 07's workload, and `launch`'s jobs as table rows."""

from __future__ import annotations

import pandas as pd

from ... import config, machine, models
from ...config import RunConfig
from ...env import Profile, profile, resolve_device
from ...launcher import VIT
from ...measure import Measured, compare
from ...messages import note
from ...result import RunResult


def workload(prof: Profile | None = None) -> RunConfig:
    """The notebook's fine-tune: ``tiny_vit`` on the small offline data, or the profile's workload at ``full``."""
    prof = prof or profile()
    base = config.baseline(prof)
    if base.model == "small_cnn":
        base = base.replace(model=VIT)
    device = resolve_device(base.device).type
    if device == "cuda" and machine.here().gpu_count < 2:
        note(f"one GPU here, and DDP runs one process per device: this notebook's jobs run {VIT} as CPU processes "
             "on the small offline data")
        return config.baseline(prof, **{**config.SMALL_WORKLOAD, "model": VIT}, device="cpu")
    if device == "cpu" and uses_batch_statistics(base):
        note(f"CPU processes here, where BatchNorm's statistics stay per rank (no SyncBatchNorm): this notebook's "
             f"jobs run {VIT} instead of {base.model}, on the small offline data")
        return config.baseline(prof, **{**config.SMALL_WORKLOAD, "model": VIT})
    return base


def uses_batch_statistics(cfg: RunConfig) -> bool:
    """Whether ``cfg``'s model has BatchNorm: a micro-batch or an FSDP rank then normalises over its own samples."""
    return models.has_batchnorm(models.build(cfg.model, 10, pretrained=False)[0])


def job_row(result: RunResult) -> dict:
    """One `launch` job's headline figures as a table row."""
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


def step_times(row, reference):
    """``row``'s step time against ``reference``'s, with their p10-p90 spreads."""
    return compare(Measured.row(row, "step_time_s"), Measured.row(reference, "step_time_s"), ("faster", "slower"))


def loss_gap(a: list, b: list, steps: int | None = None) -> float:
    return max(abs(x - y) for x, y in zip(a[:steps], b[:steps], strict=True))

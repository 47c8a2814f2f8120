"""Notebook 07, section 7: a language model on two processes: the one-process weights, each rank's own token mean
(the pitfall), DDP against FSDP2 rank by rank."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ... import machine
from ...config import RunConfig
from ...env import Profile, profile
from ...labresult import LabResult
from ...launcher import launch
from ...messages import worded
from ...ranks import rank_frame, scaling_efficiency, weights_gap
from .jobs import step_times

JOBS = {"1 process": {"nproc": 1}, "DDP": {}, "FSDP2": {"strategy": "fsdp"},
        "DDP, each rank's own mean": {"token_mean": "rank"}}


def language_workload(prof: Profile | None = None) -> RunConfig:
    """SmolLM2-135M on two GPUs or more at ``full`` (Kaggle's 2 x T4); else a random tiny_llama as CPU processes."""
    prof = prof or profile()
    if prof.name == "full" and machine.here().gpu_usable and machine.here().gpu_count >= 2:
        return RunConfig(model="smollm2_135m", dataset="pydoc_text", batch_size=16, seq_len=256, pretrained=True,
                         max_steps=prof.max_steps, evaluate=False, precision="auto")
    # unscored: the arm compares weights, tokens and memory, and each rank would score the whole test split
    return RunConfig(model="tiny_llama", dataset="pydoc_text", batch_size=8, max_steps=prof.warmup_steps + 8,
                     train_size=64, device="cpu", evaluate=False)


@dataclass
class LanguageJobs(LabResult):
    shown = ("job", "label_tokens_per_rank", "weight_gap", "tokens_per_s", "efficiency", "comm_share",
             "peak_memory_bytes")
    jobs: dict | None = None

    @property
    def ranks(self) -> pd.DataFrame:
        """Every job's figures rank by rank (`labkit.ranks.rank_frame`)."""
        return rank_frame({name: job for name, job in self.jobs.items() if job.distributed["world_size"] > 1})

    def row(self, name: str):
        return self.frame.set_index("job").loc[name]

    @worded
    def finding(self) -> str:
        ddp, fsdp, pitfall = self.row("DDP"), self.row("FSDP2"), self.row("DDP, each rank's own mean")
        steps = step_times(fsdp, ddp)
        return (f"{ddp.world_size} ranks trained the one-process weights: DDP's ended {ddp.weight_gap:.1e} from "
                f"them, FSDP2's {fsdp.weight_gap:.1e}, which is float rounding. Dividing by each rank's own label "
                f"tokens ({pitfall.label_tokens_per_rank}) moved them {pitfall.weight_gap:.1e}, "
                f"{pitfall.weight_gap / max(ddp.weight_gap, 1e-12):,.0f}x further. Per rank, FSDP2 peaked at "
                f"{fsdp.peak_memory_bytes / ddp.peak_memory_bytes:.0%} of DDP's memory, and its steps took "
                f"{steps.ratio:.2f}x DDP's ({steps.verdict}).")


def language_jobs(cfg: RunConfig, nproc: int = 2, progress: bool = True) -> LanguageJobs:
    """One process, then ``nproc`` ranks under DDP, FSDP2, and DDP with each rank's own token mean."""
    jobs = {name: launch(cfg, **{"nproc": nproc, **args}, progress=progress) for name, args in JOBS.items()}
    one = jobs["1 process"]
    rows = [dict(job=name, world_size=job.distributed["world_size"], strategy=job.distributed["strategy"],
                 label_tokens_per_rank=" + ".join(str(r["counts"]["label_tokens"]) for r in job.distributed["ranks"]),
                 weight_gap=weights_gap(one, job), final_loss=job.losses[-1], step_time_s=job.step_time_s,
                 step_time_p10_s=job.step_time_p10_s, step_time_p90_s=job.step_time_p90_s,
                 tokens_per_s=job.tokens_per_s, real_tokens_per_s=job.real_tokens_per_s,
                 efficiency=scaling_efficiency(one, job), comm_share=job.distributed["communication"]["share"],
                 peak_memory_bytes=max(r["peak_memory_bytes"] for r in job.distributed["ranks"]))
            for name, job in jobs.items()]
    return LanguageJobs(pd.DataFrame(rows), jobs=jobs)

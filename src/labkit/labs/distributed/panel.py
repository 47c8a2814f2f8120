"""Notebook 07, section 7: what the panel runs, one job as a labelled row, and its time estimate."""

from __future__ import annotations

from dataclasses import dataclass

from ... import display
from ...config import RunConfig
from ...techniques import distributed
from .jobs import job_row, last_job, launch, planned_steps


@dataclass
class DistRun:
    """What the panel ran: one job, as a row (`job_row`) with a label."""

    row: dict

    def to_row(self) -> dict:
        """The run as one table row."""
        return dict(self.row)

    def __str__(self) -> str:
        r = self.row
        return (f"{r['setup']}: {display.number(r['step_time_s'] * 1e3)} ms a step, "
                f"{display.number(r['throughput'])} samples/s, "
                f"{r['allreduces_per_step']:g} all-reduces a step, accuracy {r['accuracy']:.1%}")


def panel_run(cfg: RunConfig, nproc: int = 2, bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB,
              progress: bool = False) -> DistRun:
    """The notebook panel's run: `launch` with these settings, as one labelled row.

    Args:
        cfg: the run (the panel sets ``grad_accum`` and ``max_steps``). nproc: processes.
        bucket_cap_mb: DDP's bucket size. progress: show the bar.
    """
    row = job_row(launch(cfg, nproc=nproc, bucket_cap_mb=bucket_cap_mb, progress=progress))
    row["setup"] = f"{nproc}p, {bucket_cap_mb:g}MB, acc{cfg.grad_accum}"
    return DistRun(row)


def panel_estimate(cfg: RunConfig) -> str | None:
    """The panel's time line, from the last job this session launched (None before any).

    Args:
        cfg: the run the panel is about to launch.
    """
    last = last_job()
    if not last:
        return None
    steps = planned_steps(cfg)
    seconds = last["launch_s"] + steps * last["step_s"]
    return (f"Estimated time: about {seconds:.0f} s (from the last job here: {last['launch_s']:.0f} s to start "
            f"torchrun, import and join, then {steps} steps at about {last['step_s'] * 1e3:.0f} ms; a cached "
            "setting shows at once).")

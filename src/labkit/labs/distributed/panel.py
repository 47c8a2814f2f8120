"""Notebook 07, section 8: the panel's run and its time estimate."""

from __future__ import annotations

from dataclasses import dataclass

from ... import display
from ...config import RunConfig
from ...launcher import last_job, launch, planned_steps
from ...ranks import job_row
from ...techniques import distributed


@dataclass
class DistRun:
    row: dict

    def to_row(self) -> dict:
        return dict(self.row)

    def __str__(self) -> str:
        r = self.row
        return (f"{r['setup']}: {display.number(r['step_time_s'] * 1e3)} ms a step, "
                f"{display.number(r['throughput'])} samples/s, "
                f"{r['allreduces_per_step']:g} all-reduces a step, accuracy {r['accuracy']:.1%}")


def panel_run(cfg: RunConfig, nproc: int = 2, bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB,
              progress: bool = False) -> DistRun:
    """The panel's run: `launch` with these settings, as one labelled row."""
    row = job_row(launch(cfg, nproc=nproc, bucket_cap_mb=bucket_cap_mb, progress=progress))
    row.pop("losses")
    return DistRun({**row, "setup": f"{nproc}p, {bucket_cap_mb:g}MB, acc{cfg.grad_accum}"})


def panel_estimate(cfg: RunConfig) -> str | None:
    """The panel's time line, from the last job this session launched."""
    last = last_job()
    if not last:
        return None
    steps = planned_steps(cfg)
    return (f"Estimated time: about {last['launch_s'] + steps * last['step_s']:.0f} s ({last['launch_s']:.0f} s to "
            f"start, then {steps} steps at {last['step_s'] * 1e3:.0f} ms, as the last job here; cached: at once).")

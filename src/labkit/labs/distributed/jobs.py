"""Notebook 07's workload, and `launch`'s jobs as table rows."""

from __future__ import annotations

from ... import config, machine, models
from ...config import RunConfig
from ...env import Profile, profile, resolve_device
from ...launcher import VIT
from ...measure import Measured, compare
from ...messages import note


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


def step_times(row, reference):
    """``row``'s step time against ``reference``'s, with their p10-p90 spreads."""
    return compare(Measured.row(row, "step_time_s"), Measured.row(reference, "step_time_s"), ("faster", "slower"))

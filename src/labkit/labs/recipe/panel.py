"""Sections 5 and 8 of notebook 09: the broken configs handed to `labkit.doctor`, and the panel's run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ... import results
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...messages import wrap
from ...runsetup import run_splits
from ...units import mib
from .stages import recipe_stages

BROKEN = {  # symptom -> RunConfig changes that produce it on the workload
    "nan_loss": {"optimizer": "sgd", "lr": 50.0},
    "amp_slower": {"precision": "fp16", "batch_size": 8},
    "quantization_drop": {"quantize": "int3_simulated"},
    "pruning_memory": {"prune_amount": 0.5},
    "distributed_hang": {},
}
HANG = {"nproc": 2, "fail_rank": 1, "fail_step": 2, "fail_how": "hang", "timeout_s": 3}  # the hang's launch
# The doctor's runs train this many steps at most: each symptom shows within them, and at full the nan_loss probe's
# five 300-step runs took 09 past 15 minutes on a T4 (scripts/estimate_full.py).
DOCTOR_STEPS = 100


def doctor_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` for one epoch of at most `DOCTOR_STEPS` (the profile's step budget, if smaller): the doctor's run."""
    return cfg.replace(epochs=1, max_steps=min(profile().max_steps, DOCTOR_STEPS))


def broken(cfg: RunConfig, symptom: str) -> RunConfig:
    """``cfg`` with the changes that produce ``symptom`` (a key of `BROKEN`), as `doctor_config` trains it."""
    if symptom not in BROKEN:
        raise ConfigError("symptom", symptom, f"one of {list(BROKEN)}")
    return doctor_config(cfg).replace(**BROKEN[symptom])


@dataclass
class RecipeRun:
    """One panel run: the stacked config's headline numbers."""

    setting: str
    epoch_time_s: float
    peak_memory_bytes: int | None
    accuracy: float | None
    model_size_bytes: int | None
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return wrap(f"{self.setting}: {self.epoch_time_s:.2f} s an epoch, peak {mib(self.peak_memory_bytes)}, "
                    f"accuracy {self.accuracy:.1%}, deployed model {mib(self.model_size_bytes)}")


def panel_config(cfg: RunConfig) -> RunConfig:
    """The panel's starting point: the recipe's stages on ``cfg``."""
    for stage in recipe_stages():
        cfg = cfg.replace(**stage.changes)
    return cfg


def panel_run(cfg: RunConfig, on_step=None, progress: bool = False) -> RecipeRun:
    """Train ``cfg`` through the cache and report what the recipe's table reports."""
    result = results.cached_fit(cfg, progress=progress, on_step=on_step)
    deployed = result.inference or {}
    parts = [f"bs{cfg.batch_size}", result.precision_used, "ckpt" if cfg.checkpointing else "",
             "8bit" if "8bit" in cfg.optimizer else "", f"freeze {cfg.freeze}" if cfg.freeze else "",
             cfg.quantize or ""]
    setting = " ".join(part for part in parts if part)  # short: the panel's bars are labelled with it
    return RecipeRun(setting, len(run_splits(cfg)["train"]) / result.throughput, result.peak_memory_bytes,
                     deployed.get("accuracy", result.accuracy), deployed.get("size_bytes", result.model_size_bytes),
                     list(result.warnings))

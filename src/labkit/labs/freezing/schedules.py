"""Section 6 of notebook 05: gradual unfreezing and discriminative (per-stage) learning rates against the fixed
levels (Howard & Ruder 2018, ULMFiT)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ... import measure, models, results, train
from ...config import RunConfig
from ...env import env_report, profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...result import RunResult
from ...techniques.freezing import discriminative_param_groups, gradual_unfreeze
from ...units import ratio
from ...validate import is_number
from .common import _ok, _typical_step_s

SCHEDULES = ("gradual unfreezing", "discriminative lr", "gradual + discriminative")


def _schedule_record(cfg: RunConfig, schedule: str, decay: float, progress: bool) -> dict:
    gradual = schedule != "discriminative lr"
    trainer = train.Trainer(cfg.replace(freeze="head_only" if gradual else None))
    body = models.block_names(trainer.model)
    steps = train.total_steps(cfg, len(trainer.loader))
    every = max(1, steps // (len(body) + 1))  # the last stage thaws with a share of the steps left
    # One optimizer over every parameter from the start: a frozen one has no gradient, so AdamW skips it and
    # keeps no state for it until it thaws.
    groups = discriminative_param_groups(trainer.model, cfg.lr, decay if schedule != "gradual unfreezing" else 1.0,
                                         trainable_only=False)
    trainer.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    thawed = []

    def on_step(done: int, total: int) -> None:
        if gradual:
            thawed.extend((done, name) for name in gradual_unfreeze(trainer.model, done, every))

    result = trainer.run(on_step=on_step if gradual else None, progress=progress)
    if gradual:
        # The run's memory was tracked early, with only the head training: track one more step, with
        # every stage thawed, for the memory the schedule ends with.
        images, labels = next(iter(trainer.loader))
        breakdown = measure.track_step_memory(lambda: trainer.step(images, labels), trainer.model,
                                              trainer.optimizer, trainer.device)
        result.memory, result.memory_at_peak = breakdown.peak_by_category, breakdown.at_peak
        if trainer.device.type != "cuda" and breakdown.total_peak_bytes is not None:
            result.peak_memory_bytes = breakdown.total_peak_bytes
        result.num_trainable_params = measure.count_parameters(trainer.model)[1]
    return {"result": result.to_dict(), "every": every, "thawed": thawed,
            "stage_lrs": {g["stage"]: g["lr"] for g in groups}}


@dataclass
class Schedules(LabResult):
    """`schedule_runs`' rows: the fixed levels (``kind`` ``fixed``) and the schedules, trained for the same steps."""

    shown = ("setup", "kind", "accuracy", "mean_step_time_s", "num_trainable_params", "peak_memory_bytes", "schedule")
    test_size: int | None = None  # the test split's size (None: the profile's)

    @worded
    def finding(self) -> str:
        """Which setups are not below the best accuracy beyond the test noise, and the fastest of those."""
        ok = _ok(self.frame).set_index("setup")
        if "none" not in ok.index:
            raise ConfigError("frame", "no 'none' row", "a schedule_runs frame with the fixed level 'none'")
        best = ok.sort_values(["accuracy", "mean_step_time_s"], ascending=[False, True]).index[0]
        size = self.test_size or profile().test_size
        top = Measured.accuracy(ok.loc[best, "accuracy"], size)
        close = ok[[compare(Measured.accuracy(a, size), top).direction != -1 for a in ok["accuracy"]]]
        fastest = close.sort_values("mean_step_time_s").index[0]
        time_ratio = ratio(ok.loc[fastest, "mean_step_time_s"], ok.loc["none", "mean_step_time_s"])
        return (f"Best accuracy: {best} ({ok.loc[best, 'accuracy']:.1%}); not lower beyond the test noise: "
                f"{', '.join(close.index)}; the fastest of those is {fastest}, at {time_ratio:.2f}x no freezing's "
                "mean step time.")


def _row_of(row, setup: str, kind: str, schedule: str) -> dict:
    return {"setup": setup, "kind": kind, **{c: row[c] for c in ("accuracy", "mean_step_time_s", "train_time_s",
                                                                  "num_trainable_params", "peak_memory_bytes")},
            "schedule": schedule, **{c: row[c] for c in row.keys() if c.startswith("mem_")},
            "error": row.get("error") if kind == "schedule" else None}


def schedule_runs(cfg: RunConfig, sweep, decay: float = 1 / 2.6, refresh: bool = False,
                  progress: bool = True) -> Schedules:
    """Gradual unfreezing, discriminative learning rates (``decay`` per stage; ULMFiT: 1/2.6) and both, each for
    ``cfg``'s steps from the same pretrained start with AdamW (cached), beside the ``sweep``'s fixed levels."""
    if cfg.optimizer != "adamw":
        raise ConfigError("optimizer", cfg.optimizer, "'adamw' (the schedules build their own AdamW)")
    if cfg.lr_warmup_steps:
        raise ConfigError("lr_warmup_steps", cfg.lr_warmup_steps, "0: a warm-up would set every group to one lr")
    if not is_number(decay) or not 0 < decay <= 1:
        raise ConfigError("decay", decay, "a number in (0, 1] (the lr factor from one stage to the one below)")
    env = env_report(cfg.device)
    rows = [_row_of(fixed, fixed["level"], "fixed", fixed["frozen_stages"])
            for _, fixed in _ok(getattr(sweep, "frame", sweep)).iterrows()]
    for schedule in SCHEDULES:
        key = f"{results.cache_key(cfg, env)}-schedule-{schedule.replace(' ', '_')}-{decay:.6g}"
        record = results.cached_record(key, lambda s=schedule: _schedule_record(cfg, s, decay, progress), refresh)
        result = RunResult.from_dict(record["result"])
        if schedule == "discriminative lr":
            plan = ", ".join(f"{name} {lr:.2g}" for name, lr in record["stage_lrs"].items())
        else:
            plan = ", ".join(f"{name}@{step}" for step, name in record["thawed"])
        row = {**results.to_row(result), "error": result.error,
               "mean_step_time_s": _typical_step_s(result, [step for step, _ in record["thawed"]])}
        rows.append(_row_of(row, schedule, "schedule", plan))
    return Schedules(pd.DataFrame(rows), test_size=profile().test_size)

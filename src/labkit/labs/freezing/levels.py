"""Sections 1 and 3 of notebook 05: what each freezing level freezes, and one fine-tune per level."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ... import display, models, results
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Comparison, Measured, compare
from ...messages import worded
from ...techniques.freezing import LEVELS, frozen_stages
from ...units import ratio
from .backward import backward_profile
from .common import GFLOP, _duration, _frozen_label, _label, _ok, _row, _typical_step_s

# The levels `level_sweep` runs by default: all of them, but at `ci` only the three that the checks, findings and
# exercises read (`light` and `medium` run the same code as `heavy`, with fewer stages frozen).
SWEEP_LEVELS = {"ci": ("none", "heavy", "head_only"), "quick": LEVELS, "full": LEVELS}


@dataclass
class LevelTable(LabResult):
    """What each level freezes on each model, and the share of the parameters still training."""


def level_table(model_names=("small_cnn", "resnet18", "shufflenet_v2_x0_5"), num_classes: int = 10) -> LevelTable:
    """What each level freezes on each of ``model_names`` (one column each; no training)."""
    rows = {level: {"level": level} for level in LEVELS}
    for name in model_names:
        model = models.build(name, num_classes, pretrained=False)[0]
        total = sum(p.numel() for p in model.parameters())
        stages = dict(models.named_stages(model))
        for level in LEVELS:
            frozen = frozen_stages(model, level)
            kept = total - sum(p.numel() for stage in frozen for p in stages[stage].parameters())
            rows[level][name] = f"{_frozen_label(frozen)} ({display.number(100 * kept / total)}% train)"
    return LevelTable(pd.DataFrame(list(rows.values())))


@dataclass
class LevelSweep(LabResult):
    """`level_sweep`'s rows, one fine-tune per level: time, memory, FLOPs and accuracy against no freezing."""

    shown = ("level", "num_trainable_params", "step_time_s", "backward_flops", "mem_optimizer_state_bytes",
             "saved_activation_bytes", "accuracy")

    def step_time(self, level: str) -> Comparison:
        """``level``'s step time against no freezing's, each with its steps' 10th-90th percentile spread."""
        return compare(Measured.row(_row(self.frame, level), "step_time_s"),
                       Measured.row(_row(self.frame, "none"), "step_time_s"), ("faster", "slower"))

    @worded
    def finding(self) -> str:
        """At the deepest level: did the step time follow the FLOPs?"""
        base = _row(self.frame, "none")
        frozen = _ok(self.frame)[_ok(self.frame)["level"] != "none"]
        if frozen.empty:
            raise ConfigError("frame", "only the 'none' row", "a level_sweep frame with at least one frozen level")
        deepest = frozen.sort_values("trainable_share").iloc[0]
        c = self.step_time(deepest["level"])
        forward = base["forward_flops"]
        flop_share = (forward + deepest["backward_flops"]) / (forward + base["backward_flops"])
        text = (f"At {deepest['level']} a step took {c.ratio:.2f}x the time of no freezing "
                f"({_duration(base['step_time_s'])} -> {_duration(deepest['step_time_s'])}, {c.verdict}) for "
                f"{flop_share:.2f}x the FLOPs: ")
        if c.direction != -1:
            return text + ("no faster beyond the steps' spread, so this machine's timing was disturbed; the FLOPs "
                           "and memory do not depend on it.")
        low, high = c.band
        band = f"(the steps' spread allows {low:.2f}x-{high:.2f}x)"
        if flop_share < low:
            return text + f"time fell less than the FLOPs {band}."
        return text + (f"time fell more than the FLOPs {band}." if flop_share > high else
                       f"time followed the FLOPs {band}.")

    @worded
    def claim(self, level: str = "heavy") -> str:
        """Does "heavy freezing costs more accuracy than it saves time" hold at ``level``?"""
        base, row = _row(self.frame, "none"), _row(self.frame, level)
        test_size = int(row.get("test_size") or profile().test_size)
        acc = compare(Measured.accuracy(row["accuracy"], test_size), Measured.accuracy(base["accuracy"], test_size))
        saved = 1 - row["time_ratio"]
        lost_share = -acc.difference / base["accuracy"] if base["accuracy"] else math.nan
        text = (f"{level} ({row['frozen_stages']} frozen): {row['time_ratio']:.2f}x the step time, accuracy "
                f"{row['accuracy']:.1%} against {base['accuracy']:.1%} ({acc.difference * 100:+.1f} points, "
                f"{acc.verdict}): ")
        if self.step_time(level).direction != -1:
            return text + ("not faster beyond the steps' spread, so these times cannot judge the claim; rerun the "
                           "sweep with refresh=True on an idle machine.")
        if acc.direction == -1 and lost_share > saved:
            return text + (f"the claim holds here, {lost_share:.0%} of the accuracy lost to save {saved:.0%} of the "
                           "time.")
        if acc.direction == -1:
            return text + (f"a real loss, but {lost_share:.0%} of it against {saved:.0%} of the time saved: the "
                           "claim does not hold as stated.")
        return text + f"the {saved:.0%} of time saved came free: the claim does not hold here."

    def own_backward(self, level: str = "heavy") -> dict:
        """Your own numbers for exercise ``05.own_backward``, from ``level``'s row (in GFLOP)."""
        row = _row(self.frame, level)
        return {"level": level, "trainable_gflop": round(float(row["trainable_forward_flops"]) / GFLOP, 4),
                "first_gflop": round(float(row["no_input_grad_flops"]) / GFLOP, 4)}

    @worded
    def backward_check(self, numbers: dict) -> str:
        """The backward FLOPs the exercise's arithmetic gives, beside what the FLOP counter measured in the run."""
        computed = 2 * numbers["trainable_gflop"] - numbers["first_gflop"]
        measured = _row(self.frame, numbers["level"])["backward_flops"] / GFLOP
        return (f"The arithmetic gives {computed:.4g} GFLOP for the backward pass at {numbers['level']}; the FLOP "
                f"counter measured {measured:.4g} GFLOP in the run ({measured / computed - 1:+.2%}, the numbers' "
                "rounding).")


def level_sweep(cfg: RunConfig, levels=None, refresh: bool = False, progress: bool = True) -> LevelSweep:
    """Fine-tune ``cfg`` once per freezing level (default: the profile's `SWEEP_LEVELS`; ``none`` is added), from
    the same pretrained start for the same steps; with `backward_profile`'s counts and ratios to ``none``."""
    levels = list(SWEEP_LEVELS[profile().name] if levels is None else levels)
    if not levels or any(level not in LEVELS and level is not None for level in levels):
        raise ConfigError("levels", levels, f"a non-empty list of levels from {list(LEVELS)}")
    names = [_label(level) for level in levels]
    if "none" not in names:
        names.append("none")  # the reference every ratio is relative to
    runs = results.run_configs([cfg.replace(freeze=name) for name in names], refresh=refresh, progress=progress)
    base = runs[names.index("none")]
    rows = []
    for name, result in zip(names, runs, strict=True):
        counts = backward_profile(cfg, name)
        backward = result.flops_per_step - counts["forward_flops"] if result.flops_per_step else math.nan
        base_backward = (base.flops_per_step - counts["forward_flops"]) if base.flops_per_step else math.nan
        rows.append({
            **results.to_row(result), **{k: v for k, v in counts.items() if k != "saved_by_stage"},
            "level": name, "frozen_stages": _frozen_label(frozen_stages(cfg.model, name)),
            "test_size": profile().test_size, "trainable_share": ratio(result.num_trainable_params, result.num_params),
            "time_ratio": ratio(result.step_time_s, base.step_time_s),
            "peak_ratio": ratio(result.peak_memory_bytes, base.peak_memory_bytes),
            "state_ratio": ratio(result.memory.get("optimizer_state"), base.memory.get("optimizer_state")),
            "activation_ratio": ratio(result.memory.get("activations"), base.memory.get("activations")),
            "backward_flops": backward, "backward_ratio": ratio(backward, base_backward),
            "mean_step_time_s": _typical_step_s(result),
            "accuracy_change": (result.accuracy - base.accuracy) if result.ok and base.ok and
            result.accuracy is not None and base.accuracy is not None else math.nan,
        })
    frame = pd.DataFrame(rows)
    first = ["level", "frozen_stages", "num_trainable_params", "trainable_share", "step_time_s", "time_ratio",
             "forward_flops", "backward_flops", "predicted_backward_flops", "saved_activation_bytes",
             "peak_memory_bytes", "state_ratio", "accuracy", "accuracy_change"]
    return LevelSweep(frame[first + [c for c in frame.columns if c not in first]])

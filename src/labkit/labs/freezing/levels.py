"""Sections 1 and 3 of notebook 05: what each freezing level freezes, and one fine-tune per level."""

from __future__ import annotations

import math

import pandas as pd

from ... import display, models, results
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...measure import accuracy_noise
from ...messages import worded
from ...techniques.freezing import LEVELS, frozen_stages
from ...units import ratio
from .backward import backward_profile
from .common import GFLOP, _duration, _frozen_label, _label, _ok, _points, _row, _typical_step_s

# The levels `level_sweep` runs by default: all of them, but at `ci` only the three that the checks, findings and
# exercises read (`light` and `medium` run the same code as `heavy`, with fewer stages frozen).
SWEEP_LEVELS = {"ci": ("none", "heavy", "head_only"), "quick": LEVELS, "full": LEVELS}


def level_table(model_names=("small_cnn", "resnet18", "shufflenet_v2_x0_5"), num_classes: int = 10) -> pd.DataFrame:
    """What each level freezes on each model (no training), and the share of the parameters still training.

    Args:
        model_names: labkit models, one column each.
        num_classes: the head's classes.

    Example:
        >>> level_table(["small_cnn", "resnet18"])
    """
    rows = {level: {"level": level} for level in LEVELS}
    for name in model_names:
        model = models.build(name, num_classes, pretrained=False)[0]
        total = sum(p.numel() for p in model.parameters())
        stages = dict(models.named_stages(model))
        for level in LEVELS:
            frozen = frozen_stages(model, level)
            kept = total - sum(p.numel() for stage in frozen for p in stages[stage].parameters())
            rows[level][name] = f"{_frozen_label(frozen)} ({display.number(100 * kept / total)}% train)"
    return pd.DataFrame(list(rows.values()))


def level_sweep(cfg: RunConfig, levels=None, refresh: bool = False, progress: bool = True) -> pd.DataFrame:
    """Fine-tune ``cfg`` once per freezing level, from the same pretrained start and for the same steps.

    Args:
        cfg: the fine-tune.
        levels: freezing levels (default: the profile's `SWEEP_LEVELS`; ``none`` is added).
        refresh: run again instead of reading the cache.
        progress: show progress bars.

    Returns:
        `labkit.sweep`'s columns (a failed run has its ``error``) plus ``level``, ``frozen_stages``,
        ``trainable_share``; ``time_ratio``, ``peak_ratio``, ``state_ratio``, ``activation_ratio`` (against
        ``none``); ``forward_flops``, ``backward_flops`` (measured) and `backward_profile`'s counts;
        ``backward_ratio``, ``mean_step_time_s`` and ``accuracy_change`` (accuracy - none's).
    """
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
        row = results.to_row(result)
        counts = backward_profile(cfg, name)
        backward = result.flops_per_step - counts["forward_flops"] if result.flops_per_step else math.nan
        base_backward = (base.flops_per_step - counts["forward_flops"]) if base.flops_per_step else math.nan
        row.update(
            level=name, frozen_stages=_frozen_label(frozen_stages(cfg.model, name)), test_size=profile().test_size,
            trainable_share=ratio(result.num_trainable_params, result.num_params),
            time_ratio=ratio(result.step_time_s, base.step_time_s),
            peak_ratio=ratio(result.peak_memory_bytes, base.peak_memory_bytes),
            state_ratio=ratio(result.memory.get("optimizer_state"), base.memory.get("optimizer_state")),
            activation_ratio=ratio(result.memory.get("activations"), base.memory.get("activations")),
            forward_flops=counts["forward_flops"], backward_flops=backward,
            predicted_backward_flops=counts["predicted_backward_flops"],
            trainable_forward_flops=counts["trainable_forward_flops"],
            no_input_grad_flops=counts["no_input_grad_flops"],
            counter_overcount_flops=counts["counter_overcount_flops"],
            saved_activation_bytes=counts["saved_activation_bytes"],
            backward_ratio=ratio(backward, base_backward),
            mean_step_time_s=_typical_step_s(result),
            accuracy_change=(result.accuracy - base.accuracy) if result.ok and base.ok and
            result.accuracy is not None and base.accuracy is not None else math.nan,
        )
        rows.append(row)
    frame = pd.DataFrame(rows)
    first = ["level", "frozen_stages", "num_trainable_params", "trainable_share", "step_time_s", "time_ratio",
             "forward_flops", "backward_flops", "predicted_backward_flops", "saved_activation_bytes",
             "peak_memory_bytes", "state_ratio", "accuracy", "accuracy_change"]
    return frame[first + [c for c in frame.columns if c not in first]]


def time_band(row, base) -> tuple[float, float]:
    """The step-time ratio ``row`` / ``base`` at the two ends of their runs' 10th-90th percentile spreads.

    Args:
        row, base: two rows of `level_sweep` (e.g. ``head_only`` and ``none``).
    """
    return row["step_time_p10_s"] / base["step_time_p90_s"], row["step_time_p90_s"] / base["step_time_p10_s"]


@worded
def levels_finding(frame: pd.DataFrame) -> str:
    """One line from `level_sweep`'s frame: at the deepest level, did the step time follow the FLOPs?

    Args:
        frame: `level_sweep`'s rows.
    """
    base = _row(frame, "none")
    frozen = _ok(frame)[_ok(frame)["level"] != "none"]
    if frozen.empty:
        raise ConfigError("frame", "only the 'none' row", "a level_sweep frame with at least one frozen level")
    deepest = frozen.sort_values("trainable_share").iloc[0]
    forward = base["forward_flops"]
    flop_share = (forward + deepest["backward_flops"]) / (forward + base["backward_flops"])
    text = (f"At {deepest['level']} a step took {deepest['time_ratio']:.2f}x the time of no freezing "
            f"({_duration(base['step_time_s'])} -> {_duration(deepest['step_time_s'])}) for {flop_share:.2f}x the "
            f"FLOPs: ")
    if deepest["step_time_s"] >= base["step_time_p10_s"]:
        return text + ("no faster than the unfrozen run's fastest tenth of steps, so this machine's timing was "
                       "disturbed; the FLOPs and memory do not depend on it.")
    low, high = time_band(deepest, base)
    band = f"(the steps' spread allows {low:.2f}x-{high:.2f}x)"
    if flop_share < low:
        return text + f"time fell less than the FLOPs {band}."
    if flop_share > high:
        return text + f"time fell more than the FLOPs {band}."
    return text + f"time followed the FLOPs {band}."


@worded
def tradeoff_finding(frame: pd.DataFrame, level: str = "heavy", test_size: int | None = None) -> str:
    """One line: does "heavy freezing costs more accuracy than it saves time" hold in `level_sweep`'s rows?

    Args:
        frame: `level_sweep`'s rows.
        level: the level the claim is about.
        test_size: the test images (default: the frame's ``test_size``), for the test noise.
    """
    base, row = _row(frame, "none"), _row(frame, level)
    test_size = test_size or int(row.get("test_size") or 0) or None
    if test_size is None:
        raise ConfigError("test_size", test_size, "the number of test images the accuracies were measured on")
    noise = accuracy_noise((row["accuracy"] + base["accuracy"]) / 2, test_size)
    saved = 1 - row["time_ratio"]
    lost = base["accuracy"] - row["accuracy"]
    lost_share = lost / base["accuracy"] if base["accuracy"] else math.nan
    text = (f"{level} ({row['frozen_stages']} frozen): {row['time_ratio']:.2f}x the step time, accuracy "
            f"{row['accuracy']:.1%} against {base['accuracy']:.1%} ({_points(-lost)}; test noise about "
            f"{noise * 100:.1f} points): ")
    if row["step_time_s"] >= base["step_time_p10_s"]:
        return text + ("not faster than the unfrozen run's fastest tenth of steps, so these times cannot judge "
                       "the claim; rerun the sweep with refresh=True on an idle machine.")
    if lost > noise and lost_share > saved:
        return text + f"the claim holds here, {lost_share:.0%} of the accuracy lost to save {saved:.0%} of the time."
    if lost > noise:
        return text + (f"it lost accuracy beyond noise, but {lost_share:.0%} of it against {saved:.0%} of the time "
                       "saved: the claim does not hold as stated.")
    return text + f"the loss is within noise, so the {saved:.0%} of time saved came free: the claim does not hold here."


def backward_numbers(sweep: pd.DataFrame, level: str = "heavy") -> dict:
    """Your own numbers for exercise ``05.own_backward``, from `level_sweep`'s row for ``level`` (in GFLOP).

    Args:
        sweep: `level_sweep`'s rows.
        level: the level the exercise asks about.
    """
    row = _row(sweep, level)
    return {"level": level, "trainable_gflop": round(float(row["trainable_forward_flops"]) / GFLOP, 4),
            "first_gflop": round(float(row["no_input_grad_flops"]) / GFLOP, 4)}


@worded
def backward_check(numbers: dict, sweep: pd.DataFrame) -> str:
    """The backward FLOPs the exercise's arithmetic gives, beside what the FLOP counter measured in the run.

    Args:
        numbers: `backward_numbers`' figures.
        sweep: `level_sweep`'s rows.
    """
    row = _row(sweep, numbers["level"])
    computed = 2 * numbers["trainable_gflop"] - numbers["first_gflop"]
    measured = row["backward_flops"] / GFLOP
    return (f"The arithmetic gives {computed:.4g} GFLOP for the backward pass at {numbers['level']}; the FLOP counter "
            f"measured {measured:.4g} GFLOP in the run ({measured / computed - 1:+.2%}, the numbers' rounding).")

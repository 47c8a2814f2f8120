"""What the sections of notebook 05 share: labels, a robust mean step time, durations, and row look-ups."""

from __future__ import annotations

import math
import statistics

import pandas as pd

from ...errors import ConfigError
from ...result import RunResult

GFLOP = 1e9


def _label(level) -> str:
    return "none" if level is None else str(level)


def _frozen_label(names: list[str]) -> str:
    return ", ".join(names) if names else "-"


def _typical_step_s(result: RunResult, phase_starts=()) -> float:
    """A run's mean step time with each timed step counted at its phase's median: robust to disturbed steps, and a
    gradual schedule (a new phase at each step where a stage thaws, ``phase_starts``) gets slower phase by phase."""
    times = result.step_times_s
    if not times:
        return math.nan
    first = result.steps - len(times)  # the timed steps are the run's last ones
    starts = sorted(set(phase_starts))
    phase = [sum(first + i >= start for start in starts) for i in range(len(times))]
    medians = {k: statistics.median([t for t, p in zip(times, phase, strict=True) if p == k]) for k in set(phase)}
    return statistics.fmean(medians[p] for p in phase)


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["error"].isna()] if "error" in frame else frame


def _row(frame: pd.DataFrame, level: str):
    rows = _ok(frame)
    rows = rows[rows["level"] == level]
    if rows.empty:
        raise ConfigError("frame", f"no successful {level!r} row",
                          f"a level_sweep frame with a successful row for {level!r}")
    return rows.iloc[0]

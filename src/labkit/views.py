"""What a panel shows after each run: `History` (every run of the session side by side), `Trend` (every run as a
point against one axis) and `run_overview`.

Both are an `ExperimentPanel`'s ``show``: they print the run's headline numbers and draw with `labkit.plots`,
at a size the panel's output area shows without scaling the text down.
"""

from __future__ import annotations

import pandas as pd

from .errors import ConfigError
from .labs.start_here import headline
from .plots import BREAKDOWN, METRICS, bar, grid, label_runs, line, loss_curve, memory_breakdown
from .results import to_row

# A run's label (the config fields that differ) is written under its bar when every label is this short
# and there are this few runs; otherwise the bars are numbered and the numbers explained above the chart.
SHORT_LABEL_CHARS = 18
FEW_RUNS = 4


def run_names(labels: list[str]) -> list[str]:
    """The names under the bars: the labels themselves when they are short and few, else ``#1``, ``#2``, ...

    Example:
        >>> run_names(["precision=fp32", "precision=bf16"])
        ['precision=fp32', 'precision=bf16']
    """
    if len(labels) <= FEW_RUNS and all(len(label) <= SHORT_LABEL_CHARS for label in labels):
        return list(labels)
    return [f"#{i + 1}" for i in range(len(labels))]


class History:
    """A panel's ``show`` that keeps every run of the session and redraws ``metrics`` as bars for all of them.

    Each press of Run adds a bar, labelled by the config fields that differ between the runs, so the
    learner compares settings side by side instead of reading one run at a time. The pseudo-metric
    ``"memory_breakdown"`` draws the stacked memory chart of every run.

    Args:
        metrics: result columns to chart, one panel each (e.g. ``("step_time_s", "peak_memory_bytes")``).
        max_runs: the most recent runs kept.

    Example:
        >>> ExperimentPanel(labkit.results.cached_fit, {"precision": ["fp32", "bf16"]},
        ...                 show=views.History(("step_time_s", "peak_memory_bytes")))
    """

    def __init__(self, metrics=("step_time_s", "peak_memory_bytes"), max_runs: int = 8):
        unknown = [m for m in metrics if m not in METRICS and m != BREAKDOWN]
        if not metrics or unknown:
            raise ConfigError("metrics", list(metrics), f"a non-empty list of result columns from {sorted(METRICS)} "
                                                        f"or {BREAKDOWN!r} (the stacked memory chart)")
        if not isinstance(max_runs, int) or max_runs < 1:
            raise ConfigError("max_runs", max_runs, "a positive integer")
        self.metrics, self.max_runs, self.runs = tuple(metrics), max_runs, []

    def __call__(self, result) -> None:
        self.runs = [*self.runs, result][-self.max_runs:]
        if getattr(result, "error", None):
            print(f"run failed: {result.error}")
        else:
            print(headline(result))
        frame = pd.DataFrame([to_row(r) for r in self.runs])
        labels = list(label_runs(list(self.runs)))
        frame["run"] = run_names(labels)
        if list(frame["run"]) != labels:  # numbered: say what each number ran
            for name, label in zip(frame["run"], labels, strict=True):
                print(f"{name}: {label}")
        fig, axes = grid(len(self.metrics))
        for ax, column in zip(axes, self.metrics, strict=True):
            if column == BREAKDOWN:
                memory_breakdown(frame, ax=ax, label="run")
            else:
                bar(frame, x="run", y=column, ax=ax)
        fig.tight_layout()


class Trend:
    """A panel's ``show`` that keeps every run of the session and plots ``ys`` against ``x``, one line per ``hue``.

    For runs that are not training runs: each result needs ``to_row() -> dict`` with the columns, and prints
    as its own headline (``str(result)``).

    Args:
        x: the column along the axis (e.g. ``"params_removed"``). ys: the metrics, one chart each.
        hue: a column giving one line per value (e.g. ``"method"``), or None. max_runs: the most recent runs kept.

    Example:
        >>> ExperimentPanel(lab.panel_run, {"seed": [0, 1]}, options={"method": ["unstructured", "structured"]},
        ...                 show=views.Trend("params_removed", ("test_accuracy", "latency_s"), hue="method"))
    """

    def __init__(self, x: str, ys=("test_accuracy", "latency_s"), hue: str | None = None, max_runs: int = 16):
        ys = (ys,) if isinstance(ys, str) else tuple(ys)
        if not ys:
            raise ConfigError("ys", list(ys), "a non-empty list of result columns")
        if not isinstance(max_runs, int) or max_runs < 1:
            raise ConfigError("max_runs", max_runs, "a positive integer")
        self.x, self.ys, self.hue, self.max_runs, self.runs = x, ys, hue, max_runs, []

    def __call__(self, result) -> None:
        row = result.to_row()
        missing = [c for c in (self.x, *self.ys, *([self.hue] if self.hue else [])) if c not in row]
        if missing:
            raise ConfigError(f"{type(self).__name__} column", missing[0],
                              f"a column of the run's to_row() ({', '.join(row)})")
        self.runs = [*self._others(row), row][-self.max_runs:]
        print(result)
        frame = pd.DataFrame(self.runs)
        fig, axes = grid(len(self.ys))
        for ax, column in zip(axes, self.ys, strict=True):
            self._draw(frame, column, ax)
        fig.tight_layout()

    def _others(self, row: dict) -> list:
        """The earlier runs kept beside ``row``: all of them (every run is a point)."""
        return self.runs

    def _draw(self, frame: pd.DataFrame, column: str, ax) -> None:
        line(frame, x=self.x, y=column, hue=self.hue, ax=ax)


class Bars(Trend):
    """A panel's ``show`` like `Trend` for a categorical ``x`` (e.g. ``"method"``): one bar per run.

    The bars are grouped by ``x`` and coloured by ``hue``; a new run replaces an earlier one with the same ``x``
    and ``hue``.

    Example:
        >>> ExperimentPanel(lab.panel_run, {"seed": [0]}, options={"method": ["int8_dynamic", "int8_static"]},
        ...                 show=views.Bars("method", ("size_vs_fp32", "test_accuracy"), hue="model"))
    """

    def _others(self, row: dict) -> list:
        """The earlier runs except one with the same ``x`` and ``hue`` as ``row`` (a rerun replaces it)."""
        def key(r):
            return r[self.x], r[self.hue] if self.hue else None

        return [r for r in self.runs if key(r) != key(row)]

    def _draw(self, frame: pd.DataFrame, column: str, ax) -> None:
        bar(frame, x=self.x, y=column, hue=self.hue, ax=ax)


def run_overview(result) -> None:
    """One run at a glance, for a panel's ``show``: its headline numbers, loss curve and memory breakdown.

    Example:
        >>> ExperimentPanel(labkit.fit, {"batch_size": (16, 256, 16)}, show=views.run_overview)
    """
    if getattr(result, "error", None):
        print(f"run failed: {result.error}")
        return
    print(headline(result))
    fig, (left, right) = grid(2)
    loss_curve(result, ax=left)
    memory_breakdown(result, ax=right)
    fig.tight_layout()

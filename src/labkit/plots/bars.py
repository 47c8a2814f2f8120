"""Bar charts: `bar` (a metric by category, live beside reference rows) and `bars` (several metrics side by side).

`bar` skips rows with an ``error`` (failed runs) or no value of ``y`` and counts them in the title. Several rows
for the same (x, hue, source) are reduced to their median. Reference rows are drawn hatched next to the live
bars, in the same colour for the same hue value.
"""

from __future__ import annotations

import pandas as pd

from ..display import axis_label, metric, scaled
from ..errors import ConfigError
from .figures import _axes, _colors, _finish, _keep_bars_clear, category_ticks, grid
from .frames import _fmt_value, _series


def bar(df: pd.DataFrame, x: str, y: str, hue: str | None = None, reference: pd.DataFrame | None = None,
        ax=None, title: str | None = None, logy: bool = False):
    """Grouped bars of metric ``y`` for each value of ``x``, one bar per ``hue`` value in each group; returns the Axes.

    Args:
        df: one row per run, e.g. from ``labkit.sweep``.
        x: the categorical column along the axis (e.g. ``"precision"``).
        y: the metric column (e.g. ``"step_time_s"``); shown in display units (ms, MiB, %, ...).
        hue: a column splitting each group into bars (e.g. ``"batch_size"``), or None.
        reference: rows of the same shape measured elsewhere (``labkit.load_reference``), drawn hatched.
        ax: the Axes to draw on (default: a new figure).
        title: overrides the default title.
        logy: a logarithmic y axis (for values that span orders of magnitude).

    Example:
        >>> ax = plots.bar(df, x="precision", y="step_time_s", reference=labkit.load_reference("01_mixed_precision"))
    """
    series, x_values, notes = _series(df, reference, x, y, hue, numeric_x=False)
    ax = _axes(ax)
    shown = [v for s in series for v in s["y"]]
    m = scaled(y, shown)
    slots = {value: i for i, value in enumerate(x_values)}
    colors = _colors([s["hue"] for s in series])
    # Each group shares its slot among the series that have a bar there, so a group is never half empty.
    present = {value: [i for i, s in enumerate(series) if value in s["x"]] for value in x_values}
    for i, s in enumerate(series):
        widths = [0.8 / len(present[v]) for v in s["x"]]
        positions = [slots[v] - 0.4 + w * (present[v].index(i) + 0.5) for v, w in zip(s["x"], widths, strict=True)]
        heights = [v * m.scale for v in s["y"]]
        style = dict(hatch="//", alpha=0.55, edgecolor="black") if s["reference"] else dict(edgecolor="black")
        ax.bar(positions, heights, width=widths, color=colors[s["hue"]], label=s["label"], linewidth=0.5, **style)
    if logy:
        ax.set_yscale("log")
    category_ticks(ax, [_fmt_value(v) for v in x_values])
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y, shown))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    _finish(ax, series, title or f"{m.label} by {metric(x).label}", notes)
    return ax



def bars(df: pd.DataFrame, x: str, ys, hue: str | None = None, reference: pd.DataFrame | None = None):
    """One `bar` chart per metric in ``ys``, side by side in one figure.

    ``reference`` rows are drawn in the charts of the metrics they have (a published speed-up has no memory
    figure).

    Example:
        >>> axes = plots.bars(df, x="setup", ys=["step_time_s", "peak_memory_bytes", "accuracy"], reference=ref)
    """
    ys = [ys] if isinstance(ys, str) else list(ys)
    if not ys:
        raise ConfigError("ys", ys, "a non-empty list of metric columns, e.g. ['step_time_s', 'peak_memory_bytes']")
    fig, flat = grid(len(ys))
    for ax, column in zip(flat, ys, strict=True):
        has = reference is not None and column in reference.columns
        bar(df, x=x, y=column, hue=hue, reference=reference if has else None, ax=ax)
    fig.tight_layout()
    for ax in flat:  # the layout shrank the axes (rotated labels): check the legends against the bars again
        _keep_bars_clear(ax)
    return flat

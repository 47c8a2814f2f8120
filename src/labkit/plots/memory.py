"""`memory_breakdown`: each run's memory by category, stacked, with the total peak marked.

Each segment is that category's own peak (``RunResult.memory``), in the order of
``labkit.result.MEMORY_CATEGORIES``. The categories need not peak at the same moment, so the
stack can stand above the total-peak marker (``peak_memory_bytes``). Runs with an error or no
memory breakdown are skipped and counted in the title. A list of runs is labelled by the config fields that
differ; a results DataFrame may come from ``labkit.sweep`` or ``results.to_frame``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from ..display import scaled
from ..result import MEMORY_CATEGORIES
from .figures import _axes, _colors, _finish, category_ticks
from .frames import _frame_rows, _get, as_frame, label_runs


def memory_breakdown(results, ax=None, label: str | None = None):
    """Stacked bars of each run's memory by category (in KiB..GiB, whichever suits), with the total peak marked.

    Args:
        results: a `RunResult`, a list of them, a dict label -> `RunResult`, or a results DataFrame.
        ax: the Axes to draw on (default: a new figure).
        label: with a DataFrame, the column that names each bar (default: the config fields that differ).

    Returns:
        The matplotlib Axes.

    Example:
        >>> ax = plots.memory_breakdown({"fp32": res_fp32, "bf16": res_bf16})
        >>> ax = plots.memory_breakdown(df, label="setup")
    """
    results = as_frame(results)
    labelled = label_runs(_frame_rows(results, label) if isinstance(results, pd.DataFrame) else results)
    ax = _axes(ax)
    kept, skipped = {}, []
    for label, res in labelled.items():
        if _get(res, "error") or not _get(res, "memory"):
            skipped.append(label)
        else:
            kept[label] = res
    extra = sorted({c for res in kept.values() for c in _get(res, "memory")} - set(MEMORY_CATEGORIES))
    categories = list(MEMORY_CATEGORIES) + extra
    colors = _colors(categories)
    positions = np.arange(len(kept))
    bottoms = np.zeros(len(kept))
    totals = [sum(v or 0 for v in _get(res, "memory").values()) for res in kept.values()]
    unit = scaled("peak_memory_bytes", totals + [_get(res, "peak_memory_bytes") or 0 for res in kept.values()])
    handles = []
    for category in categories:
        heights = np.array([(_get(res, "memory").get(category) or 0) * unit.scale for res in kept.values()])
        handles.append(ax.bar(positions, heights, bottom=bottoms, width=0.6, color=colors[category],
                              label=category.replace("_", " "), edgecolor="black", linewidth=0.5))
        bottoms += heights
    handles.reverse()  # the legend reads top-down, like the stack
    peaks = [_get(res, "peak_memory_bytes") for res in kept.values()]
    marked = [(p, v * unit.scale) for p, v in zip(positions, peaks, strict=True) if v is not None]
    if marked:
        xs, ys = zip(*marked, strict=True)
        ax.plot(xs, ys, linestyle="none", marker="_", markersize=40, markeredgewidth=2.5, color="black",
                label="total peak")
        handles.append(Line2D([], [], linestyle="none", marker="_", markersize=12, markeredgewidth=2.5,
                              color="black", label=f"total peak ({unit.unit} above)"))
        for px, py in marked:
            # The number only: "peak 29.3 MiB" over each of five narrow bars ran into its neighbour.
            ax.annotate(f"{py:.3g}", (px, py), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize="small")
    category_ticks(ax, list(kept))
    top = max([*bottoms, *(y for _, y in marked)], default=0.0)
    if top > 0:  # headroom (set by hand: the zero-height segments on top pin autoscaling at the stack)
        ax.set_ylim(0, top * 1.15)
    ax.set_ylabel(f"memory ({unit.unit})")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    notes = [f"skipped (error or no breakdown): {', '.join(skipped)}"] if skipped else []
    _finish(ax, [None] * len(kept), "memory by category: each one's own peak (black mark: the total peak)", notes,
            handles if kept else None)
    return ax

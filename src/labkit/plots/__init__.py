"""The few chart kinds every notebook needs, one call each: `bar`, `line`, `loss_curve`, `memory_breakdown`, ...

Each function draws on ``ax`` (or a new figure), returns the matplotlib Axes and never calls
``plt.show()``: Jupyter displays the figure at the end of the cell. Metric columns are shown in
display units (MiB, ms, %, TFLOP/s) with the unit on the axis (`labkit.display.METRICS`).
One module per chart kind: `bars`, `lines`, `memory`, `tradeoffs`; `figures` lays them out.
"""

from ..display import METRICS, Metric, axis_label, metric
from .bars import bar, bars
from .figures import (
           FIGURE_WIDTH_IN,
           PANEL_HEIGHT_IN,
           category_ticks,
           detached_figures,
           figure_mark,
           figures_since,
           grid,
)
from .frames import label_runs
from .lines import line, lines, loss_curve, loss_scale
from .memory import memory_breakdown
from .tradeoffs import batch_search, checkpoint_tradeoff

BREAKDOWN = "memory_breakdown"  # History's pseudo-metric: the stacked memory chart

__all__ = ["BREAKDOWN", "FIGURE_WIDTH_IN", "METRICS", "PANEL_HEIGHT_IN", "Metric", "axis_label", "bar", "bars",
           "batch_search", "category_ticks", "checkpoint_tradeoff", "detached_figures", "figure_mark", "figures_since",
           "grid", "label_runs", "line", "lines", "loss_curve", "loss_scale", "memory_breakdown", "metric"]

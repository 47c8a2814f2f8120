"""Figures, their layout and their text: a grid of charts no wider than an output area, tick labels that fit,
titles wrapped to their chart, legends that hide no bar, and the figures a panel run made (`figures_since`)."""

from __future__ import annotations

import math
import textwrap
import weakref

import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# The widest figure an output area shows at its own size (about 1000 px at matplotlib's 100 dpi, in
# JupyterLab and in Colab): a wider one is scaled down, and its text with it.
FIGURE_WIDTH_IN = 10.0
PANEL_HEIGHT_IN = 4.2
# Tick labels longer than fit under their bar are wrapped onto at most this many lines, then rotated.
MAX_TICK_LINES = 3

# Every figure labkit's charts create, in order (weakly held): a panel displays the ones its run made from this
# list, not from pyplot's registry of open figures.
_CREATED: list = []
# While a panel runs, charts are made outside pyplot (a bare Figure on its own Agg canvas): Jupyter's inline
# backend shows and closes every figure in pyplot's registry when a cell finishes, and a panel's figures,
# drawn in a widget callback, must not be caught by that (it came out blank or half drawn in JupyterLab).
_DETACHED = [False]


def _new_figure(figsize, rows: int = 1, columns: int = 1, squeeze: bool = True):
    if _DETACHED[0]:
        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, columns, squeeze=squeeze)
    else:
        fig, axes = plt.subplots(rows, columns, figsize=figsize, squeeze=squeeze)
    _CREATED.append(weakref.ref(fig))
    return fig, axes


class detached_figures:
    """Within the block, labkit's charts make figures outside pyplot's registry (see `figures_since`)."""

    def __enter__(self):
        self.previous, _DETACHED[0] = _DETACHED[0], True
        return self

    def __exit__(self, *exc):
        _DETACHED[0] = self.previous
        return False


def figure_mark() -> int:
    """A mark to pass to `figures_since` later."""
    return len(_CREATED)


def figures_since(mark: int) -> list:
    """The figures labkit's charts created after `figure_mark` returned ``mark`` that still exist, in order."""
    return [fig for ref in _CREATED[mark:] if (fig := ref()) is not None]


def grid(count: int, per_row: int = 2):
    """A figure of ``count`` charts, ``per_row`` to a row, no wider than `FIGURE_WIDTH_IN`.

    Returns:
        ``(figure, list of Axes)``; unused cells of the last row are removed.
    """
    columns = max(1, min(per_row, count))
    rows = math.ceil(count / columns)
    fig, axes = _new_figure((min(5.5 * columns, FIGURE_WIDTH_IN), PANEL_HEIGHT_IN * rows), rows, columns,
                            squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        fig.delaxes(ax)
    return fig, flat[:count]


def category_ticks(ax, labels: list[str]) -> None:
    """Put ``labels`` under ticks 0..n-1 so that none runs into its neighbour or off the figure.

    A label wider than its slot (measured as drawn) is wrapped at spaces onto up to `MAX_TICK_LINES` lines, and
    when even that does not fit, the labels stand vertically.
    """
    labels = [str(label) for label in labels]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    if not labels:
        return
    renderer = _renderer(ax.get_figure())
    slot_px = ax.get_window_extent(renderer).width / len(labels) * 0.95  # a little room: the layout may shift
    fitted = []
    for text, label in zip(ax.get_xticklabels(), labels, strict=True):
        width_px = text.get_window_extent(renderer).width
        if width_px <= slot_px:
            fitted.append(label)
            continue
        chars = max(1, int(len(label) * slot_px / width_px))
        wrapped = textwrap.wrap(label, width=chars, break_long_words=False) or [label]
        if len(wrapped) > MAX_TICK_LINES or max(len(part) for part in wrapped) > chars:
            ax.set_xticklabels(labels, rotation=90)
            return
        fitted.append("\n".join(wrapped))
    ax.set_xticklabels(fitted)


def _renderer(fig):
    """What measures drawn text: the canvas's renderer (Agg, as Jupyter's inline backend), else one the
    figure makes for its backend (pdf, svg)."""
    get = getattr(fig.canvas, "get_renderer", None)
    return get() if get is not None else fig._get_renderer()


def _wrapped_title(ax, text: str) -> str:
    """``text`` wrapped at spaces to the width of ``ax`` (a title wider than its chart runs off the figure)."""
    renderer = _renderer(ax.get_figure())
    width_px = ax.get_window_extent(renderer).width
    size_px = ax.title.get_fontsize() * ax.get_figure().dpi / 72
    chars = max(10, int(width_px / (0.6 * size_px)))
    return "\n".join(textwrap.fill(line, width=chars, break_long_words=False) for line in text.split("\n"))


def _axes(ax):
    if ax is None:
        fig, ax = _new_figure((7, PANEL_HEIGHT_IN))
        fig._labkit_made = True  # its layout is ours to set (a caller's figure keeps its own)
    return ax


def _finish(ax, drawn: list, title: str, notes: list[str], handles: list | None = None) -> None:
    if not drawn:
        notes = ["nothing to plot", *notes]
    ax.set_title("\n".join([title, *notes]), fontsize="medium")
    ax.set_title(_wrapped_title(ax, ax.get_title()), fontsize="medium")
    if handles:  # outside the axes, so it never hides a bar
        ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif len(ax.get_legend_handles_labels()[0]) > 1:  # one series needs no legend
        ax.legend(fontsize="small")
    fig = ax.get_figure()
    if getattr(fig, "_labkit_made", False) and len(fig.axes) == 1:
        fig.tight_layout()  # a chart of its own: room for its legend and labels inside the figure
    _keep_bars_clear(ax)


def _keep_bars_clear(ax, margin_px: float = 4.0) -> None:
    """Raise the y axis until the legend hides no bar: "best" placement still lays a legend over a bar
    when every corner holds one, and a chart must not hide its data. Measured after the layout, since
    rotated tick labels can leave the axes much shorter than the figure."""
    legend = ax.get_legend()
    bars = [p for p in ax.patches if p.get_height() > 0]
    if legend is None or not bars or legend.get_bbox_to_anchor() != ax.bbox:
        return  # no legend, no bars, or a legend placed outside the axes
    renderer = _renderer(ax.get_figure())
    log = ax.get_yscale() == "log"
    for _ in range(4):
        box = legend.get_window_extent(renderer)
        if not any(p.get_window_extent(renderer).overlaps(box) for p in bars):
            return
        axes_box = ax.get_window_extent(renderer)
        free = max(0.2, (box.y0 - axes_box.y0 - margin_px) / axes_box.height)  # share of the axes below it
        bottom, _ = ax.get_ylim()
        tallest = max(p.get_y() + p.get_height() for p in bars)
        if log:
            low = math.log10(bottom)
            ax.set_ylim(bottom, 10 ** (low + (math.log10(tallest) - low) / free))
        else:
            ax.set_ylim(bottom, bottom + (tallest - bottom) / free)


def _colors(keys: list) -> dict:
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    colors = {}
    for key in keys:
        if key not in colors:
            colors[key] = cycle[len(colors) % len(cycle)]
    return colors


def _spaced(positions: list[float], log: bool = False) -> bool:
    """Whether a tick at every one of ``positions`` leaves room for its label: no two closer than 1/12 of the span
    (on a log axis, of the log span). Crowded values get matplotlib's own ticks instead."""
    coords = sorted(math.log(v) if log and v > 0 else v for v in positions)
    span = coords[-1] - coords[0]
    return len(coords) < 2 or span == 0 or min(b - a for a, b in zip(coords, coords[1:], strict=False)) >= span / 12

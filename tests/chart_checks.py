"""`assert_readable`: a chart's text as a learner sees it in the output area: big enough, inside the
figure, and no label on top of another."""

import itertools

from matplotlib.text import Text

from labkit.plots import FIGURE_WIDTH_IN

# matplotlib's "small" (8.3 pt) at 100 dpi: the smallest text a chart may show once displayed.
MIN_TEXT_PX = 11.0


def drawn_tick_labels(axis) -> list:
    """The tick labels matplotlib draws: a tick outside the axis' view keeps a label, never drawn."""
    low, high = sorted(axis.get_view_interval())
    span = (high - low) or 1.0
    return [tick.label1 for tick in axis.get_major_ticks()
            if low - 1e-9 * span <= tick.get_loc() <= high + 1e-9 * span and tick.label1.get_visible()
            and tick.label1.get_text()]


def texts(fig):
    """Every text drawn on ``fig`` (tick labels only where their tick is in view)."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            shown = set(drawn_tick_labels(axis))
            hidden |= {tick.label1 for tick in axis.get_major_ticks() + axis.get_minor_ticks()} - shown
            hidden |= {tick.label2 for tick in axis.get_major_ticks() + axis.get_minor_ticks()}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and t not in hidden]


def assert_readable(fig, min_px: float = MIN_TEXT_PX) -> None:
    """Fail when any text of ``fig`` is too small, lies (partly) outside the figure, or overlaps another.

    Too small: under ``min_px`` once the output area has scaled the figure to at most `FIGURE_WIDTH_IN`.
    Overlapping: a neighbouring tick label or another text of its axes (title, annotations, axis labels).
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    shown = min(1.0, FIGURE_WIDTH_IN * fig.dpi / width)
    problems = []
    for text in texts(fig):
        px = text.get_fontsize() * fig.dpi / 72 * shown
        if px < min_px:
            problems.append(f"{text.get_text()!r} is {px:.1f} px tall when shown (at least {min_px})")
        box = text.get_window_extent(renderer)
        if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1:
            problems.append(f"{text.get_text()!r} runs off the figure ({box.x0:.0f}..{box.x1:.0f} of {width:.0f} px "
                            f"wide, {box.y0:.0f}..{box.y1:.0f} of {height:.0f} px high)")
    for ax in fig.axes:
        labels = []
        for axis in (ax.xaxis, ax.yaxis):
            shown_labels = drawn_tick_labels(axis)
            labels += shown_labels
            for a, b in itertools.combinations(shown_labels, 2):
                if a.get_window_extent(renderer).padded(-1).overlaps(b.get_window_extent(renderer).padded(-1)):
                    problems.append(f"tick labels {a.get_text()!r} and {b.get_text()!r} overlap")
        # the axes' own texts (title, annotations, axis labels): none on top of another
        legend = ax.get_legend()
        legend_texts = set(legend.get_texts()) if legend else set()
        own = [t for t in texts(fig) if t.axes is ax and t not in labels and t not in legend_texts]
        for a, b in itertools.combinations(own, 2):
            if a.get_window_extent(renderer).padded(-1).overlaps(b.get_window_extent(renderer).padded(-1)):
                problems.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    assert not problems, "\n".join(problems)

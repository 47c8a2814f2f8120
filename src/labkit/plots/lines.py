"""Line charts: `line` and `lines` (a metric against a numeric column), `loss_curve` and `loss_scale`.

`line` skips rows with an ``error`` or no value and counts them in the title; duplicates are reduced to their
median. In `loss_curve` the smoothed line (a trailing moving average over about a tenth of the run) carries the
label; runs with fewer than 10 steps get the raw line only. Runs without losses are skipped and counted in the
title.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..display import scaled
from ..errors import ConfigError
from .figures import _axes, _colors, _finish, _spaced, grid
from .frames import _check_frame, _fmt_value, _get, _moving_average, _series, as_frame, label_runs


def lines(df: pd.DataFrame, x: str, ys, hue: str | None = None, reference: pd.DataFrame | None = None,
          logx: bool = False, logy=()):
    """One `line` chart per metric in ``ys``, two to a row (so that the text stays readable).

    The metrics in ``logy`` get a logarithmic y axis (values that span orders of magnitude, such as parameter
    counts).

    Example:
        >>> axes = plots.lines(df, x="batch_size", ys=["epoch_time_s", "peak_memory_bytes"], logx=True)
    """
    ys = [ys] if isinstance(ys, str) else list(ys)
    if not ys:
        raise ConfigError("ys", ys, "a non-empty list of metric columns, e.g. ['throughput', 'peak_memory_bytes']")
    fig, flat = grid(len(ys))
    unknown = [c for c in logy if c not in ys]
    if unknown:
        raise ConfigError("logy", unknown[0], f"one of the charted metrics {ys}")
    for ax, column in zip(flat, ys, strict=True):
        line(df, x=x, y=column, hue=hue, reference=reference, ax=ax, logx=logx, logy=column in logy)
    fig.tight_layout()
    return flat


def line(df: pd.DataFrame, x: str, y: str, hue: str | None = None, reference: pd.DataFrame | None = None,
         ax=None, title: str | None = None, logx: bool = False, logy: bool = False):
    """Metric ``y`` against a numeric column ``x`` (e.g. batch size), one line per ``hue`` value; returns the Axes.

    Args:
        df: one row per run, e.g. from ``labkit.sweep``.
        x: a numeric column (e.g. ``"batch_size"``).
        y: the metric column (e.g. ``"throughput"``).
        hue: a column giving one line per value (e.g. ``"precision"``), or None.
        reference: results in the same shape measured elsewhere, drawn dashed in the same colours.
        ax: the Axes to draw on (default: a new figure).
        title: overrides the default title.
        logx: logarithmic x axis (base 2 when every x is a power of two, as batch sizes usually are).
        logy: logarithmic y axis.

    Example:
        >>> ax = plots.line(df, x="batch_size", y="throughput", hue="precision", logx=True)
    """
    series, x_values, notes = _series(df, reference, x, y, hue, numeric_x=True)
    ax = _axes(ax)
    m = scaled(y, [v for s in series for v in s["y"]])
    mx = scaled(x, x_values)
    colors = _colors([s["hue"] for s in series])
    for s in series:
        ax.plot([v * mx.scale for v in s["x"]], [v * m.scale for v in s["y"]], marker="o",
                linestyle="--" if s["reference"] else "-", alpha=0.7 if s["reference"] else 1.0,
                color=colors[s["hue"]], label=s["label"])
    if logx:
        powers_of_two = all(float(v).is_integer() and v > 0 and (int(v) & (int(v) - 1)) == 0 for v in x_values)
        ax.set_xscale("log", base=2 if powers_of_two else 10)
    if logy:
        ax.set_yscale("log")
    shown = [v * mx.scale for v in x_values]
    if shown and len(shown) <= 12 and _spaced(shown, log=logx):
        ax.set_xticks(shown)
        ax.set_xticklabels([_fmt_value(float(f"{v:.4g}")) for v in shown])  # what the axis label's unit says
        ax.minorticks_off()
    ax.set_xlabel(f"{mx.label} ({mx.unit})" if mx.unit else mx.label)
    ax.set_ylabel(f"{m.label} ({m.unit})" if m.unit else m.label)
    ax.grid(alpha=0.3)
    _finish(ax, series, title or f"{m.label} vs {mx.label}", notes)
    return ax


def loss_curve(results, ax=None):
    """Training loss per optimizer step of one or more runs, each with a lighter raw line and a smoothed one.

    Args:
        results: a `RunResult`, a list of them (labelled by the config fields that vary) or a dict label -> `RunResult`.
        ax: the Axes to draw on (default: a new figure).

    Returns:
        The matplotlib Axes.

    Example:
        >>> ax = plots.loss_curve({"fp32": res_fp32, "bf16": res_bf16})
    """
    labelled = label_runs(results)
    ax = _axes(ax)
    colors = _colors(list(labelled))
    skipped = []
    drawn = 0
    for label, res in labelled.items():
        losses = np.asarray([math.nan if v is None else v for v in (_get(res, "losses") or [])], dtype=float)
        if losses.size == 0:
            skipped.append(label)
            continue
        steps = np.arange(1, losses.size + 1)
        window = min(50, losses.size // 10)
        if window < 2:
            ax.plot(steps, losses, color=colors[label], label=label)
        else:
            ax.plot(steps, losses, color=colors[label], alpha=0.3, linewidth=1)
            ax.plot(steps, _moving_average(losses, window), color=colors[label], linewidth=2, label=label)
        drawn += 1
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    notes = [f"skipped (no losses): {', '.join(skipped)}"] if skipped else []
    _finish(ax, [None] * drawn, "training loss", notes)
    return ax


def loss_scale(trace: pd.DataFrame, ax=None):
    """A GradScaler's scale over the optimizer steps (log2 axis), skipped steps marked.

    Args:
        trace: ``labkit.labs.mixed_precision.scaler_trace(...)``: columns ``step``, ``scale``, ``skipped``.
        ax: the Axes to draw on (default: a new figure).

    Returns:
        The matplotlib Axes.

    Example:
        >>> plots.loss_scale(labkit.labs.mixed_precision.scaler_trace(cfg, init_scale=2.0**20, growth_interval=4))
    """
    trace = as_frame(trace)
    for column in ("step", "scale", "skipped"):
        _check_frame(trace, "trace", {"column": column})
    ax = _axes(ax)
    ax.step(trace["step"], trace["scale"], where="post", color="tab:blue", label="loss scale")
    skipped = trace[trace["skipped"].astype(bool)]
    ax.plot(skipped["step"], skipped["scale"], linestyle="none", marker="x", color="tab:red", markersize=8,
            label="step skipped (inf/NaN gradient)")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss scale")
    ax.grid(alpha=0.3)
    _finish(ax, [None] * len(trace), f"GradScaler: {len(skipped)} of {len(trace)} steps skipped", [])
    return ax

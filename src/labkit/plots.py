"""The few chart kinds every notebook needs, one call each: `bar`, `line`, `loss_curve`, `memory_breakdown`.

Each function draws on ``ax`` (or a new figure), returns the matplotlib Axes and never calls
``plt.show()``: Jupyter displays the figure at the end of the cell. Metric columns are shown in
display units (MiB, ms, %, TFLOP/s) with the unit on the axis; see `METRICS`.
"""

from __future__ import annotations

import difflib
import math
import numbers
import textwrap
import weakref
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .config import field_names
from .errors import ConfigError
from .result import MEMORY_CATEGORIES
from .units import MIB as MiB

# The widest figure an output area shows at its own size (about 1000 px at matplotlib's 100 dpi, in
# JupyterLab and in Colab): a wider one is scaled down, and its text with it.
FIGURE_WIDTH_IN = 10.0
PANEL_HEIGHT_IN = 4.2
# Tick labels longer than fit under their bar are wrapped onto at most this many lines, then rotated.
MAX_TICK_LINES = 3


class Metric(NamedTuple):
    """How a column is shown: axis ``label``, display ``unit`` and ``scale`` (display value = value * scale)."""

    label: str
    unit: str
    scale: float


METRICS: dict[str, Metric] = {
    "step_time_s": Metric("step time", "ms", 1e3),
    "time_s": Metric("time", "ms", 1e3),
    "step_time_p10_s": Metric("step time, 10th percentile", "ms", 1e3),
    "step_time_p90_s": Metric("step time, 90th percentile", "ms", 1e3),
    "train_time_s": Metric("training time", "s", 1.0),
    "epoch_time_s": Metric("training time per epoch", "s", 1.0),
    "inference_time_s": Metric("inference time, test split", "ms", 1e3),
    "throughput": Metric("throughput", "samples/s", 1.0),
    "peak_memory_bytes": Metric("peak memory", "MiB", 1 / MiB),
    "reserved_memory_bytes": Metric("reserved memory", "MiB", 1 / MiB),
    "model_size_bytes": Metric("model size", "MiB", 1 / MiB),
    "accuracy": Metric("accuracy", "%", 100.0),
    "achieved_flops": Metric("achieved FLOP/s", "TFLOP/s", 1e-12),
    "peak_flops": Metric("peak FLOP/s", "TFLOP/s", 1e-12),
    "flops_per_step": Metric("FLOPs per step", "GFLOP", 1e-9),
    "mfu": Metric("model FLOP utilisation", "% of peak", 100.0),
    "speedup_vs_fp32": Metric("speed-up over fp32", "x", 1.0),
    "num_params": Metric("parameters", "millions", 1e-6),
    "num_trainable_params": Metric("trainable parameters", "millions", 1e-6),
    "batch_size": Metric("batch size", "samples", 1.0),
    "lr": Metric("learning rate", "", 1.0),
    # freezing (notebook 05)
    "mean_step_time_s": Metric("mean step time", "ms", 1e3),
    "forward_flops": Metric("forward FLOPs per step", "GFLOP", 1e-9),
    "backward_flops": Metric("backward FLOPs per step", "GFLOP", 1e-9),
    "saved_activation_bytes": Metric("activations kept for backward", "MiB", 1 / MiB),
    # pruning (notebook 04)
    "latency_s": Metric("inference latency", "ms", 1e3),
    "cpu_latency_s": Metric("CPU inference latency", "ms", 1e3),
    "inference_peak_bytes": Metric("inference peak memory", "MiB", 1 / MiB),
    "val_accuracy": Metric("validation accuracy", "%", 100.0),
    "test_accuracy": Metric("test accuracy", "%", 100.0),
    "sparsity": Metric("sparsity (zero weights)", "%", 100.0),
    "amount": Metric("amount pruned", "%", 100.0),
    "params_removed": Metric("parameters removed or zeroed", "%", 100.0),
    "flops": Metric("FLOPs per forward", "GFLOP", 1e-9),
    "accuracy_drop": Metric("validation accuracy lost", "points", 100.0),
    "weight_bytes": Metric("weight storage", "KiB", 1 / 1024),
    "matmul_s": Metric("matmul time", "ms", 1e3),
    # quantization (notebook 06)
    "size_vs_fp32": Metric("file size, share of fp32's", "%", 100.0),
    "cpu_speedup": Metric("CPU speed-up over fp32", "x", 1.0),
    "gpu_latency_s": Metric("GPU inference latency", "ms", 1e3),
    "gpu_speedup": Metric("GPU speed-up over fp32", "x", 1.0),
    "mean_abs_error": Metric("mean absolute error", "", 1.0),
    "relative_error": Metric("relative error (norm)", "%", 100.0),
    "extra_train_time_s": Metric("extra training time", "s", 1.0),
    "loss_difference": Metric("|loss difference|", "", 1.0),
    "world_size": Metric("processes (world size)", "", 1.0),
    "speedup": Metric("speed-up over 1 process", "x", 1.0),
    "efficiency": Metric("scaling efficiency T1 / (N x TN)", "%", 100.0),
    "comm_share": Metric("all-reduce share of a step", "%", 100.0),
    "allreduces_per_step": Metric("gradient all-reduces per step", "buckets", 1.0),
    # LoRA (notebook 08)
    "lora_rank": Metric("LoRA rank", "", 1.0),
    "rank": Metric("LoRA rank", "", 1.0),
    "trainable_share": Metric("trainable share of the parameters", "%", 100.0),
    "base_weight_bytes": Metric("frozen Linear weights", "MiB", 1 / MiB),
    "vs_base": Metric("latency against the base model", "x", 1.0),
    "max_output_diff": Metric("largest output difference", "", 1.0),
    # the recipe (notebook 09)
    "stage": Metric("stage", "", 1.0),
    "self_ms": Metric("operators' self time", "ms", 1.0),
    "share": Metric("share of the operators' self time", "%", 100.0),
    "time_ratio": Metric("time, with / without", "x", 1.0),
    "memory_ratio": Metric("peak memory, with / without", "x", 1.0),
    "size_ratio": Metric("model size, with / without", "x", 1.0),
    "accuracy_change": Metric("accuracy change", "points", 100.0),
    **{f"mem_{c}_bytes": Metric(f"memory: {c.replace('_', ' ')}", "MiB", 1 / MiB) for c in MEMORY_CATEGORIES},
}

_LIVE = "live"
BREAKDOWN = "memory_breakdown"  # History's pseudo-metric: the stacked memory chart
_REFERENCE = "reference"


def metric(column: str) -> Metric:
    """The `Metric` of ``column``; an unknown column is shown raw, labelled by its name.

    Example:
        >>> metric("peak_memory_bytes")
        Metric(label='peak memory', unit='MiB', scale=9.5367431640625e-07)
    """
    return METRICS.get(column, Metric(column, "", 1.0))


def axis_label(column: str) -> str:
    """``"step time (ms)"`` for ``step_time_s``; the column name for unknown columns."""
    m = metric(column)
    return f"{m.label} ({m.unit})" if m.unit else m.label


def bar(df: pd.DataFrame, x: str, y: str, hue: str | None = None, reference: pd.DataFrame | None = None,
        ax=None, title: str | None = None, logy: bool = False):
    """Grouped bars of metric ``y`` for each value of ``x``, one bar per ``hue`` value in each group.

    Rows with an ``error`` (failed runs) or no value of ``y`` are skipped and counted in the title.
    Several rows for the same (x, hue, source) are reduced to their median.

    Args:
        df: one row per run, e.g. from ``labkit.sweep``.
        x: the categorical column along the axis (e.g. ``"precision"``).
        y: the metric column (e.g. ``"step_time_s"``); shown in display units (ms, MiB, %, ...).
        hue: a column splitting each group into bars (e.g. ``"batch_size"``), or None.
        reference: results in the same shape measured elsewhere (e.g. ``labkit.load_reference(...)``),
            drawn hatched next to the live bars, in the same colour for the same hue value.
        ax: the Axes to draw on (default: a new figure). title: overrides the default title.
        logy: a logarithmic y axis (for values that span orders of magnitude).

    Returns:
        The matplotlib Axes.

    Example:
        >>> ax = plots.bar(df, x="precision", y="step_time_s", hue="batch_size",
        ...                reference=labkit.load_reference("01_mixed_precision"))
    """
    series, x_values, notes = _series(df, reference, x, y, hue, numeric_x=False)
    ax = _axes(ax)
    m = metric(y)
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
    ax.set_ylabel(axis_label(y))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    _finish(ax, series, title or f"{m.label} by {metric(x).label}", notes)
    return ax



def bars(df: pd.DataFrame, x: str, ys, hue: str | None = None, reference: pd.DataFrame | None = None):
    """One `bar` chart per metric in ``ys``, side by side in one figure. ``reference`` rows are drawn in the charts of
    the metrics they have (a published speed-up has no memory figure).

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


def lines(df: pd.DataFrame, x: str, ys, hue: str | None = None, reference: pd.DataFrame | None = None,
          logx: bool = False, logy=()):
    """One `line` chart per metric in ``ys``, two to a row (so that the text stays readable); the metrics in
    ``logy`` get a logarithmic y axis (values that span orders of magnitude, such as parameter counts).

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
    """Metric ``y`` against a numeric column ``x`` (e.g. batch size), one line per ``hue`` value.

    Rows with an ``error`` or no value are skipped and counted in the title; duplicates are reduced
    to their median.

    Args:
        df: one row per run, e.g. from ``labkit.sweep``.
        x: a numeric column (e.g. ``"batch_size"``). y: the metric column (e.g. ``"throughput"``).
        hue: a column giving one line per value (e.g. ``"precision"``), or None.
        reference: results in the same shape measured elsewhere, drawn dashed in the same colours.
        ax: the Axes to draw on (default: a new figure). title: overrides the default title.
        logx: logarithmic x axis (base 2 when every x is a power of two, as batch sizes usually are).
        logy: logarithmic y axis.

    Returns:
        The matplotlib Axes.

    Example:
        >>> ax = plots.line(df, x="batch_size", y="throughput", hue="precision", logx=True)
    """
    series, x_values, notes = _series(df, reference, x, y, hue, numeric_x=True)
    ax = _axes(ax)
    m, mx = metric(y), metric(x)
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
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    ax.grid(alpha=0.3)
    _finish(ax, series, title or f"{m.label} vs {mx.label}", notes)
    return ax


def loss_curve(results, ax=None):
    """Training loss per optimizer step of one or more runs, each with a lighter raw line and a smoothed one.

    The smoothed line (a trailing moving average over about a tenth of the run) carries the label;
    runs with fewer than 10 steps get the raw line only. Runs without losses are skipped and
    counted in the title.

    Args:
        results: a `RunResult`, a list of them (labelled by the config fields that differ) or a dict
            label -> `RunResult`.
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


def memory_breakdown(results, ax=None, label: str | None = None):
    """Stacked bars of each run's memory by category (MiB), with the total peak marked.

    Each segment is that category's own peak (``RunResult.memory``), in the order of
    ``labkit.result.MEMORY_CATEGORIES``. The categories need not peak at the same moment, so the
    stack can stand above the total-peak marker (``peak_memory_bytes``). Runs with an error or no
    memory breakdown are skipped and counted in the title.

    Args:
        results: a `RunResult`, a list of them (labelled by the config fields that differ), a dict
            label -> `RunResult`, or a results DataFrame (``labkit.sweep``, ``results.to_frame``).
        ax: the Axes to draw on (default: a new figure).
        label: with a DataFrame, the column that names each bar (default: the config fields that differ).

    Returns:
        The matplotlib Axes.

    Example:
        >>> ax = plots.memory_breakdown({"fp32": res_fp32, "bf16": res_bf16})
        >>> ax = plots.memory_breakdown(df, label="setup")
    """
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
    handles = []
    for category in categories:
        heights = np.array([(_get(res, "memory").get(category) or 0) / MiB for res in kept.values()])
        handles.append(ax.bar(positions, heights, bottom=bottoms, width=0.6, color=colors[category],
                              label=category.replace("_", " "), edgecolor="black", linewidth=0.5))
        bottoms += heights
    handles.reverse()  # the legend reads top-down, like the stack
    peaks = [_get(res, "peak_memory_bytes") for res in kept.values()]
    marked = [(p, v / MiB) for p, v in zip(positions, peaks, strict=True) if v is not None]
    if marked:
        xs, ys = zip(*marked, strict=True)
        ax.plot(xs, ys, linestyle="none", marker="_", markersize=40, markeredgewidth=2.5, color="black",
                label="total peak")
        handles.append(Line2D([], [], linestyle="none", marker="_", markersize=12, markeredgewidth=2.5,
                              color="black", label="total peak (MiB above)"))
        for px, py in marked:
            # The number only: "peak 29.3 MiB" over each of five narrow bars ran into its neighbour.
            ax.annotate(f"{py:.3g}", (px, py), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize="small")
    category_ticks(ax, list(kept))
    top = max([*bottoms, *(y for _, y in marked)], default=0.0)
    if top > 0:  # headroom (set by hand: the zero-height segments on top pin autoscaling at the stack)
        ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("memory (MiB)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    notes = [f"skipped (error or no breakdown): {', '.join(skipped)}"] if skipped else []
    _finish(ax, [None] * len(kept), "memory by category: each one's own peak (black mark: the total peak)", notes,
            handles if kept else None)
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


def batch_search(search, ax=None):
    """The probes of a batch-size search: measured peak against batch size, in the order tried.

    Sizes that fit are green, those that did not red (a cross at the top when the probe ran out of
    memory and has no peak); the memory budget and the model's own memory are horizontal lines, the
    answer a vertical one.

    Args:
        search: a ``labkit.techniques.oom_backoff.BatchSearch`` (from ``labkit.capacity.batch_search``).
        ax: the Axes to draw on (default: a new figure).

    Example:
        >>> plots.batch_search(labkit.capacity.batch_search(cfg, budget_bytes=64 * 2**20))
    """
    frame = search.to_frame()
    ax = _axes(ax)
    measured = frame[frame["peak_bytes"].notna()]
    top = max([*(measured["peak_bytes"] / MiB), (search.budget_bytes or 0) / MiB, 1.0]) * 1.08
    points = []
    for fits, color, label in ((True, "tab:green", "fits"), (False, "tab:red", "does not fit")):
        part = frame[frame["fits"] == fits]
        ys = [p / MiB if p == p and p is not None else top for p in part["peak_bytes"]]
        ax.plot(part["batch_size"], ys, linestyle="none", marker="o" if fits else "X", color=color, label=label)
        points += list(zip(part["step"], part["batch_size"], ys, strict=True))
    if search.budget_bytes:
        ax.axhline(search.budget_bytes / MiB, color="black", linestyle="--", label="budget")
    if search.state_bytes.get("total"):
        ax.axhline(search.state_bytes["total"] / MiB, color="grey", linestyle=":",
                   label="model's own memory (parameters, gradients, optimizer state)")
    if search.best:
        ax.axvline(search.best, color="tab:green", alpha=0.4, label=f"largest that fits: {search.best}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(axis_label("batch_size"))
    ax.set_ylabel(axis_label("peak_memory_bytes"))
    ax.grid(alpha=0.3)
    # Number the probes in the order tried; the bisection's last probes sit close together, so a number
    # that would land on one already drawn is left out (and the title says so).
    renderer = _renderer(ax.get_figure())
    placed, crowded = [], 0
    for step, size, y in sorted(points):
        text = ax.annotate(str(step), (size, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
        box = text.get_window_extent(renderer)
        if any(box.overlaps(other) for other in placed):
            text.remove()
            crowded += 1
        else:
            placed.append(box)
    numbers = "numbers: order tried" + (f"; {crowded} crowded near the answer left out" if crowded else "")
    _finish(ax, [None] * len(frame), f"batch-size search: {len(frame)} probes ({numbers})", [])
    ax.legend(fontsize="small", loc="upper left")  # the probes rise to the right: keep the legend off them
    return ax


def checkpoint_tradeoff(frame: pd.DataFrame):
    """Gradient checkpointing's trade-off, from ``labkit.labs.memory_savers.checkpoint_tradeoff``: two charts.

    Left: activations (measured, and predicted by Chen et al.'s cost model) and peak memory against
    the number of checkpointed segments, the sqrt(n) rule's choice marked. Right: the trade-off curve,
    memory ratio against time ratio (both relative to no checkpointing), one point per segment count.

    Example:
        >>> plots.checkpoint_tradeoff(labkit.labs.memory_savers.checkpoint_tradeoff(cfg))
    """
    for column in ("segments", "peak_memory_bytes", "mem_activations_bytes", "predicted_activation_bytes",
                   "peak_ratio", "activation_ratio", "time_ratio", "sqrt_rule_segments"):
        _check_frame(frame, "frame", {"column": column})
    ok = frame[~_failed(frame)].sort_values("segments")
    fig, (left, right) = grid(2)
    left.plot(ok["segments"], ok["mem_activations_bytes"] / MiB, marker="o", label="activations (measured)")
    left.plot(ok["segments"], ok["predicted_activation_bytes"] / MiB, marker="x", linestyle="--",
              label="activations (Chen et al. cost model)")
    left.plot(ok["segments"], ok["peak_memory_bytes"] / MiB, marker="s", label="peak memory")
    if len(ok):
        left.axvline(ok["sqrt_rule_segments"].iloc[0], color="grey", linestyle=":", label="sqrt(n) rule")
    left.set_xticks(list(ok["segments"]))
    left.set_xlabel("checkpointed segments (0 = off)")
    left.set_ylabel("memory (MiB)")
    left.grid(alpha=0.3)
    _finish(left, [None] * len(ok), "memory vs segments", [])
    for name, marker in (("peak_ratio", "s"), ("activation_ratio", "o")):
        right.plot(ok["time_ratio"], ok[name], marker=marker, linestyle="none",
                   label=name.replace("_ratio", "").replace("activation", "activations") + " (ratio)")
        for seg, x, y in zip(ok["segments"], ok["time_ratio"], ok[name], strict=True):
            right.annotate(str(int(seg)), (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.axvline(1.0, color="grey", linewidth=0.8)
    right.set_xlabel("step time relative to no checkpointing")
    right.set_ylabel("memory relative to no checkpointing")
    right.grid(alpha=0.3)
    _finish(right, [None] * len(ok), "trade-off (numbers: segments)", [])
    fig.tight_layout()
    return left, right


# ---------------------------------------------------------------------------------------------------------


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
    """Put ``labels`` under ticks 0..n-1 so that none runs into its neighbour or off the figure: a label
    wider than its slot (measured as drawn) is wrapped at spaces onto up to `MAX_TICK_LINES` lines, and
    when even that does not fit, the labels stand vertically."""
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


def _fmt_value(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _check_frame(df, name: str, columns: dict[str, str | None]) -> None:
    if not isinstance(df, pd.DataFrame):
        raise ConfigError(name, type(df).__name__, "a pandas DataFrame with one row per run (e.g. from labkit.sweep)")
    available = [str(c) for c in df.columns]
    for arg, column in columns.items():
        if column is not None and column not in df.columns:
            close = difflib.get_close_matches(str(column), available, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else ""
            where = "" if name == "df" else f" of {name}"
            raise ConfigError(arg, column, f"a column{where} (available: {', '.join(available)})", hint)


def _failed(frame: pd.DataFrame) -> pd.Series:
    """Rows of failed runs: an ``error`` that is a message. A number there is some other kind of error
    (a prediction's, say) and never hides the row."""
    if "error" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["error"].map(lambda value: isinstance(value, str) and value.strip() != "").astype(bool)


def _sort_key(values: list) -> list:
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return values


def _series(df, reference, x, y, hue, numeric_x: bool):
    """Split the rows into drawable series: list of dicts (label, hue, reference, x, y), x values, notes."""
    columns = {"x": x, "y": y, "hue": hue}
    _check_frame(df, "df", columns)
    frames = [(df, False)]
    if reference is not None and len(reference):  # an empty reference (none shipped yet) draws nothing
        _check_frame(reference, "reference", columns)
        frames.append((reference, True))
    notes, failed_total, missing_total = [], 0, 0
    rows = []
    for frame, is_reference in frames:
        failed = _failed(frame)
        failed_total += int(failed.sum())
        frame = frame[~failed]
        values = pd.to_numeric(frame[y], errors="coerce")
        missing = values.isna()
        missing_total += int(missing.sum())
        frame = frame.assign(_y=values)[~missing]
        if numeric_x:
            xs = pd.to_numeric(frame[x], errors="coerce")
            if xs.isna().any():
                bad = frame[x][xs.isna()].iloc[0]
                raise ConfigError("x", x, "a numeric column for line() (use bar() for a categorical one)",
                                  f"it holds {bad!r}")
            frame = frame.assign(**{x: xs})
        default_source = _REFERENCE if is_reference else _LIVE
        sources = frame["source"].fillna(default_source) if "source" in frame.columns else default_source
        frame = frame.assign(_source=sources, _hue=frame[hue] if hue else None)
        for source, h, xv, yv in zip(frame["_source"].astype(str).tolist(), frame["_hue"].tolist(),
                                     frame[x].tolist(), frame["_y"].tolist(), strict=True):
            rows.append((is_reference or source.startswith(_REFERENCE), source, _none_if_nan(h), _none_if_nan(xv),
                         yv))
    if failed_total:
        notes.append(f"{failed_total} failed run{'s' if failed_total > 1 else ''} skipped")
    if missing_total:
        notes.append(f"{missing_total} run{'s' if missing_total > 1 else ''} without {y} skipped")

    x_values = _sort_key(list(dict.fromkeys(r[3] for r in rows)))
    hues = _sort_key(list(dict.fromkeys(r[2] for r in rows)))
    sources = list(dict.fromkeys((r[0], r[1]) for r in rows))  # live first, in order of appearance
    sources.sort(key=lambda s: s[0])
    several_sources = len(sources) > 1
    series = []
    for is_reference, source in sources:
        for h in hues:
            picked = [(r[3], r[4]) for r in rows if r[0] == is_reference and r[1] == source and r[2] == h]
            if not picked:
                continue
            grouped = pd.DataFrame(picked, columns=["x", "y"]).groupby("x", sort=False)["y"].median()
            xs = [v for v in x_values if v in grouped.index]
            parts = [] if hue is None else [f"{hue}={_fmt_value(h)}"]
            if several_sources or is_reference or hue is None:
                parts.append(source)
            series.append(dict(label=", ".join(parts), hue=h, reference=is_reference, x=xs,
                               y=[float(grouped[v]) for v in xs]))
    return series, x_values, notes


def _none_if_nan(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def _get(res, name: str):
    if isinstance(res, dict):
        return res.get(name)
    return getattr(res, name, None)


def _frame_rows(df: pd.DataFrame, label: str | None) -> dict | list:
    """A results frame's rows as dicts shaped like RunResults (``memory`` from the ``mem_*`` columns)."""
    if label is not None and label not in df.columns:
        raise ConfigError("label", label, f"a column of the frame ({', '.join(map(str, df.columns))})")
    rows = []
    for _, row in df.iterrows():
        item = {k: _none_if_nan(v) for k, v in row.items()}
        item["memory"] = {c: item.get(f"mem_{c}_bytes") for c in MEMORY_CATEGORIES
                          if item.get(f"mem_{c}_bytes") is not None}
        item["config"] = {k: item.get(k) for k in field_names() if k in item}
        rows.append(item)
    if label is None:
        return rows
    labelled = {}
    for item in rows:
        name = str(item[label])
        while name in labelled:
            name += "'"
        labelled[name] = item
    return labelled


def label_runs(results) -> dict:
    """label -> result: a dict as given; a list labelled by the config fields that differ between its runs."""
    if isinstance(results, dict) and "losses" not in results and "config" not in results:
        return {str(k): v for k, v in results.items()}
    if isinstance(results, (list, tuple)):
        results = list(results)
    else:
        results = [results]
    configs = [_get(r, "config") or {} for r in results]
    keys = sorted({k for c in configs for k in c})
    differing = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
    labels = {}
    for i, config in enumerate(configs):
        if differing:
            label = ", ".join(f"{k}={config.get(k)}" for k in differing)
        elif len(results) == 1:
            label = str(config.get("model", "run"))
        else:
            label = f"run {i}"
        while label in labels:
            label += "'"
        labels[label] = results[i]
    return labels


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` steps (shorter at the start), ignoring NaN."""
    series = pd.Series(values)
    return series.rolling(window, min_periods=1).mean().to_numpy()

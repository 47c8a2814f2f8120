"""Charts of a search or a trade-off: `batch_search` (the probes of a batch-size search) and `checkpoint_tradeoff`."""

from __future__ import annotations

import pandas as pd

from ..display import axis_label, scaled
from .figures import _axes, _finish, _renderer, grid
from .frames import _check_frame, _failed, as_frame


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
    unit = scaled("peak_memory_bytes", [*measured["peak_bytes"], search.budget_bytes or 0])
    top = max([*(measured["peak_bytes"] * unit.scale), (search.budget_bytes or 0) * unit.scale, 1.0]) * 1.08
    points = []
    for fits, color, label in ((True, "tab:green", "fits"), (False, "tab:red", "does not fit")):
        part = frame[frame["fits"] == fits]
        ys = [p * unit.scale if p == p and p is not None else top for p in part["peak_bytes"]]
        ax.plot(part["batch_size"], ys, linestyle="none", marker="o" if fits else "X", color=color, label=label)
        points += list(zip(part["step"], part["batch_size"], ys, strict=True))
    if search.budget_bytes:
        ax.axhline(search.budget_bytes * unit.scale, color="black", linestyle="--", label="budget")
    if search.state_bytes.get("total"):
        ax.axhline(search.state_bytes["total"] * unit.scale, color="grey", linestyle=":",
                   label="model's own memory (parameters, gradients, optimizer state)")
    if search.best:
        ax.axvline(search.best, color="tab:green", alpha=0.4, label=f"largest that fits: {search.best}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(axis_label("batch_size"))
    ax.set_ylabel(f"peak memory ({unit.unit})")
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
    frame = as_frame(frame)
    for column in ("segments", "peak_memory_bytes", "mem_activations_bytes", "predicted_activation_bytes",
                   "peak_ratio", "activation_ratio", "time_ratio", "sqrt_rule_segments"):
        _check_frame(frame, "frame", {"column": column})
    ok = frame[~_failed(frame)].sort_values("segments")
    fig, (left, right) = grid(2)
    unit = scaled("peak_memory_bytes", ok["peak_memory_bytes"].tolist())
    left.plot(ok["segments"], ok["mem_activations_bytes"] * unit.scale, marker="o", label="activations (measured)")
    left.plot(ok["segments"], ok["predicted_activation_bytes"] * unit.scale, marker="x", linestyle="--",
              label="activations (Chen et al. cost model)")
    left.plot(ok["segments"], ok["peak_memory_bytes"] * unit.scale, marker="s", label="peak memory")
    if len(ok):
        left.axvline(ok["sqrt_rule_segments"].iloc[0], color="grey", linestyle=":", label="sqrt(n) rule")
    left.set_xticks(list(ok["segments"]))
    left.set_xlabel("checkpointed segments (0 = off)")
    left.set_ylabel(f"memory ({unit.unit})")
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

"""Sections 5 and 6 of notebook 02: memory predicted from two batch sizes and checked against measured steps;
the exercise's line against `labkit.find_max_batch_size`."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from ...capacity import memory_model, step_memory
from ...config import RunConfig
from ...messages import worded


def prediction_table(cfg: RunConfig, fit_sizes: tuple[int, int] = (16, 32),
                     check_sizes: Iterable[int] = (64, 128, 256)):
    """Predict peak memory with a line through two small measured batches, then measure larger ones to check.

    Args:
        cfg: the run (its ``batch_size`` is ignored).
        fit_sizes: the two batch sizes the line ``fixed + bytes_per_sample x batch`` goes through.
        check_sizes: the sizes predicted and then measured with one real training step (`step_memory`).

    Returns:
        Two rows per checked size: ``batch_size``, ``kind`` (``"predicted from a and b"`` or ``"measured"``),
        ``peak_memory_bytes``, and ``prediction_error`` (predicted / measured - 1) on the predicted rows.

    Example:
        >>> table = prediction_table(cfg); plots.line(table, x="batch_size", y="peak_memory_bytes", hue="kind")
    """
    model = memory_model(cfg, batch_sizes=tuple(fit_sizes))
    label = f"predicted from {fit_sizes[0]} and {fit_sizes[1]}"
    rows = []
    for size in check_sizes:
        predicted = model.predict(size)["total"]
        measured = step_memory(cfg, size).total_bytes
        rows.append({"batch_size": size, "kind": label, "peak_memory_bytes": predicted,
                     "prediction_error": predicted / measured - 1})
        rows.append({"batch_size": size, "kind": "measured", "peak_memory_bytes": measured,
                     "prediction_error": None})
    return pd.DataFrame(rows)


@worded
def prediction_finding(table) -> str:
    """How far the two-point prediction was from the measurement at each checked size, in one line."""
    predicted = table[table["kind"] != "measured"]
    parts = [f"{row.prediction_error:+.1%} at batch {row.batch_size}" for row in predicted.itertuples()]
    worst = predicted["prediction_error"].abs().max()
    return (f"{predicted['kind'].iloc[0].capitalize()}: off by {', '.join(parts)} against the measured peaks "
            f"(worst {worst:.1%}).")


def estimate_frame(estimate: dict) -> pd.DataFrame:
    """`labkit.estimate_memory`'s dict as a frame for `labkit.display.table`: ``category``, ``predicted_bytes``."""
    return pd.DataFrame({"category": list(estimate), "predicted_bytes": list(estimate.values())})


def max_batch_numbers(line, budget_bytes: float) -> dict:
    """Your own numbers for exercise ``02.max_batch``: the fitted line (MiB, KiB per sample) and the budget.

    Args:
        line: `labkit.capacity.fit_linear_memory`'s line. budget_bytes: the memory budget.

    Example:
        >>> numbers = max_batch_numbers(capacity.fit_linear_memory(df.batch_size, df.peak_memory_bytes), BUDGET)
    """
    return {"fixed_mib": float(f"{line.fixed_bytes / 2**20:.3g}"),
            "kib_per_sample": float(f"{line.bytes_per_sample / 1024:.3g}"),
            "budget_mib": float(f"{budget_bytes / 2**20:.3g}")}


@worded
def line_vs_search(numbers: dict, found: int) -> str:
    """The largest batch the fitted line predicts beside the one `find_max_batch_size` found by probing.

    Args:
        numbers: `max_batch_numbers`' dict. found: the batch `find_max_batch_size` found.
    """
    predicted = math.floor((numbers["budget_mib"] - numbers["fixed_mib"]) * 1024 / numbers["kib_per_sample"])
    if found < 1:
        return f"Your line predicts batch {predicted}; find_max_batch_size found that not even one sample fits."
    if predicted == found:
        return f"Your line predicts batch {predicted}; find_max_batch_size found {found}: the same."
    direction = "more" if predicted > found else "fewer"
    return (f"Your line predicts batch {predicted}; find_max_batch_size found {found} by probing single steps "
            f"({abs(predicted - found)} {direction}, {predicted / found - 1:+.0%}).")

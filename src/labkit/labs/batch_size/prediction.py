"""Sections 5 and 6 of notebook 02: memory predicted from two batch sizes, and the exercise's line."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from ...capacity import memory_model, step_memory
from ...config import RunConfig
from ...labresult import LabResult
from ...messages import worded


class Prediction(LabResult):
    shown = ("batch_size", "kind", "peak_memory_bytes", "prediction_error")

    @worded
    def finding(self) -> str:
        predicted = self.frame[self.frame["kind"] != "measured"]
        parts = [f"{row.prediction_error:+.1%} at batch {row.batch_size}" for row in predicted.itertuples()]
        return (f"{predicted['kind'].iloc[0].capitalize()}: off by {', '.join(parts)} against the measured peaks "
                f"(worst {predicted['prediction_error'].abs().max():.1%}).")


def prediction_table(cfg: RunConfig, fit_sizes: tuple[int, int] = (16, 32),
                     check_sizes: Iterable[int] = (64, 128, 256)) -> Prediction:
    """Peak memory at ``check_sizes`` from a line through two measured batches, beside a measured step at each."""
    model = memory_model(cfg, batch_sizes=tuple(fit_sizes))
    label = f"predicted from {fit_sizes[0]} and {fit_sizes[1]}"
    rows = []
    for size in check_sizes:
        predicted, measured = model.predict(size)["total"], step_memory(cfg, size).total_bytes
        rows += [{"batch_size": size, "kind": label, "peak_memory_bytes": predicted,
                  "prediction_error": predicted / measured - 1},
                 {"batch_size": size, "kind": "measured", "peak_memory_bytes": measured, "prediction_error": None}]
    return Prediction(pd.DataFrame(rows))


def estimate_frame(estimate: dict) -> pd.DataFrame:
    """`labkit.estimate_memory`'s dict as a frame: ``category``, ``predicted_bytes``."""
    return pd.DataFrame({"category": list(estimate), "predicted_bytes": list(estimate.values())})


def max_batch_numbers(line, budget_bytes: float) -> dict:
    """Exercise ``02.max_batch``'s numbers from a fitted line (`labkit.capacity.fit_linear_memory`) and a budget."""
    return {"fixed_mib": float(f"{line.fixed_bytes / 2**20:.3g}"),
            "kib_per_sample": float(f"{line.bytes_per_sample / 1024:.3g}"),
            "budget_mib": float(f"{budget_bytes / 2**20:.3g}")}


@worded
def line_vs_search(numbers: dict, found: int) -> str:
    """The largest batch the fitted line predicts beside the one `find_max_batch_size` ``found`` by probing."""
    predicted = math.floor((numbers["budget_mib"] - numbers["fixed_mib"]) * 1024 / numbers["kib_per_sample"])
    if found < 1:
        return f"Your line predicts batch {predicted}; find_max_batch_size found that not even one sample fits."
    if predicted == found:
        return f"Your line predicts batch {predicted}; find_max_batch_size found {found}: the same."
    direction = "more" if predicted > found else "fewer"
    return (f"Your line predicts batch {predicted}; find_max_batch_size found {found} by probing single steps "
            f"({abs(predicted - found)} {direction}, {predicted / found - 1:+.0%}).")

"""From a results frame (or RunResults) to drawable series: failed runs skipped and counted, duplicates reduced
to their median, runs labelled by the config fields that differ."""

from __future__ import annotations

import difflib
import math
import numbers

import numpy as np
import pandas as pd

from ..config import field_names
from ..errors import ConfigError
from ..labresult import LabResult
from ..result import MEMORY_CATEGORIES

_LIVE = "live"
_REFERENCE = "reference"


def as_frame(data):
    """``data`` as a DataFrame: an experiment's result (`labkit.labresult.LabResult`) gives its frame."""
    return data.frame if isinstance(data, LabResult) else data


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
    df = as_frame(df)
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


def _fmt_value(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

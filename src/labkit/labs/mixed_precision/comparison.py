"""Notebook 01, sections 3, 4 and 8: the same fine-tune in four precision setups, and the verdict lines on it.

A speed difference is real only when the two runs' step-time spreads (10th to 90th percentile of the timed
steps) do not overlap; an accuracy difference only above the test set's noise (`labkit.measure.accuracy_noise`).
"""

from __future__ import annotations

import math

import pandas as pd

from ... import results
from ...env import has_tensor_cores, native_bf16, profile, profile_of
from ...errors import ConfigError
from ...measure import PEAK_FLOPS, accuracy_noise, ratio_band, separated
from ...messages import worded
from ...units import MIB, change_between

SETUPS = {
    "fp32": {"precision": "fp32", "tf32": False},
    "fp32 + TF32": {"precision": "fp32", "tf32": True},
    "fp16 + GradScaler": {"precision": "fp16", "tf32": False},
    "bf16": {"precision": "bf16", "tf32": False},
}
LOW_SETUPS = ("fp16 + GradScaler", "bf16")
SPEEDUP_SOURCE = "published: NVIDIA T4 datasheet, tensor-core fp16 peak / fp32 peak"


def setup_label(precision: str, tf32: bool) -> str:
    """The name a run's precision setup has in the notebook's tables and charts.

    Args:
        precision: the run's precision (``fp32``, ``fp16``, ``bf16``).
        tf32: whether TF32 was on.
    """
    for label, fields in SETUPS.items():
        if fields == {"precision": precision, "tf32": bool(tf32)}:
            return label
    return f"{precision} + TF32" if tf32 else precision


def low_setup(low: str) -> str:
    """The setup label of a low precision in `table`'s frames.

    Args:
        low: ``bf16`` or ``fp16``.
    """
    return setup_label(low, False)


def table(runs) -> pd.DataFrame:
    """A results frame (one row per run) with a ``setup`` column, from RunResults or a results frame.

    Args:
        runs: `compare`'s dict, a list of `RunResult`, or a frame (e.g. ``labkit.load_reference``'s).

    Example:
        >>> df = table(compare(cfg)); df[["setup", "step_time_s", "peak_memory_bytes"]]
    """
    if isinstance(runs, dict):
        runs = list(runs.values())
    frame = runs.copy() if isinstance(runs, pd.DataFrame) else results.to_frame(runs)
    used = frame["precision"]
    if "precision_used" in frame:  # what a run resolved to ("auto"); a failed run resolved nothing
        ran = frame["precision_used"].notna() & (frame["error"].isna() if "error" in frame else True)
        used = frame["precision_used"].where(ran, frame["precision"])
    frame["setup"] = [setup_label(p, t) for p, t in zip(used, frame["tf32"], strict=True)]
    return frame


def compare(cfg, setups: dict | None = None, refresh: bool = False, progress: bool = True) -> dict:
    """Run the same fine-tune once per precision setup (cached like `labkit.sweep`'s runs).

    Args:
        cfg: the run; each setup replaces its ``precision`` and ``tf32``.
        setups: label -> fields (default `SETUPS`: fp32, fp32 + TF32, fp16 + GradScaler, bf16).
        refresh: train again instead of reading the cache.
        progress: show a progress bar.

    Returns:
        A dict label -> `RunResult`; a setup the device refuses is a result with its ``error``.
    """
    setups = setups or SETUPS
    configs = [cfg.replace(**fields) for fields in setups.values()]
    runs = results.run_configs(configs, refresh=refresh, progress=progress)
    return dict(zip(setups, runs, strict=True))


def has_tf32(env: dict) -> bool:
    """Whether the device has TF32: Ampere (capability 8.0) and later GPUs only.

    Args:
        env: `labkit.env_report()`.
    """
    capability = env.get("capability")
    return env.get("device") == "cuda" and bool(capability) and native_bf16(
        tuple(int(v) for v in str(capability).split(".")))


def _by_setup(df) -> dict:
    """The successful runs of a results frame, by setup label."""
    frame = df if "setup" in df else table(df)
    return {row["setup"]: row for _, row in frame.iterrows() if not isinstance(row.get("error"), str)}


def _ran(df, *labels: str) -> dict:
    """The successful runs of ``labels``; a setup that failed or is missing is a `ConfigError` naming it."""
    rows = _by_setup(df)
    missing = [label for label in labels if label not in rows]
    if missing:
        raise ConfigError("df", f"setups {sorted(rows)}", f"a frame where {', '.join(missing)} ran successfully "
                                                         "(a failed run has no numbers to compare)")
    return rows


def _spread(row) -> tuple[float, float]:
    """A run's step-time 10th-90th percentile spread; the median where the spread was not recorded."""
    median = row["step_time_s"]
    low, high = row.get("step_time_p10_s", median), row.get("step_time_p90_s", median)
    return (median, median) if pd.isna(low) or pd.isna(high) else (low, high)


def faster(row, base) -> bool | None:
    """True when ``row``'s steps are faster than ``base``'s beyond the noise, False when slower, None: the same.

    Args:
        row, base: runs with ``step_time_s`` and, where measured, ``step_time_p10_s`` / ``step_time_p90_s``.
    """
    order = separated(_spread(row), _spread(base))
    if order is None:  # a spread not recorded (a reference row, one timed step): the medians are all there is
        order = (row["step_time_s"] > base["step_time_s"]) - (row["step_time_s"] < base["step_time_s"])
    return {-1: True, 1: False}.get(order)


def speed_phrase(row, base, reference: str = "fp32") -> str:
    """``"1.52x fp32's speed (faster)"``: the speed ratio and whether it lies outside the measured noise.

    Args:
        row, base: the run and the one it is compared with (see `faster`).
        reference: what to call ``base``.
    """
    return f"{base['step_time_s'] / row['step_time_s']:.2f}x {reference}'s speed ({_verdict(row, base)})"


def _verdict(row, base) -> str:
    return {True: "faster", False: "slower", None: "the same within the noise"}[faster(row, base)]


def _test_size(row) -> int:
    run_profile = profile_of(row.get("profile")) if isinstance(row.get("profile"), str) else None
    return (run_profile or profile()).test_size


@worded
def summary(df) -> str:
    """One verdict line per low-precision setup: speed against fp32, peak memory, accuracy.

    Args:
        df: `table`'s frame.
    """
    rows = _by_setup(df)
    base = rows.get("fp32")
    if base is None:
        return "No successful fp32 run to compare against."
    lines = []
    for label in (label for label in LOW_SETUPS if label in rows):
        row = rows[label]
        line = (f"{label}: {speed_phrase(row, base)}, peak memory "
                f"{change_between(row['peak_memory_bytes'], base['peak_memory_bytes'])}")
        if row.get("accuracy") is not None and base.get("accuracy") is not None:
            line += f", accuracy {row['accuracy']:.1%} vs {base['accuracy']:.1%}"
            planned = row.get("planned_steps")
            if planned is not None and not pd.isna(planned):
                line += f" (after {int(row['steps'])} of {int(planned)} steps: emulated)"
            elif abs(row["accuracy"] - base["accuracy"]) <= accuracy_noise(base["accuracy"], _test_size(base)):
                line += " (the same within the noise)"
        lines.append(line + ".")
    return "\n".join(lines)


@worded
def tf32_finding(df, env: dict) -> str:
    """One verdict line on TF32: its speed against true fp32, and whether this device has TF32 at all.

    Args:
        df: `table`'s frame.
        env: `labkit.env_report()`.
    """
    rows = _by_setup(df)
    if "fp32" not in rows or "fp32 + TF32" not in rows:
        return "Run both fp32 setups (TF32 off and on) to see what TF32 does."
    phrase = "TF32: " + speed_phrase(rows["fp32 + TF32"], rows["fp32"])
    if has_tf32(env):
        return phrase + "."
    where = "a CPU" if env.get("device") != "cuda" else f"this GPU (capability {env.get('capability')})"
    return phrase + f": {where} has no TF32, both runs did the same work."


def _hardware_choice(env: dict) -> tuple[str, str]:
    """The precision this device's capabilities point to, and why, in a few words."""
    if env.get("device") != "cuda":
        if env.get("bf16"):
            return "bf16", "this CPU has bf16 instructions"
        return "fp32", "this CPU has no bf16 instructions" if env.get("bf16") is False else "bf16 support unknown"
    capability = str(env.get("capability"))
    major, minor = (int(v) for v in capability.split("."))
    if not has_tensor_cores((major, minor)):
        return "fp16 for memory, measure before counting on speed", f"capability {capability}: no tensor cores"
    if not native_bf16((major, minor)):
        return "fp16 + GradScaler", f"capability {capability}: fp16 tensor cores, no native bf16"
    return "bf16", f"capability {capability}: native bf16 on tensor cores"


@worded
def advice(env: dict, df=None) -> str:
    """One verdict line: which precision to use here, from the device's capabilities and what this run measured.

    Args:
        env: `labkit.env_report()`.
        df: `table`'s frame (optional): its measured speeds are quoted.

    Example:
        >>> print(advice(labkit.env_report(), table(runs)))
    """
    choice, why = _hardware_choice(env)
    rows = _by_setup(df) if df is not None else {}
    low = low_setup("bf16" if choice == "bf16" else "fp16")
    if env.get("device") != "cuda" and "fp32" in rows and low in rows and faster(rows[low], rows["fp32"]) is not True:
        choice, why = "fp32", f"{low} was not faster here"
    text = f"Here: {choice} ({why})."
    measured = [f"{label} {rows['fp32']['step_time_s'] / rows[label]['step_time_s']:.2f}x" for label in LOW_SETUPS
                if label in rows and "fp32" in rows]
    return text + (f" Measured: {', '.join(measured)} fp32's speed." if measured else "")


@worded
def memory_savings(df, low: str) -> str:
    """One verdict line on a sweep over ``precision=["fp32", low]`` and batch sizes: the saving, and its trend.

    Args:
        df: the sweep's frame.
        low: the low precision, ``bf16`` or ``fp16``.
    """
    ok = df[df["error"].isna()] if "error" in df else df
    savings, fixed_changed = [], False
    for batch_size, group in ok.groupby("batch_size"):
        by = {row["precision"]: row for _, row in group.iterrows()}
        if "fp32" in by and low in by:
            full, half = by["fp32"], by[low]
            savings.append((batch_size, full["peak_memory_bytes"] - half["peak_memory_bytes"],
                            change_between(half["peak_memory_bytes"], full["peak_memory_bytes"])))
            fixed_changed |= any(abs(full[f"mem_{c}_bytes"] - half[f"mem_{c}_bytes"]) >= 1024
                                 for c in ("parameters", "gradients", "optimizer_state"))
    if not savings:
        return f"No batch size with both fp32 and {low} runs."
    shown = [savings[0], savings[-1]] if len(savings) > 1 else savings
    parts = " and ".join(f"{saved / MIB:.1f} MiB ({words}) at batch {b}" for b, saved, words in shown)
    fixed = "the fixed part changed too" if fixed_changed else "parameters, gradients and optimizer state unchanged"
    trend = "" if len(savings) < 2 else (": the saving grows with the batch" if savings[-1][1] > savings[0][1]
                                         else ": the saving does not grow with the batch")
    return f"{low} saved {parts}; {fixed}{trend}."


@worded
def channels_last_finding(df) -> str:
    """One verdict line on a sweep over ``channels_last``: its speed against the default layout, per precision.

    Args:
        df: a sweep frame with ``precision``, ``channels_last`` and the step-time columns.
    """
    ok = df[df["error"].isna()] if "error" in df else df
    parts = []
    for precision_name, group in ok.groupby("precision", sort=False):
        by = {bool(row["channels_last"]): row for _, row in group.iterrows()}
        if True in by and False in by:
            ratio = by[False]["step_time_s"] / by[True]["step_time_s"]
            parts.append(f"{precision_name} {ratio:.2f}x ({_verdict(by[True], by[False])})")
    return f"channels_last, speed against the default layout: {'; '.join(parts)}." if parts else (
        "No pair of layouts to compare.")


def peak_fraction(df, low: str) -> float:
    """The ``low`` setup's peak memory as a fraction of fp32's (the figure section 3 asks to predict).

    Args:
        df: `table`'s frame.
        low: ``bf16`` or ``fp16``.
    """
    rows = _ran(df, "fp32", low_setup(low))
    return rows[low_setup(low)]["peak_memory_bytes"] / rows["fp32"]["peak_memory_bytes"]


def speedup(df, low: str) -> float:
    """fp32's step time over the ``low`` setup's: above 1, ``low`` is faster.

    Args:
        df: `table`'s frame.
        low: ``bf16`` or ``fp16``.
    """
    rows = _ran(df, "fp32", low_setup(low))
    return rows["fp32"]["step_time_s"] / rows[low_setup(low)]["step_time_s"]



def speedup_band(df, low: str) -> tuple[float, float]:
    """The range of `speedup` that the two runs' step-time spreads (10th-90th percentile) allow.

    Args:
        df: `table`'s frame. low: ``bf16`` or ``fp16``.
    """
    rows = _ran(df, "fp32", low_setup(low))
    return ratio_band(_spread(rows["fp32"]), _spread(rows[low_setup(low)]))

def own_saving_numbers(df, low: str) -> dict:
    """Your own numbers for exercise ``01.own_saving``, from the comparison's frame (MiB, three digits).

    Args:
        df: `table`'s frame.
        low: ``bf16`` or ``fp16``.
    """
    rows = _ran(df, "fp32", low_setup(low))
    fp32, lower = rows["fp32"], rows[low_setup(low)]

    def in_mib(value):
        return float(f"{value / MIB:.3g}")

    return {"fp32_peak_mib": in_mib(fp32["peak_memory_bytes"]),
            "fp32_activations_mib": in_mib(fp32["mem_activations_bytes"]),
            "low_activations_mib": in_mib(lower["mem_activations_bytes"]), "low": low}


@worded
def own_saving_finding(df, low: str) -> str:
    """One verdict line: the measured saving beside the one the exercise computes from the activations alone.

    Args:
        df: `table`'s frame.
        low: ``bf16`` or ``fp16``.
    """
    numbers = own_saving_numbers(df, low)
    from_activations = (numbers["fp32_activations_mib"] - numbers["low_activations_mib"]) / numbers["fp32_peak_mib"]
    measured = 1 - peak_fraction(df, low)
    rest = ("the rest is the other categories" if abs(measured - from_activations) > 0.005
            else "the activations account for all of it")
    return (f"From the activations alone: {from_activations:.1%} of the fp32 peak; measured: {low} saved "
            f"{measured:.1%} of it: {rest}.")


def speedups(df, published: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each setup's speed relative to fp32, and published speed-ups (never measured here) to draw beside it.

    Args:
        df: `table`'s frame.
        published: ``labkit.load_reference`` rows with published speed-ups; the T4's peak ratio is added.

    Returns:
        ``(live, reference)`` frames with ``setup`` and ``speedup_vs_fp32``, for
        ``plots.bar(live, x="setup", y="speedup_vs_fp32", reference=reference)``.
    """
    rows = _ran(df, "fp32")
    base = rows["fp32"]["step_time_s"]
    live = pd.DataFrame([{"setup": label, "speedup_vs_fp32": base / row["step_time_s"], "source": "live"}
                         for label, row in rows.items()])
    t4 = PEAK_FLOPS["T4"]
    reference = [{"setup": "T4 peak ratio", "speedup_vs_fp32": t4["fp16"] / t4["fp32"], "source": SPEEDUP_SOURCE}]
    if published is not None and len(published):
        reference = published[["setup", "speedup_vs_fp32", "source"]].to_dict("records") + reference
    return live, pd.DataFrame(reference)


@worded
def scaler_finding(trace: pd.DataFrame) -> str:
    """One verdict line on a `scaler_trace`: steps skipped, and where the scale started and ended.

    Args:
        trace: `scaler_trace`'s frame.
    """
    skipped = int(trace["skipped"].sum())
    first, last = trace["scale"].iloc[0], trace["scale"].iloc[-1]
    return (f"{skipped} of {len(trace)} optimizer steps were skipped (inf/NaN gradients); the scale went from "
            f"2**{math.log2(first):.0f} to 2**{math.log2(last):.0f} by the last step.")

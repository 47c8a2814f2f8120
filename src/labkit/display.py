"""How a measured column is shown to a learner, in charts, tables and the CLI alike.

`METRICS` gives each known column its label, unit and scale (``step_time_s`` is "step time" in ms). Bytes and
counts take the unit that suits the values shown (KiB to TiB; thousands to billions), so a table never shows
raw bytes and a chart never shows "0.0179 millions". Numbers keep three significant digits. `table` shows at most
`MAX_TABLE_COLUMNS` columns; the DataFrame it is given keeps every column and the raw numbers.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import pandas as pd

from .errors import ConfigError
from .result import MEMORY_CATEGORIES

MAX_TABLE_COLUMNS = 7
SIGNIFICANT_DIGITS = 3
BYTES, COUNT = "bytes", "count"  # units chosen from the values: see `scaled`
_BYTE_UNITS = (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))
_COUNT_UNITS = (("", 1), ("thousands", 1e3), ("millions", 1e6), ("billions", 1e9))


class Metric(NamedTuple):
    """How a column is shown: ``label``, display ``unit`` and ``scale`` (display value = value * scale)."""

    label: str
    unit: str
    scale: float


def _m(label: str, unit: str = "", scale: float = 1.0) -> Metric:
    return Metric(label, unit, scale)


METRICS: dict[str, Metric] = {
    "step_time_s": _m("step time", "ms", 1e3),
    "time_s": _m("time", "ms", 1e3),
    "step_time_p10_s": _m("step time, 10th percentile", "ms", 1e3),
    "step_time_p90_s": _m("step time, 90th percentile", "ms", 1e3),
    "train_time_s": _m("training time", "s"),
    "epoch_time_s": _m("training time per epoch", "s"),
    "inference_time_s": _m("inference time, test split", "ms", 1e3),
    "throughput": _m("throughput", "samples/s"),
    "peak_memory_bytes": _m("peak memory", BYTES),
    "reserved_memory_bytes": _m("reserved memory", BYTES),
    "model_size_bytes": _m("model size", BYTES),
    "accuracy": _m("accuracy", "%", 100.0),
    "achieved_flops": _m("achieved FLOP/s", "TFLOP/s", 1e-12),
    "peak_flops": _m("peak FLOP/s", "TFLOP/s", 1e-12),
    "flops_per_step": _m("FLOPs per step", "GFLOP", 1e-9),
    "mfu": _m("model FLOP utilisation", "% of peak", 100.0),
    "speedup_vs_fp32": _m("speed-up over fp32", "x"),
    "num_params": _m("parameters", COUNT),
    "num_trainable_params": _m("trainable parameters", COUNT),
    "trainable_params": _m("trainable parameters", COUNT),
    "batch_size": _m("batch size", "samples"),
    "lr": _m("learning rate"),
    "bucket_cap_mb": _m("DDP bucket size", "MB"),
    "threads_per_rank": _m("CPU threads per rank"),
    "max_abs_error": _m("largest absolute error"),
    "float_accuracy": _m("accuracy before int8", "%", 100.0),
    # freezing (notebook 05)
    "mean_step_time_s": _m("mean step time", "ms", 1e3),
    "forward_flops": _m("forward FLOPs per step", "GFLOP", 1e-9),
    "backward_flops": _m("backward FLOPs per step", "GFLOP", 1e-9),
    "saved_activation_bytes": _m("activations kept for backward", BYTES),
    # pruning (notebook 04)
    "latency_s": _m("inference latency", "ms", 1e3),
    "cpu_latency_s": _m("CPU inference latency", "ms", 1e3),
    "inference_peak_bytes": _m("inference peak memory", BYTES),
    "val_accuracy": _m("validation accuracy", "%", 100.0),
    "test_accuracy": _m("test accuracy", "%", 100.0),
    "sparsity": _m("sparsity", "%", 100.0),
    "amount": _m("amount pruned", "%", 100.0),
    "params_removed": _m("parameters removed or zeroed", "%", 100.0),
    "flops": _m("FLOPs per forward", "GFLOP", 1e-9),
    "accuracy_drop": _m("validation accuracy lost", "points", 100.0),
    "weight_bytes": _m("weight storage", BYTES),
    "matmul_s": _m("matmul time", "ms", 1e3),
    # quantization (notebook 06)
    "size_vs_fp32": _m("file size, share of fp32's", "%", 100.0),
    "cpu_speedup": _m("CPU speed-up over fp32", "x"),
    "gpu_latency_s": _m("GPU inference latency", "ms", 1e3),
    "gpu_speedup": _m("GPU speed-up over fp32", "x"),
    "mean_abs_error": _m("mean absolute error"),
    "relative_error": _m("relative error (norm)", "%", 100.0),
    "extra_train_time_s": _m("extra training time", "s"),
    "loss_difference": _m("|loss difference|"),
    "world_size": _m("processes (world size)"),
    "speedup": _m("speed-up over 1 process", "x"),
    "efficiency": _m("scaling efficiency T1 / (N x TN)", "%", 100.0),
    "comm_share": _m("all-reduce share of a step", "%", 100.0),
    "allreduces_per_step": _m("gradient all-reduces per step", "buckets"),
    "process_rank": _m("rank (process)"),
    "label_tokens": _m("label tokens (timed steps)"),
    "label_tokens_per_rank": _m("label tokens, rank by rank"),
    "weight_gap": _m("largest weight difference from 1 process"),
    "sent_bytes": _m("sent a step", BYTES),
    "planned_sent_bytes": _m("the plan's bytes sent a step", BYTES),
    "communication_bytes": _m("sent a step (predicted)", BYTES),
    # LoRA (notebook 08)
    "lora_rank": _m("LoRA rank"),
    "rank": _m("LoRA rank"),
    "trainable_share": _m("trainable share of the parameters", "%", 100.0),
    "base_weight_bytes": _m("frozen Linear weights", BYTES),
    "vs_base": _m("latency against the base model", "x"),
    "max_output_diff": _m("largest output difference"),
    # the recipe (notebook 09)
    "stage": _m("stage"),
    "self_ms": _m("operators' self time", "ms"),
    "share": _m("share of the operators' self time", "%", 100.0),
    "top1_error_pct": _m("top-1 error", "%"),
    "fp32_top1_pct": _m("fp32 top-1 accuracy", "%"),
    "int8_top1_pct": _m("int8 top-1 accuracy", "%"),
    "imdb_val_error_pct": _m("IMDb error", "%"),
    "trec6_val_error_pct": _m("TREC-6 error", "%"),
    "ag_val_error_pct": _m("AG News error", "%"),
    "squad_f1": _m("SQuAD F1"),
    "bytes_per_param": _m("memory per parameter", "bytes/param"),
    "training_memory_gb": _m("training memory", "GB"),
    "activation_memory_gb": _m("activation memory", "GB"),
    "model_states_per_gpu_gb": _m("model states per GPU", "GB"),
    "training_vram_gb": _m("GPU memory in training", "GB"),
    "speedup_vs_dense": _m("speed-up over dense", "x"),
    "speedup_vs_eager": _m("speed-up over eager", "x"),
    "speedup_vs_baseline": _m("speed-up over the setup's baseline", "x"),
    "int8_compute_speedup_vs_fp32": _m("int8 compute speed-up over fp32", "x"),
    "scaling_efficiency": _m("scaling efficiency", "%", 100.0),
    "time_ratio": _m("time, with / without", "x"),
    "memory_ratio": _m("peak memory, with / without", "x"),
    "loss_matches_full_batch": _m("accumulated loss matches one large batch"),
    "size_ratio": _m("model size, with / without", "x"),
    "accuracy_change": _m("accuracy change", "points", 100.0),
    # language models (notebook 10)
    "tokens_per_s": _m("token throughput", "tokens/s"),
    "real_tokens_per_s": _m("real-token throughput (padding left out)", "tokens/s"),
    "pad_fraction": _m("padding share of the tokens", "%", 100.0),
    "compile_time_s": _m("compile time (first step)", "s"),
    "test_loss": _m("test loss", "nats per token"),
    "seq_len": _m("sequence length", "tokens"),
    "vocab_size": _m("vocabulary", "thousand tokens", 1e-3),
    "chars_per_token": _m("characters per token"),
    "peak_ratio": _m("peak memory, against one cross-entropy", "x"),
    "loss_diff": _m("relative loss difference"),
    "grad_diff": _m("relative gradient difference"),
    "bytes_per_token": _m("KV cache per token (formula)", BYTES),
    "measured_bytes_per_token": _m("KV cache per token (measured)", BYTES),
    # LoRA and QLoRA on the language model (notebook 08)
    "exact_match": _m("exact match", "%", 100.0),
    "bits_per_4bit_weight": _m("bits per 4-bit weight (scales included)"),
    "estimate_bytes": _m("formula's peak", BYTES),
    "estimate_error": _m("formula against measured", "%", 100.0),
    "tokens_per_step": _m("tokens a step"),
    "micro_batch_rows": _m("rows a micro-batch"),
    "latency_per_token_s": _m("CPU latency per token", "s"),
    "perplexity": _m("perplexity of the answers"),
    "vs_fp32": _m("latency against fp32", "x"),
    "samples_per_rank": _m("samples per rank", "samples"),
    "final_loss": _m("final loss"),
    "identical_weights": _m("identical weights"),
    "grad_accum": _m("accumulation steps"),
    "fail_how": _m("failure"),
    "rank_named": _m("rank named"),
    "exit_code": _m("exit code"),
    "strategy": _m("strategy"),
    "fits": _m("fits"),
    "per_gpu_bytes": _m("per GPU", BYTES),
    "formula_flops_per_step": _m("FLOPs per step, by formula", "GFLOP", 1e-9),
    "max_logit_diff_cache_on": _m("largest logit difference, cache on"),
    "gradient_error": _m("gradient error"),
    **{f"mem_{c}_bytes": _m(f"memory: {c.replace('_', ' ')}", BYTES) for c in MEMORY_CATEGORIES},
}


def metric(column: str) -> Metric:
    """The `Metric` of ``column``: known columns from `METRICS`, else by its suffix (``_bytes``, ``_s``), else its
    name as it is (a model name such as ``small_cnn`` keeps its underscores).

    Example:
        >>> metric("peak_memory_bytes")
        Metric(label='peak memory', unit='bytes', scale=1.0)
    """
    column = str(column)
    if column in METRICS:
        return METRICS[column]
    name = column.replace("_", " ")
    for suffix, unit, scale in (("_bytes", BYTES, 1.0), ("_params", COUNT, 1.0), ("_ms", "ms", 1.0),
                                ("_s", "s", 1.0), ("_share", "%", 100.0), ("_fraction", "%", 100.0)):
        if column.endswith(suffix):
            return Metric(name[: -len(suffix)].strip(), unit, scale)
    return Metric(column, "", 1.0)


def scaled(column: str, values=()) -> Metric:
    """``column``'s `Metric` with a unit that suits ``values`` (KiB..TiB, thousands..billions, ms).

    Bytes in KiB..TiB and counts in thousands..billions, so that the largest value shown lies in [1, 1024) or
    [1, 1000); seconds below 0.1 s in ms.

    Example:
        >>> scaled("peak_memory_bytes", [3 * 2**30]).unit, scaled("num_params", [17_930]).unit
        ('GiB', 'thousands')
    """
    m = metric(column)
    finite = [abs(float(v)) for v in values if _is_number(v) and math.isfinite(float(v))]
    largest = max(finite, default=0.0)
    if m.unit in (BYTES, COUNT):
        units = _BYTE_UNITS if m.unit == BYTES else _COUNT_UNITS
        if not finite:  # nothing to fit the unit to: MiB (the lab's usual size) or plain counts
            return Metric(m.label, "MiB" if m.unit == BYTES else "", m.scale / (2**20 if m.unit == BYTES else 1))
        unit, size = units[0]
        for name, step in units:
            if largest >= step:
                unit, size = name, step
        return Metric(m.label, unit, m.scale / size)
    if m.unit == "s" and m.scale == 1.0 and finite and largest < 0.1:
        return Metric(m.label, "ms", 1e3)
    return m


def quantity(column: str, value) -> str:
    """One measured ``value`` of ``column`` with its unit, as a finding line writes it: "44.7 MiB", "40.5 ms".

    Example:
        >>> quantity("peak_memory_bytes", 3 * 2**30), quantity("step_time_s", 0.0405)
        ('3 GiB', '40.5 ms')
    """
    m = scaled(column, [value])
    shown = number(value * m.scale) if _is_number(value) else str(value)
    return f"{shown} {m.unit}" if m.unit and m.unit not in ("x", "%") else f"{shown}{m.unit}"


def axis_label(column: str, values=()) -> str:
    """``"step time (ms)"`` for ``step_time_s``; the column's name for a column without a unit."""
    m = scaled(column, values)
    return f"{m.label} ({m.unit})" if m.unit else m.label


def number(value, digits: int = SIGNIFICANT_DIGITS) -> str:
    """``value`` as text with ``digits`` significant digits; "" for a missing value.

    No exponent between 1e-4 and 1e6; integers up to 99,999 exactly (batch sizes, steps, ranks).

    Example:
        >>> number(0.123456), number(28_000_000_000.0), number(256), number(1234.5)
        ('0.123', '2.80e+10', '256', '1,230')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool) or not _is_number(value):
        return str(value)
    value = float(value)
    if value.is_integer() and abs(value) < 100_000:
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    if value == 0 or not math.isfinite(value):
        return str(value)
    rounded = float(f"{value:.{digits}g}")
    if 1e-4 <= abs(rounded) < 1e6:
        if abs(rounded) >= 10 ** (digits - 1):
            return f"{int(round(rounded)):,}"
        return f"{rounded:.{digits}g}"
    return f"{rounded:.{digits - 1}e}"


def frame(df: pd.DataFrame, columns=None) -> pd.DataFrame:
    """``df``'s ``columns`` as text in display units, headed by their labels and units.

    ``columns`` defaults to all, at most `MAX_TABLE_COLUMNS`. The DataFrame given keeps every column and the raw
    numbers.

    Example:
        >>> frame(results_frame, ["precision", "step_time_s", "peak_memory_bytes"])
    """
    if not isinstance(df, pd.DataFrame):
        raise ConfigError("df", type(df).__name__, "a pandas DataFrame")
    columns = list(df.columns if columns is None else columns)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError("columns", missing[0], f"columns of the frame ({', '.join(map(str, df.columns))})")
    if len(columns) > MAX_TABLE_COLUMNS:
        raise ConfigError("columns", f"{len(columns)} columns", f"at most {MAX_TABLE_COLUMNS}: choose the ones to "
                                                                "show (the DataFrame keeps the rest)")
    shown = {}
    for column in columns:
        values = df[column].tolist()
        numeric = [v for v in values if _is_number(v)]
        m = scaled(column, numeric)
        header = axis_label(column, numeric) if numeric else m.label
        shown[header] = [number(v * m.scale) if _is_number(v) else ("" if _missing(v) else str(v)) for v in values]
    return pd.DataFrame(shown, index=df.index)


def table(df: pd.DataFrame, columns=None):
    """`frame` as a table for Jupyter (no index column, numbers right-aligned, text left-aligned and shown whole).

    Example:
        >>> display.table(lab.sweep_frame(runs), ["setup", "step_time_s", "peak_memory_bytes", "accuracy"])
    """
    text = frame(df, columns)
    numeric = [c for c, col in zip(text.columns, columns or list(df.columns), strict=True)
               if any(_is_number(v) for v in df[col])]
    styler = text.style.hide(axis="index").set_properties(**{"text-align": "left", "white-space": "pre-wrap"})
    return styler.set_properties(subset=numeric, **{"text-align": "right"})


def text_table(df: pd.DataFrame, columns=None) -> str:
    """`frame` as plain text, for the CLI."""
    return frame(df, columns).to_string(index=False)


def text_record(row: dict, columns) -> str:
    """One result as two columns of text, ``label (unit)`` and its value, for the ``columns`` it has.

    Example:
        >>> print(text_record(to_row(result), ["model", "step_time_s", "peak_memory_bytes"]))
    """
    lines = []
    for column in columns:
        value = row.get(column)
        if _missing(value):
            continue
        m = scaled(column, [value] if _is_number(value) else [])
        label = f"{m.label} ({m.unit})" if m.unit and _is_number(value) else m.label
        lines.append((label, number(value * m.scale) if _is_number(value) else str(value)))
    width = max((len(label) for label, _ in lines), default=0)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not _missing(value)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA

"""Section 3 of notebook 10, attention against sequence length: eager attention (the softmax of Q K^T written out)
keeps each layer's rows x heads x L x L probabilities for the backward pass; SDPA's fused kernel keeps none. Both
run at each length, the activations' peak measured, the probabilities' bytes computed beside the difference."""

from __future__ import annotations

import math

import pandas as pd

from ...choices import ATTN_IMPLEMENTATIONS
from ...display import number
from ...errors import ConfigError
from ...measure import separated
from ...messages import worded
from ...models import LANGUAGE_MODELS
from ...results import cached_frame
from ...train import fit
from ...units import mib
from .throughput import lm_config

IMPLEMENTATIONS = ATTN_IMPLEMENTATIONS


def probabilities_bytes(rows: int, seq_len: int, model: str = "tiny_llama", dtype_bytes: int = 4) -> int:
    """Bytes of the attention probabilities eager attention saves: rows x heads x L^2 x ``dtype_bytes`` x layers.

    Example:
        >>> probabilities_bytes(2, 128)  # tiny_llama: 4 heads, 4 layers, float32
        2097152
    """
    spec = LANGUAGE_MODELS[model]
    return rows * spec.num_attention_heads * seq_len**2 * dtype_bytes * spec.num_hidden_layers


def attention_memory(seq_lens=(32, 64, 128), batch_size: int = 2, progress: bool = False, refresh: bool = False,
                     **fields) -> pd.DataFrame:
    """Each length run with SDPA then eager (random-weight tiny_llama, pydoc_text padded to the length; cached).

    Args:
        seq_lens: row widths, shortest first. batch_size: rows.
        progress: show the runs' progress bars. refresh: measure again. fields: other `RunConfig` fields
        (`throughput.lm_config`'s).

    Returns:
        One row per length: ``{impl}_activation_bytes``, ``{impl}_step_time_s`` and its ``_p10_s``/``_p90_s`` for
        ``sdpa`` and ``eager``, ``extra_bytes`` (eager minus SDPA), ``probabilities_bytes``,
        ``extra_over_probabilities``.

    Example:
        >>> attention_memory((32, 128))[["seq_len", "extra_bytes", "probabilities_bytes"]]
    """
    seq_lens = list(seq_lens)
    if not seq_lens or seq_lens != sorted(set(seq_lens)):
        raise ConfigError("seq_lens", seq_lens, "distinct row widths, shortest first, e.g. (32, 64, 128)")
    cfgs = {(seq_len, impl): lm_config(seq_len, batch_size, impl, **fields)
            for seq_len in seq_lens for impl in IMPLEMENTATIONS}
    model = fields.get("model", "tiny_llama")
    return cached_frame("lm-attention", cfgs.values(), lambda: _attention_frame(cfgs, seq_lens, batch_size, model,
                                                                                progress), refresh=refresh)


def _attention_frame(cfgs: dict, seq_lens: list[int], batch_size: int, model: str, progress: bool) -> pd.DataFrame:
    rows = []
    for seq_len in seq_lens:
        row = {"seq_len": seq_len}
        for impl in IMPLEMENTATIONS:  # the two runs of a length back to back, so their times compare
            res = fit(cfgs[(seq_len, impl)], progress=progress)
            row[f"{impl}_activation_bytes"] = res.memory.get("activations")
            for key in ("step_time_s", "step_time_p10_s", "step_time_p90_s"):
                row[f"{impl}_{key}"] = getattr(res, key)
        row["extra_bytes"] = row["eager_activation_bytes"] - row["sdpa_activation_bytes"]
        row["probabilities_bytes"] = probabilities_bytes(batch_size, seq_len, model)
        row["extra_over_probabilities"] = row["extra_bytes"] / row["probabilities_bytes"]
        rows.append(row)
    return pd.DataFrame(rows)


def growth_exponent(frame: pd.DataFrame, column: str = "extra_bytes") -> float:
    """The power p in ``column`` ~ L^p between the shortest and the longest length (NaN where not both positive)."""
    first, last = frame.iloc[0], frame.iloc[-1]
    if first[column] <= 0 or last[column] <= 0:
        return math.nan
    return math.log(last[column] / first[column]) / math.log(last["seq_len"] / first["seq_len"])


@worded
def attention_finding(frame: pd.DataFrame) -> str:
    """How eager's extra activations grow with length and how near they are to the probabilities' bytes; the step
    times at the longest length, called different only outside both spreads."""
    last = frame.iloc[-1]
    power = growth_exponent(frame)
    shape = "about quadratically" if 1.6 <= power <= 2.6 else "not quadratically"
    spreads = {i: (last[f"{i}_step_time_p10_s"], last[f"{i}_step_time_p90_s"]) for i in IMPLEMENTATIONS}
    order = separated(spreads["eager"], spreads["sdpa"])
    time = {None: "no timing spread measured", 0: "step times within the noise", 1: "eager slower",
            -1: "eager faster"}[order]
    ratio = last["eager_step_time_s"] / last["sdpa_step_time_s"]
    return (f"Eager attention's extra activations grow {shape} (as L^{number(power)} from L={frame.iloc[0]['seq_len']} "
            f"to {last['seq_len']}); at L={last['seq_len']} they are {mib(last['extra_bytes'], '.3g')}, "
            f"{number(last['extra_over_probabilities'])}x the {mib(last['probabilities_bytes'], '.3g')} of attention "
            f"probabilities computed; {time} ({number(ratio)}x SDPA's).")

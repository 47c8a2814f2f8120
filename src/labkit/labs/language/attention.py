"""Section 3 of notebook 10: eager attention keeps each layer's rows x heads x L x L probabilities for the backward
pass, SDPA's fused kernel none; both run at each length, their activations' peaks set beside the probabilities'."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ...choices import ATTN_IMPLEMENTATIONS
from ...display import number
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...models import LANGUAGE_MODELS
from ...results import cached_frame
from ...train import fit
from ...units import mib
from .throughput import lm_config

IMPLEMENTATIONS = ATTN_IMPLEMENTATIONS


def probabilities_bytes(rows: int, seq_len: int, model: str = "tiny_llama", dtype_bytes: int = 4) -> int:
    """Bytes of the probabilities eager attention saves: rows x heads x L^2 x ``dtype_bytes`` x layers."""
    spec = LANGUAGE_MODELS[model]
    return rows * spec.num_attention_heads * seq_len**2 * dtype_bytes * spec.num_hidden_layers


@dataclass
class AttentionMemory(LabResult):
    """One row per length: each implementation's activations and step time, eager's extra bytes, the
    probabilities' bytes."""

    shown = ("seq_len", "sdpa_activation_bytes", "eager_activation_bytes", "extra_bytes", "probabilities_bytes")

    def growth_exponent(self, column: str = "extra_bytes") -> float:
        """The power p in ``column`` ~ L^p from the shortest to the longest length (NaN unless both positive)."""
        first, last = self.frame.iloc[0], self.frame.iloc[-1]
        if first[column] <= 0 or last[column] <= 0:
            return math.nan
        return math.log(last[column] / first[column]) / math.log(last["seq_len"] / first["seq_len"])

    @worded
    def finding(self) -> str:
        (first, last), power = self.frame.iloc[[0, -1]].seq_len.astype(int), self.growth_exponent()
        last_row = self.frame.iloc[-1]
        shape = "about quadratically" if 1.6 <= power <= 2.6 else "not quadratically"
        time = compare(Measured.row(last_row, "eager_step_time_s"), Measured.row(last_row, "sdpa_step_time_s"),
                       words=("faster", "slower"))
        return (f"Eager attention's extra activations grow {shape} (as L^{number(power)} from L={first} to {last}); "
                f"at L={last} they are {mib(last_row['extra_bytes'], '.3g')}, "
                f"{number(last_row['extra_over_probabilities'])}x the {mib(last_row['probabilities_bytes'], '.3g')} "
                f"of attention probabilities computed; eager's step time {time} against SDPA's.")


def attention_memory(seq_lens=(32, 64, 128), batch_size: int = 2, progress: bool = False, refresh: bool = False,
                     **fields) -> AttentionMemory:
    """Each length (shortest first) run with SDPA then eager, ``batch_size`` rows padded to it (cached); ``fields``:
    other `lm_config` fields."""
    seq_lens = list(seq_lens)
    if not seq_lens or seq_lens != sorted(set(seq_lens)):
        raise ConfigError("seq_lens", seq_lens, "distinct row widths, shortest first, e.g. (32, 64, 128)")
    cfgs = {(seq_len, impl): lm_config(seq_len, batch_size, impl, **fields)
            for seq_len in seq_lens for impl in IMPLEMENTATIONS}
    model = fields.get("model", "tiny_llama")
    return AttentionMemory(cached_frame("lm-attention", cfgs.values(), lambda: _attention_frame(
        cfgs, seq_lens, batch_size, model, progress), refresh=refresh))


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

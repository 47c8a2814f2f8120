"""Section 9 of notebook 10: the speed ladder, one language-model config climbed rung by rung (precision, SDPA,
packing, the fused optimizer, compile, then checkpointing + chunked loss buying a larger batch), each rung measured
and compared with the one below it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ... import results, text
from ...config import RunConfig
from ...display import number
from ...env import resolve_device
from ...errors import ConfigError
from ...measure import separated
from ...messages import worded
from ...techniques.precision import resolve_precision
from ...units import mib

RUNGS = ("baseline", "+precision", "+SDPA", "+packing", "+fused AdamW", "+compile",
         "+checkpointing, chunked loss, 2x batch")


def ladder_configs(cfg: RunConfig, precision: str = "auto", loss_chunks: int = 4) -> dict[str, RunConfig]:
    """Each rung's config: the baseline (fp32, eager attention, every row padded to seq_len, AdamW's for-loop
    kernel), then each rung adds one change to the one below it.

    Args:
        cfg: a language-model run (its model, dataset, seq_len, batch size and steps are kept).
        precision: the precision rung's (``auto``: bf16 where native, fp16 on a T4, fp32 on a CPU without bf16),
            resolved here: where it is fp32 the rung is the baseline's run, and the finding says so.
        loss_chunks: the last rung's chunked cross-entropy (a divisor of the sequence length).
    """
    if cfg.dataset not in text.available():
        raise ConfigError("cfg.dataset", cfg.dataset, "a language-model dataset (the ladder climbs a language model)")
    base = cfg.replace(precision="fp32", attn_implementation="eager", packing="pad_max", optimizer_impl="forloop",
                       compile=False, checkpointing=False, loss_chunks=None)
    precision = resolve_precision(precision, resolve_device(cfg.device)).name
    steps = [{"precision": precision}, {"attn_implementation": "sdpa"}, {"packing": "pack"},
             {"optimizer_impl": "fused"}, {"compile": True},
             {"checkpointing": True, "loss_chunks": loss_chunks, "batch_size": 2 * cfg.batch_size}]
    configs, current = {"baseline": base}, base
    for name, change in zip(RUNGS[1:], steps, strict=True):
        current = current.replace(**change)
        configs[name] = current
    return configs


@dataclass
class Ladder:
    """The ladder's runs (rung -> `RunResult`) and one row per rung (`labkit.sweep`'s columns, ``rung`` first, and
    ``time_per_real_token_p10_s`` / ``_p90_s``: the step-time spread over the step's real tokens)."""

    results: dict = field(default_factory=dict)
    frame: pd.DataFrame | None = None

    @worded
    def finding(self) -> str:
        """Each rung's real tokens/s against the rung below it, called a change only outside both spreads, and the
        top rung's speed-up and peak memory against the baseline's."""
        frame = self.frame
        ok = frame[frame["error"].isna()] if "error" in frame else frame
        failed = [r for r in frame["rung"] if r not in set(ok["rung"])]
        parts = []
        rows = list(ok.itertuples(index=False))
        for below, row in zip(rows, rows[1:], strict=False):
            order = separated((row.time_per_real_token_p10_s, row.time_per_real_token_p90_s),
                              (below.time_per_real_token_p10_s, below.time_per_real_token_p90_s))
            speed = row.real_tokens_per_s / below.real_tokens_per_s
            # order -1: this rung's time per real token lies wholly below the rung below's
            verdict = {None: "no spread measured", 0: "within the noise", 1: "slower", -1: "faster"}[order]
            if getattr(row, "same_run_as_below", False):
                parts.append(f"{row.rung} the same run here ({row.precision_used})")
                continue
            parts.append(f"{row.rung} {number(speed)}x ({verdict})")
        text = "Real tokens/s, each rung against the one below: " + "; ".join(parts) + "."
        if rows:
            first, last = rows[0], rows[-1]
            text += (f" Top rung against the baseline: {number(last.real_tokens_per_s / first.real_tokens_per_s)}x "
                     f"the real tokens/s, peak memory {mib(last.peak_memory_bytes, '.3g')} against "
                     f"{mib(first.peak_memory_bytes, '.3g')}.")
        if failed:
            text += f" Failed: {', '.join(failed)}."
        return text


def speed_ladder(cfg: RunConfig, precision: str = "auto", loss_chunks: int = 4, refresh: bool = False,
                 progress: bool = True) -> Ladder:
    """Climb `ladder_configs` (cached runs; a failed rung is a row with its ``error``).

    Example:
        >>> ladder = speed_ladder(RunConfig(model="tiny_llama", dataset="pydoc_text", batch_size=8))
        >>> ladder.frame[["rung", "real_tokens_per_s", "peak_memory_bytes"]]
    """
    configs = ladder_configs(cfg, precision, loss_chunks)
    runs = results.run_configs(list(configs.values()), refresh=refresh, progress=progress)
    frame = results.to_frame(runs)
    frame.insert(0, "rung", list(configs))
    rungs = list(configs.values())
    frame["same_run_as_below"] = [False] + [a == b for a, b in zip(rungs, rungs[1:], strict=False)]
    real_per_step = frame["real_tokens_per_s"] * frame["step_time_s"]  # the median step's real tokens
    frame["time_per_real_token_p10_s"] = frame["step_time_p10_s"] / real_per_step
    frame["time_per_real_token_p90_s"] = frame["step_time_p90_s"] / real_per_step
    return Ladder(results=dict(zip(configs, runs, strict=True)), frame=frame)

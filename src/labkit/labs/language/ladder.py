"""Section 9 of notebook 10: the speed ladder, one language-model config climbed rung by rung, each rung compared
with the one below it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import results, text
from ...config import RunConfig
from ...display import number
from ...env import resolve_device
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques.precision import resolve_precision
from ...units import mib
from ...workloads import lm_speed_config

RUNGS = ("baseline", "+precision", "+SDPA", "+packing", "+fused AdamW", "+compile",
         "+checkpointing, chunked loss, 2x batch")
NOTEBOOK_SHAPE = {"batch_size": 8, "seq_len": 64}  # the notebook's ladder (section 9) and compile runs (section 7)


def ladder_configs(cfg: RunConfig, precision: str = "auto", loss_chunks: int = 4) -> dict[str, RunConfig]:
    """Each rung's config: the baseline (fp32, eager attention, rows padded to seq_len, AdamW's for-loop), then
    one change per rung; ``precision`` is resolved here (fp32: the rung is the baseline's run, and says so)."""
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
class Ladder(LabResult):
    """One row per rung (`labkit.sweep`'s columns, ``rung`` first, and the time per real token's p10-p90) and the
    runs behind them (``results``: rung -> `RunResult`)."""

    shown = ("rung", "real_tokens_per_s", "pad_fraction", "peak_memory_bytes", "compile_time_s")
    results: dict = field(default_factory=dict)

    @worded
    def finding(self) -> str:
        frame = self.frame
        ok = frame[frame["error"].isna()] if "error" in frame else frame
        failed = [r for r in frame["rung"] if r not in set(ok["rung"])]
        rows, parts = [row for _, row in ok.iterrows()], []
        for below, row in zip(rows, rows[1:], strict=False):
            if row.get("same_run_as_below", False):
                parts.append(f"{row['rung']} the same run here ({row['precision_used']})")
                continue
            time = compare(*(Measured.row(r, "time_per_real_token_s") for r in (row, below)),
                           words=("faster", "slower"))
            parts.append(f"{row['rung']} {number(row['real_tokens_per_s'] / below['real_tokens_per_s'])}x "
                         f"({time.verdict})")
        text = "Real tokens/s, each rung against the one below: " + "; ".join(parts) + "."
        if rows:
            first, last = rows[0], rows[-1]
            peaks = (mib(last["peak_memory_bytes"], ".3g"), mib(first["peak_memory_bytes"], ".3g"))
            text += (f" Top rung against the baseline: "
                     f"{number(last['real_tokens_per_s'] / first['real_tokens_per_s'])}x the real tokens/s, peak "
                     f"memory {peaks[0]} against {peaks[1]}.")
        if failed:
            text += f" Failed: {', '.join(failed)}."
        return text


def speed_ladder(cfg: RunConfig | None = None, precision: str = "auto", loss_chunks: int = 4, refresh: bool = False,
                 progress: bool = True) -> Ladder:
    """Climb `ladder_configs` of ``cfg`` (default: the notebook's, `lm_speed_config` at `NOTEBOOK_SHAPE`; cached
    runs, a failed rung a row with its ``error``)."""
    configs = ladder_configs(cfg or lm_speed_config(**NOTEBOOK_SHAPE), precision, loss_chunks)
    runs = results.run_configs(list(configs.values()), refresh=refresh, progress=progress)
    frame = results.to_frame(runs)
    frame.insert(0, "rung", list(configs))
    rungs = list(configs.values())
    frame["same_run_as_below"] = [False] + [a == b for a, b in zip(rungs, rungs[1:], strict=False)]
    real_per_step = frame["real_tokens_per_s"] * frame["step_time_s"]  # the median step's real tokens
    frame["time_per_real_token_s"] = 1 / frame["real_tokens_per_s"]
    frame["time_per_real_token_p10_s"] = frame["step_time_p10_s"] / real_per_step
    frame["time_per_real_token_p90_s"] = frame["step_time_p90_s"] / real_per_step
    return Ladder(frame, results=dict(zip(configs, runs, strict=True)))

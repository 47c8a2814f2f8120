"""The ladder on a learner's own model and data: the lab's techniques added one rung at a time, each rung measured
here (a few cached steps of `labkit.fit`) and compared with the rung below by its time per real token and its peak
memory, a change counted only outside the measured noise (`labkit.measure.compare`), beside the published figure for
that technique where one exists (torchtune's measured ladder, TRL's and Liger's docs).

Rungs, each kept once taken: precision as ``auto`` picks it here, SDPA attention, packing (only when the audit found
no leak across packed documents on this model), fused AdamW, per-layer checkpointing, 8-bit AdamW, chunked loss,
compile; then LoRA and QLoRA on the last full rung.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..config import RunConfig
from ..env import resolve_device
from ..errors import ConfigError
from ..labresult import LabResult
from ..measure import Measured, compare
from ..messages import worded
from ..techniques.precision import resolve_precision
from ..units import mib
from .measure import method_config, run_method
from .plan import loss_chunks_for

# Published rows for a rung, quoted with where they come from (../shared/REFERENCES.md): never measured here.
PUBLISHED = {
    "+packing": "torchtune, Llama 3.2 3B, A100: +238 % tokens/s",
    "+compile": "torchtune: 7,075 -> 8,998 tokens/s (+27 %); PyTorch 2.0: 43 % faster on an A100",
    "+per-layer checkpointing": "torchtune: -42 % memory, -21 % tokens/s",
    "+8-bit AdamW": "Dettmers et al. 2022: 75 % less optimizer memory",
    "+chunked loss": "TRL docs: about 30 % less peak memory, time about neutral",
    "LoRA": "torchtune: 25.5 -> 8.5 GiB; PEFT records: 37.2 -> 22.3 GB, 2.9x tokens/s",
    "QLoRA": "torchtune: 4.6 GiB (LoRA 8.5)",
}


RUNGS = ("+precision", "+SDPA", "+packing", "+fused AdamW", "+per-layer checkpointing", "+8-bit AdamW",
         "+chunked loss", "+compile", "LoRA", "QLoRA")


def ladder_configs(base: RunConfig, packing_ok: bool, rungs=None) -> dict[str, tuple[RunConfig, str]]:
    """Each rung's config and method, from ``base`` (the learner's run) made plain: fp32, eager attention, rows
    padded, AdamW's for-loop kernel, nothing saved; ``packing_ok``: the audit found no packing leak; ``rungs``: of
    `RUNGS` (None: all)."""
    wanted = set(RUNGS if rungs is None else rungs)
    if not wanted <= set(RUNGS):
        raise ConfigError("rungs", sorted(wanted - set(RUNGS)), f"names from {list(RUNGS)}")
    plain = base.replace(precision="fp32", attn_implementation="eager", packing="pad", optimizer="adamw",
                         optimizer_impl="forloop", checkpointing=False, loss_chunks=None, compile=False,
                         lora_rank=None)
    precision = resolve_precision("auto", resolve_device(base.device)).name
    steps = [("+precision", {"precision": precision}), ("+SDPA", {"attn_implementation": "sdpa"})]
    steps += [("+packing", {"packing": "pack"})] if packing_ok else []
    steps += [("+fused AdamW", {"optimizer_impl": "fused"}), ("+per-layer checkpointing", {"checkpointing": True}),
              ("+8-bit AdamW", {"optimizer": "adamw8bit", "optimizer_impl": None}),
              ("+chunked loss", {"loss_chunks": loss_chunks_for(base.seq_len)}),
              ("+compile", {"compile": True})]
    configs, current = {"baseline": (plain, "full")}, plain
    for name, change in steps:
        if name in wanted:
            current = current.replace(**change)
            configs[name] = (current, "full")
    lora = current.replace(optimizer="adamw", optimizer_impl=None)
    for name in ("LoRA", "QLoRA"):
        if name in wanted:
            configs[name] = (method_config(lora, name.lower()), name.lower())
    return configs


@dataclass
class FinetuneLadder(LabResult):
    """One row per rung: its real tokens/s, peak memory, the change against the rung below (time per real token,
    ``verdict``) and the published figure for that technique (``published``)."""

    shown = ("rung", "real_tokens_per_s", "peak_memory_bytes", "time_change", "memory_change", "published")

    @worded
    def finding(self) -> str:
        ok = self.frame[self.frame["error"].isna()]
        kept = [r.rung for r in ok.itertuples() if r.real is True]
        failed = self.frame.loc[self.frame["error"].notna(), "rung"].tolist()
        first, last = ok.iloc[0], ok[ok["method"] == "full"].iloc[-1]
        text = (f"Faster outside the noise: {', '.join(kept) or 'no rung'}. The last full rung against the baseline: "
                f"{last['real_tokens_per_s'] / first['real_tokens_per_s']:.3g}x the real tokens/s, peak "
                f"{mib(last['peak_memory_bytes'], '.3g')} against {mib(first['peak_memory_bytes'], '.3g')}.")
        return text + (f" Did not run here: {', '.join(failed)}." if failed else "")


def climb(base: RunConfig, packing_ok: bool, rungs=None, refresh: bool = False,
          progress: bool = False) -> FinetuneLadder:
    """Measure the rungs of `ladder_configs` (all, or those named in ``rungs``, the baseline always first; cached;
    a rung that fails is a row with its ``error``). A rung left out is not taken: the next one is measured against
    the last one measured, with its own change added."""
    configs = ladder_configs(base, packing_ok, rungs)
    rows, below = [], None
    for rung, (cfg, method) in configs.items():
        result = run_method(cfg, method, refresh, progress)
        row = {"rung": rung, "method": method, "error": result.error, "published": PUBLISHED.get(rung, ""),
               **{k: getattr(result, k) for k in ("real_tokens_per_s", "peak_memory_bytes", "step_time_s",
                                                  "step_time_p10_s", "step_time_p90_s", "precision_used")}}
        if result.ok:  # time per real token: the step times over the median step's real tokens
            real = row["real_tokens_per_s"] * row["step_time_s"]
            row.update({f"time_per_real_token{k[9:]}": row[k] / real for k in
                        ("step_time_s", "step_time_p10_s", "step_time_p90_s")})
        if result.ok and below is not None:
            change = compare(Measured.row(row, "time_per_real_token_s"), Measured.row(below, "time_per_real_token_s"),
                             ("faster", "slower"))
            row.update(time_change=str(change), real=change.real and change.direction < 0,
                       memory_change=row["peak_memory_bytes"] / below["peak_memory_bytes"])
        if result.ok:
            below = row
        rows.append(row)
    return FinetuneLadder(pd.DataFrame(rows))

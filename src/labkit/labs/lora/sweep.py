"""Sections 4 and 8 of notebook 08: rank and targets against full fine-tuning and head-only; the panel's run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from ... import results
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import VERDICTS, Comparison, Measured, compare
from ...messages import worded, wrap
from ...units import mib
from ...validate import is_int
from .base import ALPHA, LORA_LR, MERGE_RANK, RANKS, TARGETS, lora_config, targets_label


def sweep_configs(cfg: RunConfig, ranks=None, targets=tuple(TARGETS)) -> dict[str, RunConfig]:
    """The sweep's runs by label: full, head-only, LoRA at each rank (`RANKS`; or ``{targets: ranks}``) on each."""
    ranks = RANKS[profile().name] if ranks is None else ranks
    runs = {"full fine-tune": cfg, "head only": cfg.replace(freeze="head_only", lr=LORA_LR)}
    for label in targets:
        chosen = tuple(ranks[label] if isinstance(ranks, dict) else ranks)
        if not chosen or not all(is_int(r) and r >= 1 for r in chosen):
            raise ConfigError("ranks", list(chosen), "positive integers (LoRA ranks), e.g. [1, 4, 16, 64]")
        runs.update({f"LoRA {label} r{rank}": lora_config(cfg, rank, label) for rank in chosen})
    return runs


@dataclass
class RankSweep(LabResult):
    """Full fine-tuning, head-only and LoRA per rank and target set, one row a run (exact match on ``test_size``)."""

    shown = ("setup", "num_trainable_params", "mem_optimizer_state_bytes", "mem_activations_bytes", "step_time_s",
             "tokens_per_s", "exact_match")
    test_size: int | None = None

    def row(self, setup: str) -> pd.Series:
        return self.frame.set_index("setup").loc[setup]

    def step_against_full(self, setup: str) -> Comparison:
        """``setup``'s step time against full fine-tuning's, each with its p10-p90 spread."""
        return compare(Measured.row(self.row(setup), "step_time_s"),
                       Measured.row(self.row("full fine-tune"), "step_time_s"), words=("faster", "slower"))

    @worded
    def finding(self) -> str:
        ok = self.frame[self.frame.error.isna()]
        full, head = ok.set_index("setup").loc["full fine-tune"], ok.set_index("setup").loc["head only"]
        lora = ok[ok.method == "LoRA"]
        best = lora.loc[lora.accuracy.idxmax()]
        size = self.test_size or profile().test_size
        noise = Measured.accuracy(full.accuracy, size)
        score = compare(Measured.accuracy(best.accuracy, size), noise, words=("below", "above"))
        steps = []
        for targets, rows in lora.groupby("targets", sort=False):
            against = [self.step_against_full(setup) for setup in rows.setup]
            verdicts = {c.verdict for c in against}  # one for all ranks, mixed, or none real: within the noise
            verdict = (verdicts.pop() if len(verdicts) == 1 else "mixed" if any(against) else
                       VERDICTS[None] if any(c.real is None for c in against) else VERDICTS[0])
            step, act = rows.step_time_s / full.step_time_s, rows.mem_activations_bytes / full.mem_activations_bytes
            steps.append(f"on {targets} {_span(step)} ({verdict}), "
                         f"activations {_span(act)}")
        return (f"Best LoRA run ({best.setup.removeprefix('LoRA ')}) {best.accuracy:.1%} exact match against full "
                f"fine-tuning's {full.accuracy:.1%}: {score.verdict} (±{noise.high - noise.low:.1%}); head only "
                f"{head.accuracy:.1%}; LoRA's step against full's: {'; '.join(steps)}.")

    def chart_frame(self) -> pd.DataFrame:
        """The LoRA rows, plus full fine-tuning and head-only repeated at every LoRA rank (flat lines to compare)."""
        frame = self.frame
        lora = frame[frame.method == "LoRA"]
        ranks = sorted(lora["rank"].unique())
        flat = [frame[frame.method == method].iloc[[0] * len(ranks)].assign(rank=ranks, targets=method)
                for method in ("full fine-tune", "head only") if (frame.method == method).any()]
        return pd.concat([lora, *flat], ignore_index=True)

    def own_count_numbers(self, targets: str = "q_proj,v_proj") -> dict:
        """Exercise ``08.own_count``'s numbers: the two ranks furthest apart on ``targets``."""
        rows = self.frame[(self.frame.targets == targets) & self.frame.error.isna()].sort_values("rank")
        if len(rows) < 2:
            raise ConfigError("frame", f"{len(rows)} LoRA rows on {targets}", "a sweep with at least two ranks")
        low, high = rows.iloc[0], rows.iloc[-1]
        return {"rank_low": int(low["rank"]), "trainable_low": int(low.num_trainable_params),
                "rank_high": int(high["rank"]), "trainable_high": int(high.num_trainable_params),
                "rank_new": int(high["rank"]) * 2}


def _span(ratios: pd.Series) -> str:
    low, high = f"{ratios.min():.2f}", f"{ratios.max():.2f}"
    return f"{low}x" if low == high else f"{low}-{high}x"


def rank_sweep(cfg: RunConfig, ranks=None, targets=tuple(TARGETS), refresh: bool = False,
               progress: bool = True) -> RankSweep:
    """Fine-tune ``cfg`` in full, head-only, and with LoRA at each rank on each target set (cached runs)."""
    runs = sweep_configs(cfg, ranks, targets)
    keep = lora_config(cfg, MERGE_RANK, "q_proj,v_proj")  # kept with its weights: merge_comparison starts from it
    others = [c for c in runs.values() if c != keep]
    done = dict(zip(others, results.run_configs(others, refresh=refresh, progress=progress), strict=True))
    if keep in runs.values():
        done[keep] = results.cached_model(keep, refresh=refresh, progress=progress)[1]
    frame = results.to_frame([done[c] for c in runs.values()])
    frame.insert(0, "setup", list(runs))
    frame["method"] = ["LoRA" if label.startswith("LoRA") else label for label in runs]
    frame["targets"] = [targets_label(c.lora_targets) if c.lora_rank else "-" for c in runs.values()]
    frame["rank"] = [c.lora_rank or 0 for c in runs.values()]
    frame["trainable_share"] = frame.num_trainable_params / frame.num_params
    frame["exact_match"] = frame.accuracy
    return RankSweep(frame, test_size=profile().test_size)


@dataclass
class LoRARun:
    """One panel run: a LoRA fine-tune's headline numbers."""

    lora_rank: int
    lora_alpha: float
    targets: str
    num_trainable_params: int
    trainable_share: float
    peak_memory_bytes: int | None
    mem_optimizer_state_bytes: int | None
    step_time_s: float
    tokens_per_s: float | None
    exact_match: float | None
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return wrap(f"LoRA rank {self.lora_rank} on {self.targets}, alpha {self.lora_alpha:g}: "
                    f"{self.num_trainable_params:,} trainable ({self.trainable_share:.2%}), peak "
                    f"{mib(self.peak_memory_bytes)}, {self.step_time_s * 1e3:.0f} ms a step, exact match "
                    f"{self.exact_match:.1%}")


def panel_config(cfg: RunConfig) -> RunConfig:
    """The panel's starting point: LoRA rank 8 on q and v (a dropdown's value), alpha 16, at LoRA's learning rate."""
    return cfg.replace(lora_rank=8, lora_targets="q_proj,v_proj", lora_alpha=ALPHA, lr=LORA_LR)


def panel_run(cfg: RunConfig, on_step=None, progress: bool = False) -> LoRARun:
    """The panel's run: ``cfg``'s LoRA fine-tune through the cache (a `TARGETS` key runs as its layers)."""
    if cfg.lora_rank is None:
        raise ConfigError("lora_rank", cfg.lora_rank, "a positive integer (the panel trains LoRA adapters)")
    if isinstance(cfg.lora_targets, str):
        cfg = cfg.replace(lora_targets=TARGETS.get(cfg.lora_targets, (cfg.lora_targets,)))
    result = results.cached_fit(cfg, progress=progress, on_step=on_step)
    return LoRARun(lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, targets=targets_label(cfg.lora_targets),
                   num_trainable_params=result.num_trainable_params,
                   trainable_share=result.num_trainable_params / result.num_params,
                   peak_memory_bytes=result.peak_memory_bytes,
                   mem_optimizer_state_bytes=result.memory.get("optimizer_state"), step_time_s=result.step_time_s,
                   tokens_per_s=result.tokens_per_s, exact_match=result.accuracy, warnings=list(result.warnings))

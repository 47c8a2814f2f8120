"""Section 4 of notebook 08: rank and targets against full fine-tuning and head-only, the same steps and data.

`rank_sweep` runs (and caches) full fine-tuning, head-only (every weight frozen but the final norm and the output
layer) and LoRA at each rank on the query and value projections and on every Linear layer; `sweep_finding` says
which of the outcomes the notebook explains happened here. The score is exact match on ``digits_sort``.
"""

from __future__ import annotations

import pandas as pd

from ... import results
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...measure import accuracy_noise, separated
from ...messages import worded
from ...validate import is_int
from .base import LORA_LR, MERGE_RANK, RANKS, TARGETS, lora_config, targets_label


def _ranks_by_targets(ranks, targets) -> dict[str, tuple]:
    ranks = RANKS[profile().name] if ranks is None else ranks
    by_targets = {t: tuple(ranks[t] if isinstance(ranks, dict) else ranks) for t in targets}
    for chosen in by_targets.values():
        if not chosen or not all(is_int(r) and r >= 1 for r in chosen):
            raise ConfigError("ranks", list(chosen), "positive integers (LoRA ranks), e.g. [1, 4, 16, 64]")
    return by_targets


def sweep_configs(cfg: RunConfig, ranks=None, targets=tuple(TARGETS)) -> dict[str, RunConfig]:
    """The sweep's runs by label: full fine-tuning, head-only, and LoRA at each rank on each target set.

    Args:
        cfg: the full fine-tune. ranks: LoRA ranks, or ``{targets: ranks}`` (default: `RANKS` of the profile).
        targets: keys of `TARGETS`.
    """
    runs = {"full fine-tune": cfg, "head only": cfg.replace(freeze="head_only", lr=LORA_LR)}
    for label, chosen in _ranks_by_targets(ranks, targets).items():
        for rank in chosen:
            runs[f"LoRA {label} r{rank}"] = lora_config(cfg, rank, label)
    return runs


def rank_sweep(cfg: RunConfig, ranks=None, targets=tuple(TARGETS), refresh: bool = False,
               progress: bool = True) -> pd.DataFrame:
    """Fine-tune ``cfg`` in full, head-only, and with LoRA at each rank on each target set (cached).

    Args:
        cfg: the full fine-tune. ranks, targets: as `sweep_configs`. refresh: run again. progress: show bars.

    Returns:
        DataFrame: setup, method (full fine-tune / head only / LoRA), targets, rank, trainable_share, exact_match
        (the runs' accuracy) and the runs' columns (num_trainable_params, mem_*_bytes, peak_memory_bytes,
        step_time_s and its p10/p90, tokens_per_s, ...).
    """
    runs = sweep_configs(cfg, ranks, targets)
    # kept with its weights too: merge_comparison starts from this fine-tune
    keep = lora_config(cfg, MERGE_RANK, "q_proj,v_proj")
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
    return frame


def sweep_chart_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The sweep's LoRA rows, plus full fine-tuning and head-only drawn flat across the LoRA ranks.

    Args:
        frame: `rank_sweep`'s. Each of full and head-only is one run, repeated at every rank so that it shows as
            a line to compare with; ``targets`` names each line.
    """
    lora = frame[frame.method == "LoRA"]
    ranks = sorted(lora["rank"].unique())
    flat = [frame[frame.method == method].iloc[[0] * len(ranks)].assign(rank=ranks, targets=method)
            for method in ("full fine-tune", "head only") if (frame.method == method).any()]
    return pd.concat([lora, *flat], ignore_index=True)


def _row(frame: pd.DataFrame, setup: str) -> pd.Series:
    return frame.set_index("setup").loc[setup]


def _time_verdict(rows: pd.DataFrame, full: pd.Series) -> str:
    """Faster or slower than full fine-tuning only outside both runs' p10-p90 step-time spread."""
    base = (full.step_time_p10_s, full.step_time_p90_s)
    orders = [separated((row.step_time_p10_s, row.step_time_p90_s), base) for row in rows.itertuples()]
    if all(order == -1 for order in orders):
        return "faster"
    if all(order == 1 for order in orders):
        return "slower"
    if not any(orders):  # every one within the spread, or no spread measured
        return "no real difference"
    return "mixed"


@worded
def sweep_finding(frame: pd.DataFrame, test_size: int | None = None) -> str:
    """One line: LoRA's exact match against full fine-tuning's noise, its step time against the runs' spread.

    Args:
        frame: `rank_sweep`'s. test_size: the test split's size (default: the profile's).
    """
    ok = frame[frame.error.isna()]
    full, head = _row(ok, "full fine-tune"), _row(ok, "head only")
    lora = ok[ok.method == "LoRA"]
    noise = accuracy_noise(float(full.accuracy), test_size or profile().test_size)
    best = lora.loc[lora.accuracy.idxmax()]
    gap = float(best.accuracy - full.accuracy)
    accuracy = "within the noise of" if abs(gap) <= noise else "above" if gap > 0 else "below"
    step = lora.step_time_s / full.step_time_s
    act = lora.mem_activations_bytes / full.mem_activations_bytes
    by_targets = "; ".join(
        f"on {t} {_span(step[lora.targets == t])} ({_time_verdict(lora[lora.targets == t], full)}), activations "
        f"{_span(act[lora.targets == t])}" for t in dict.fromkeys(lora.targets))
    return (f"Best LoRA run ({best.setup.removeprefix('LoRA ')}) {best.accuracy:.1%} exact match, {accuracy} full "
            f"fine-tuning's {full.accuracy:.1%} (noise ±{noise:.1%}), head only {head.accuracy:.1%}; LoRA's step "
            f"against full's: {by_targets}.")


def _span(ratios: pd.Series) -> str:
    low, high = f"{ratios.min():.2f}", f"{ratios.max():.2f}"
    return f"{low}x" if low == high else f"{low}-{high}x"


def own_count_numbers(frame: pd.DataFrame, targets: str = "q_proj,v_proj") -> dict:
    """Exercise ``08.own_count``'s numbers from the learner's sweep.

    Args:
        frame: `rank_sweep`'s. targets: the target set whose two ranks furthest apart the exercise reads.
    """
    rows = frame[(frame.targets == targets) & frame.error.isna()].sort_values("rank")
    if len(rows) < 2:
        raise ConfigError("frame", f"{len(rows)} LoRA rows on {targets}", "a sweep with at least two ranks")
    low, high = rows.iloc[0], rows.iloc[-1]
    return {"rank_low": int(low["rank"]), "trainable_low": int(low.num_trainable_params),
            "rank_high": int(high["rank"]), "trainable_high": int(high.num_trainable_params),
            "rank_new": int(high["rank"]) * 2}

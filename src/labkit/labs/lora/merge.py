"""Section 7 of notebook 08: merged against unmerged inference, outputs and CPU latency.

`merge_comparison` times one forward pass over a batch of test prompts (the profile's ``latency_batch`` rows) for
the plain base model, the fine-tuned LoRA model unmerged and merged (`merge_and_unload`), and the base again, in
turns: the base's two timings are this machine's noise.
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch

from ... import results
from ...config import RunConfig
from ...env import profile
from ...inference import LogitsOnly, latencies, prompt_ids
from ...messages import worded
from ...techniques.lora import lora_layers, merge_and_unload
from .base import MERGE_RANK, fresh_model, lora_config

SETUPS = ("base model (no adapters)", "LoRA, unmerged", "LoRA, merged", "base model, timed again")


def merge_comparison(cfg: RunConfig, rank: int = MERGE_RANK, targets="q_proj,v_proj",
                     refresh: bool = False) -> pd.DataFrame:
    """CPU latency of a forward pass over ``latency_batch`` prompts, and the largest output difference, of `SETUPS`.

    Args:
        cfg: the workload. rank, targets: the fine-tuned LoRA model's (`lora_config`, trained by `rank_sweep`).
        refresh: measure again.

    Returns:
        DataFrame: setup, latency_s, vs_base (latency over the base's), max_output_diff (against the unmerged
        model), lora_layers.
    """
    lora_cfg = lora_config(cfg, rank, targets)
    return results.cached_frame("lora-merge", [lora_cfg], lambda: _measure_merge(cfg, lora_cfg), refresh=refresh)


def _measure_merge(cfg: RunConfig, lora_cfg: RunConfig) -> pd.DataFrame:
    trained, _ = results.cached_model(lora_cfg, progress=False)
    unmerged = LogitsOnly(copy.deepcopy(trained).cpu()).eval()
    merged = merge_and_unload(copy.deepcopy(unmerged))
    base = LogitsOnly(fresh_model(cfg, pretrained=True)).eval()
    x = prompt_ids(cfg, profile().latency_batch)
    # the base twice, first and last: how far two timings of one model differ here (the machine's noise)
    times = latencies([base, unmerged, merged, copy.deepcopy(base)], x)
    with torch.no_grad():
        reference = unmerged(x)
        diffs = [math.nan, 0.0, float((merged(x) - reference).abs().max()), math.nan]
    return pd.DataFrame({"setup": list(SETUPS),
                         "latency_s": times, "vs_base": [t / times[0] for t in times], "max_output_diff": diffs,
                         "lora_layers": [0, len(lora_layers(unmerged)), len(lora_layers(merged)), 0]})


@worded
def merge_finding(frame: pd.DataFrame) -> str:
    """One line: unmerged and merged latency against the base's two timings and the noise between them.

    Args:
        frame: `merge_comparison`'s. A latency counts as different from the base's only outside the band of the
            base's two timings widened by their difference on both sides.
    """
    rows = frame.set_index("setup")
    unmerged, merged = rows.loc[SETUPS[1]], rows.loc[SETUPS[2]]
    first, again = rows.loc[SETUPS[0]].latency_s, rows.loc[SETUPS[3]].latency_s
    noise = abs(again - first) / first
    low, high = min(first, again) * (1 - noise), max(first, again) * (1 + noise)

    def verdict(latency: float) -> str:
        return "the same within that" if low <= latency <= high else "slower" if latency > high else "faster"

    return (f"The base timed twice differed by {noise:.1%}; unmerged LoRA {unmerged.vs_base:.2f}x the base's latency "
            f"({verdict(unmerged.latency_s)}), merged {merged.vs_base:.2f}x ({verdict(merged.latency_s)}); merged "
            f"outputs within {merged.max_output_diff:.1e} of the unmerged model's.")

"""Section 3 of notebook 09: a language model's recipe (`LM_RECIPE_PATH`), stacked stage by stage on the profile's
pretrained language model fine-tuned in full (`labkit.workloads.lm_finetune_config`): packing, mixed precision,
LoRA on every linear layer, 8-bit AdamW. The given order only: the vision recipe teaches the measured order."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ... import measure, train
from ...config import RunConfig
from ...messages import worded
from ...units import change, mib, ratio
from ...workloads import lm_finetune_config
from .stages import GIVEN, RECIPE_PATH, recipe_stages, stacked_configs, stage_rows

LM_RECIPE_PATH = RECIPE_PATH.parent / "lm_recipe.yaml"


def lm_stages(base: RunConfig | None = None, path: str | Path = LM_RECIPE_PATH,
              refresh: bool = False) -> pd.DataFrame:
    """The recipe's stages stacked in the file's order on ``base`` (default `lm_finetune_config()`), cached runs.

    Returns:
        `staged`'s given-order frame: ``order``, ``stage``, ``added``, the runs' columns (``tokens_per_s``,
        ``peak_memory_bytes``, ``accuracy``: exact match, ...), ``epoch_time_s`` with its p10/p90.
    """
    base = base or lm_finetune_config()
    return stage_rows(stacked_configs(base, recipe_stages(path, base)), GIVEN, refresh, progress=False)


@worded
def lm_recipe_finding(frame: pd.DataFrame) -> str:
    """One line: the whole recipe's tokens/s, peak and exact match against the baseline's, and each stage's peak."""
    base, last = frame.iloc[0], frame.iloc[-1]
    noise = measure.accuracy_noise(base.accuracy, len(train.run_splits(lm_finetune_config())["test"]))
    moved = "within" if abs(last.accuracy - base.accuracy) <= noise else "beyond"
    steps = ", ".join(f"{row.added.split(' (')[0]} {mib(row.peak_memory_bytes, '.3g')}"
                      for row in frame.iloc[1:].itertuples())
    return (f"On {base.model}, the whole recipe: {ratio(last.real_tokens_per_s, base.real_tokens_per_s):.2f}x the "
            f"real tokens/s, peak {mib(base.peak_memory_bytes, '.3g')} -> {mib(last.peak_memory_bytes, '.3g')} "
            f"({change(ratio(last.peak_memory_bytes, base.peak_memory_bytes))}), exact match {base.accuracy:.1%} -> "
            f"{last.accuracy:.1%} ({moved} the test noise, ±{noise:.1%}); the peak after each stage: {steps}.")

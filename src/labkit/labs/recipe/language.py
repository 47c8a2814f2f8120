"""Section 7 of notebook 09: a language model's recipe (`LM_RECIPE_PATH`: packing, mixed precision, LoRA on every
linear layer, 8-bit AdamW) stacked in the file's order on `labkit.workloads.lm_finetune_config`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...config import RunConfig
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...runsetup import run_splits
from ...units import change, mib, ratio
from ...workloads import lm_finetune_config
from .stages import GIVEN, RECIPE_PATH, recipe_stages, stacked_configs, stage_rows

LM_RECIPE_PATH = RECIPE_PATH.parent / "lm_recipe.yaml"


@dataclass
class LmRecipe(LabResult):
    """The stacked stages' runs (`stage_rows`), the baseline first; ``test_size`` the exact match's test examples."""

    shown = ("added", "real_tokens_per_s", "peak_memory_bytes", "accuracy", "precision_used")
    test_size: int

    @worded
    def finding(self) -> str:
        base, last = self.frame.iloc[0], self.frame.iloc[-1]
        accuracy = compare(Measured.accuracy(last.accuracy, self.test_size),
                           Measured.accuracy(base.accuracy, self.test_size))
        steps = ", ".join(f"{row.added.split(' (')[0]} {mib(row.peak_memory_bytes, '.3g')}"
                          for row in self.frame.iloc[1:].itertuples())
        return (f"On {base.model}, the whole recipe: {ratio(last.real_tokens_per_s, base.real_tokens_per_s):.2f}x "
                f"the real tokens/s, peak {mib(base.peak_memory_bytes, '.3g')} -> {mib(last.peak_memory_bytes, '.3g')}"
                f" ({change(ratio(last.peak_memory_bytes, base.peak_memory_bytes))}), exact match "
                f"{base.accuracy:.1%} -> {last.accuracy:.1%} ({accuracy.verdict}); the peak after each stage: {steps}.")


def lm_stages(base: RunConfig | None = None, path: str | Path = LM_RECIPE_PATH, refresh: bool = False) -> LmRecipe:
    """The recipe's stages stacked in the file's order on ``base`` (default `lm_finetune_config()`), cached runs."""
    base = base or lm_finetune_config()
    frame = stage_rows(stacked_configs(base, recipe_stages(path, base)), GIVEN, refresh, progress=False)
    return LmRecipe(frame, test_size=len(run_splits(base)["test"]))

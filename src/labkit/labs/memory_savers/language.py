"""Section 5 of notebook 03: the memory savers on a language model, and what the models learners fine-tune need.

`lm_staged` runs the staged view (`staged_runs`) on `labkit.workloads.lm_speed_config`, the profile's Llama on
packed pydoc_text, where checkpointing wraps each decoder layer (transformers' method); `hub_scale_table` gives the
bytes per parameter of full fine-tuning for the hub models labkit names and a 7B model (`training_memory`).
"""

from __future__ import annotations

import pandas as pd

from ...capacity.lm_fits import SIZES
from ...capacity.lm_memory import decoder_shape
from ...messages import worded
from ...units import change, mib, ratio
from ...workloads import lm_speed_config
from .accounting import scale_table
from .staged import StagedRuns, staged_runs

# Full fine-tuning's setups for the language-model sizes: the plain one and the leanest that keeps fp32 masters
LM_SETUPS = {"fp32 + AdamW": {"precision": "fp32", "optimizer": "adamw"},
             "mixed (fp16 + master) + 8-bit AdamW": {"precision": "fp16", "optimizer": "adamw8bit"}}


def lm_staged(refresh: bool = False, **fields) -> StagedRuns:
    """`staged_runs` on the profile's language model (cached runs).

    Args:
        refresh: train again. fields: `lm_speed_config` fields (e.g. ``batch_size=8``).
    """
    return staged_runs(lm_speed_config(**fields), refresh=refresh, progress=False)


@worded
def lm_finding(staged: StagedRuns) -> str:
    """One line: what per-layer checkpointing did to the activations and 8-bit AdamW to the optimizer state."""
    rows = staged.frame.set_index("stage")
    base, ckpt, eight = rows.loc["baseline"], rows.loc["+checkpointing"], rows.loc["+8-bit optimizer"]
    return (f"On {base['model']}: checkpointing each decoder layer kept {mib(ckpt['mem_activations_bytes'], '.3g')} of "
            f"activations against {mib(base['mem_activations_bytes'], '.3g')} "
            f"({change(ratio(ckpt['mem_activations_bytes'], base['mem_activations_bytes']))}); 8-bit AdamW's state "
            f"{mib(eight['mem_optimizer_state_bytes'], '.3g')} against {mib(base['mem_optimizer_state_bytes'], '.3g')} "
            f"({change(ratio(eight['mem_optimizer_state_bytes'], base['mem_optimizer_state_bytes']))}).")


def hub_scale_table() -> pd.DataFrame:
    """`scale_table` for SmolLM2-135M, Qwen2.5-0.5B and 1.5B and Mistral-7B (their configs' parameter counts)."""
    return scale_table({label: decoder_shape(model).num_parameters() for label, model in SIZES.items()}, LM_SETUPS)

"""Section 5 of notebook 03: the staged view on a language model, and the hub models' bytes per parameter."""

from __future__ import annotations

from ...capacity.lm_fits import SIZES
from ...capacity.lm_memory import decoder_shape
from ...messages import worded
from ...units import change, mib, ratio
from ...workloads import lm_speed_config
from .accounting import ScaleTable, scale_table
from .staged import StagedRuns, staged_runs

# Full fine-tuning's setups for the language-model sizes: the plain one and the leanest that keeps fp32 masters
LM_SETUPS = {"fp32 + AdamW": {"precision": "fp32", "optimizer": "adamw"},
             "mixed (fp16 + master) + 8-bit AdamW": {"precision": "fp16", "optimizer": "adamw8bit"}}


class LMStaged(StagedRuns):
    shown = ("stage", "mem_activations_bytes", "mem_optimizer_state_bytes", "peak_memory_bytes", "step_time_s",
             "tokens_per_s")

    @worded
    def finding(self) -> str:
        rows = self.frame.set_index("stage")
        base, ckpt, eight = rows.loc["baseline"], rows.loc["+checkpointing"], rows.loc["+8-bit optimizer"]

        def against(row, column):
            return (f"{mib(row[column], '.3g')} against {mib(base[column], '.3g')} "
                    f"({change(ratio(row[column], base[column]))})")

        return (f"On {base['model']}: checkpointing each decoder layer kept activations of "
                f"{against(ckpt, 'mem_activations_bytes')}; 8-bit AdamW's state "
                f"{against(eight, 'mem_optimizer_state_bytes')}.")


def lm_staged(refresh: bool = False, **fields) -> LMStaged:
    """`staged_runs` on `lm_speed_config(**fields)` (cached runs)."""
    staged = staged_runs(lm_speed_config(**fields), refresh=refresh, progress=False)
    return LMStaged(staged.frame, results=staged.results)


def hub_scale_table() -> ScaleTable:
    """`scale_table` for the hub models of `labkit.capacity.lm_fits.SIZES`."""
    return scale_table({label: decoder_shape(model).num_parameters() for label, model in SIZES.items()}, LM_SETUPS,
                       columns=["model", "num_params", "setup", "bytes_per_param", "total_gib"])

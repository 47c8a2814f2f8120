"""Section 4 of notebook 03: the memory savers stacked one by one."""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import results
from ...config import RunConfig
from ...env import env_report
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques.optimizers import EIGHT_BIT_OPTIMIZERS
from ...techniques.precision import low_precision_for
from ...units import change, mib, ratio

STAGES = ("baseline", "+AMP", "+checkpointing", "+8-bit optimizer", "all together")


@dataclass
class StagedRuns(LabResult):
    shown = ("stage", "peak_memory_bytes", "mem_activations_bytes", "mem_optimizer_state_bytes", "step_time_s")
    results: dict = field(default_factory=dict)

    @worded
    def finding(self) -> str:
        frame = self.frame
        failed = frame[frame["error"].apply(lambda e: isinstance(e, str))] if "error" in frame else frame.iloc[:0]
        note = f" Failed: {', '.join(failed['stage'])}." if len(failed) else ""
        ok = frame.drop(failed.index)
        if "baseline" not in set(ok["stage"]):
            return "The baseline failed: nothing to compare with." + note
        base = ok[ok["stage"] == "baseline"].iloc[0]
        peak = base["peak_memory_bytes"]
        singles = ok[ok["stage"].isin(STAGES[1:-1])].sort_values("peak_memory_bytes")
        ranking = ", ".join(f"{row['stage']} ({change(ratio(row['peak_memory_bytes'], peak))})"
                            for _, row in singles.iterrows())
        text = f"Single savers by peak saved against the baseline's {mib(peak, '.3g')}: {ranking or 'none ran'}."
        for _, row in ok[ok["stage"] == STAGES[-1]].iterrows():
            step = compare(Measured.row(row, "step_time_s"), Measured.row(base, "step_time_s"), ("faster", "slower"))
            text += (f" All together: {mib(row['peak_memory_bytes'], '.3g')} "
                     f"({change(ratio(row['peak_memory_bytes'], peak))}), a step {step} against the baseline's.")
        return text + note


def staged_runs(cfg: RunConfig, precision: str | None = None, checkpointing: bool | int = True,
                optimizer: str = "adamw8bit", refresh: bool = False, progress: bool = True) -> StagedRuns:
    """`STAGES`: fp32 AdamW, + ``precision`` (default: this machine's), + ``checkpointing``, + 8-bit ``optimizer``,
    all three (cached runs)."""
    if checkpointing is False:
        raise ConfigError("checkpointing", checkpointing, "True or a number of segments")
    if optimizer not in EIGHT_BIT_OPTIMIZERS:
        raise ConfigError("optimizer", optimizer, f"one of {list(EIGHT_BIT_OPTIMIZERS)}")
    precision = low_precision_for(env_report(cfg.device)) if precision is None else precision
    if precision not in ("fp16", "bf16"):
        raise ConfigError("precision", precision, "'fp16' or 'bf16', or None (this machine's)")
    base = cfg.replace(precision="fp32", optimizer="adamw", momentum=0.9, checkpointing=False)
    configs = dict(zip(STAGES, (base, base.replace(precision=precision), base.replace(checkpointing=checkpointing),
                                base.replace(optimizer=optimizer),
                                base.replace(precision=precision, checkpointing=checkpointing, optimizer=optimizer)),
                       strict=True))
    runs = results.run_configs(list(configs.values()), refresh=refresh, progress=progress)
    frame = results.to_frame(runs)
    frame.insert(0, "stage", list(configs))
    frame["state_bytes"] = [sum(r.memory.get(k, 0) or 0 for k in ("parameters", "gradients", "optimizer_state"))
                            if r.memory else None for r in runs]
    return StagedRuns(frame, results=dict(zip(configs, runs, strict=True)))

"""Section 4 of notebook 03: the memory savers stacked one by one (baseline, +AMP, +checkpointing, +8-bit
optimizer, all together), for one stacked memory chart with step time beside it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import results
from ...config import RunConfig
from ...display import number
from ...env import env_report
from ...errors import ConfigError
from ...messages import worded
from ...techniques.optimizers import EIGHT_BIT_OPTIMIZERS
from ...techniques.precision import low_precision_for
from ...units import change, mib, ratio
from ._shared import timing_noise

STAGES = ("baseline", "+AMP", "+checkpointing", "+8-bit optimizer", "all together")


@dataclass
class StagedRuns:
    """The staged view's runs: label -> `RunResult`, and one row per stage with a ``stage`` column.

    Example:
        >>> staged = staged_runs(cfg)
        >>> labkit.plots.memory_breakdown(staged.frame, label="stage")
        >>> labkit.plots.bar(staged.frame, x="stage", y="step_time_s")
    """

    results: dict = field(default_factory=dict)
    frame: object = None

    @worded
    def finding(self) -> str:
        """What all the savers together did against the baseline, and the single savers ranked by peak saved."""
        frame = self.frame
        failed = frame[frame["error"].apply(lambda e: isinstance(e, str))] if "error" in frame else frame.iloc[:0]
        note = f" Failed: {', '.join(failed['stage'])}." if len(failed) else ""
        ok = frame.drop(failed.index)
        base = ok[ok["stage"] == "baseline"]
        if base.empty:
            return "The baseline failed: nothing to compare with." + note
        base = base.iloc[0]
        peak = base["peak_memory_bytes"]
        singles = ok[ok["stage"].isin(STAGES[1:-1])].sort_values("peak_memory_bytes")
        ranking = ", ".join(f"{row['stage']} ({change(ratio(row['peak_memory_bytes'], peak))})"
                            for _, row in singles.iterrows())
        text = f"Single savers by peak saved against the baseline's {mib(peak, '.3g')}: {ranking or 'none ran'}."
        together = ok[ok["stage"] == STAGES[-1]]
        if len(together):
            row = together.iloc[0]
            text += (f" All together: {mib(row['peak_memory_bytes'], '.3g')} "
                     f"({change(ratio(row['peak_memory_bytes'], peak))}), a step "
                     f"{number(ratio(row['step_time_s'], base['step_time_s']))}x the baseline's "
                     f"({timing_noise(row, base)}).")
        return text + note


def staged_runs(cfg: RunConfig, precision: str | None = None, checkpointing: bool | int = True,
                optimizer: str = "adamw8bit", refresh: bool = False, progress: bool = True) -> StagedRuns:
    """Baseline (fp32, AdamW, no checkpointing), +AMP, +checkpointing, +8-bit optimizer, and all three together.

    Cached; a failed stage is a row with its ``error``. The frame: `labkit.sweep`'s columns, ``stage`` first, and
    ``state_bytes`` (parameters + gradients + optimizer state).

    Args:
        cfg: the run to start from (its precision, optimizer and checkpointing are replaced).
        precision: the AMP stage's (default `low_precision_for` this machine: bf16 where native, else fp16 on GPUs).
        checkpointing: the checkpointing stage's setting (True: every block its own segment).
        optimizer: the 8-bit stage's optimizer (``adamw8bit``; ``paged_adamw8bit`` on a CUDA GPU).
        refresh, progress: as in `labkit.results.run_configs`.

    Example:
        >>> labkit.plots.memory_breakdown(staged_runs(labkit.config.baseline()).frame, label="stage")
    """
    if checkpointing is False:
        raise ConfigError("checkpointing", checkpointing, "True or a number of segments (the stage turns it on)")
    if optimizer not in EIGHT_BIT_OPTIMIZERS:
        raise ConfigError("optimizer", optimizer, f"one of {list(EIGHT_BIT_OPTIMIZERS)} (the 8-bit stage's optimizer)")
    precision = low_precision_for(env_report(cfg.device)) if precision is None else precision
    if precision not in ("fp16", "bf16"):
        raise ConfigError("precision", precision, "'fp16' or 'bf16' (the AMP stage's precision) or None (chosen "
                                                  "for this machine)")
    base = cfg.replace(precision="fp32", optimizer="adamw", momentum=0.9, checkpointing=False)
    configs = {
        "baseline": base,
        "+AMP": base.replace(precision=precision),
        "+checkpointing": base.replace(checkpointing=checkpointing),
        "+8-bit optimizer": base.replace(optimizer=optimizer),
        "all together": base.replace(precision=precision, checkpointing=checkpointing, optimizer=optimizer),
    }
    runs = results.run_configs(list(configs.values()), refresh=refresh, progress=progress)
    labelled = dict(zip(configs, runs, strict=True))
    frame = results.to_frame(runs)
    frame.insert(0, "stage", list(configs))
    frame["state_bytes"] = [sum(r.memory.get(k, 0) or 0 for k in ("parameters", "gradients", "optimizer_state"))
                            if r.memory else None for r in runs]
    return StagedRuns(results=labelled, frame=frame)

"""Section 6 of notebook 09: what each technique of notebooks 01-08 bought on this machine, from the learner's
cached runs, each paired with the same run without it (pruning and quantization from their notebooks' tables)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from ... import config, results
from ...config import RunConfig
from ...env import Profile, env_report, profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...result import RunResult
from .stages import value_text


@dataclass(frozen=True)
class Technique:
    """How a technique shows in cached runs: ``on(cfg)`` picks its runs, ``twin(cfg)`` the changes that give the
    run without it, ``prefer`` orders several runs (lower first), ``ignore`` the fields allowed to differ."""

    notebook: str
    name: str
    on: object
    twin: object
    prefer: object = None
    ignore: tuple = ()


def _techniques(prof: Profile) -> list[Technique]:
    base_batch = prof.batch_size
    return [
        Technique("01", "mixed precision", lambda c: c.precision in ("fp16", "bf16"), lambda c: {"precision": "fp32"},
                  lambda c: ("bf16", "fp16").index(c.precision)),
        Technique("02", "larger batch", lambda c: c.batch_size > base_batch, lambda c: {"batch_size": base_batch},
                  lambda c: -c.batch_size),
        Technique("02", "gradient accumulation", lambda c: c.grad_accum > 1, lambda c: {"grad_accum": 1},
                  lambda c: -c.grad_accum),
        Technique("03", "gradient checkpointing", lambda c: c.checkpointing is True,
                  lambda c: {"checkpointing": False}),
        Technique("03", "8-bit optimizer", lambda c: c.optimizer == "adamw8bit", lambda c: {"optimizer": "adamw"}),
        Technique("05", "freezing", lambda c: c.freeze not in (None, "none"), lambda c: {"freeze": None},
                  lambda c: ("medium", "heavy", "light", "head_only").index(c.freeze)),
        Technique("08", "LoRA", lambda c: c.lora_rank is not None,
                  lambda c: {"lora_rank": None, **config.LORA_DEFAULTS},
                  lambda c: (c.lora_rank != 8, c.lora_targets != ("q_proj", "v_proj"), c.lora_rank),
                  ignore=("lr",)),
    ]


SUMMARY_COLUMNS = ("notebook", "technique", "setting", "time_ratio", "time_basis", "time_beyond_spread",
                   "memory_ratio", "size_ratio", "accuracy_change", "pairs")


def cached_runs() -> list[RunResult]:
    """Every finished run in the learner's result cache on this machine (training runs and data-parallel jobs)."""
    here = env_report()
    found = []
    for path in sorted(results.results_dir().glob("*.json")):
        try:
            payload = json.loads(path.read_text())
            if not isinstance(payload, dict) or "config" not in payload or "step_time_s" not in payload:
                continue  # a measured table or record, not a run
            run = RunResult.from_dict(payload)
            run.cfg  # noqa: B018 - an old config that no longer validates is skipped
        except (ValueError, TypeError, ConfigError):
            continue
        if run.ok and run.env.get("device") == here.get("device") and run.env.get("gpu") == here.get("gpu"):
            found.append(run)
    return found


def _key(cfg: RunConfig, ignore: tuple) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in cfg.to_dict().items() if k not in ignore))


def _per_sample(r: RunResult) -> Measured:
    scale = 1 / r.throughput / r.step_time_s  # a step's time -> a sample's
    return Measured(r.step_time_s * scale, r.step_time_p10_s * scale, r.step_time_p90_s * scale)


def _beyond_spread(run: RunResult, twin: RunResult) -> bool | None:
    """Whether the two runs' times per sample differ beyond their step-time spreads (None: unknown)."""
    if not all(r.throughput and r.step_time_s for r in (run, twin)):
        return None
    return compare(_per_sample(run), _per_sample(twin)).real


def _trained(run: RunResult, twin: RunResult, setting: str, pairs: int) -> dict:
    """A training run against its twin: time per sample, peak memory, saved size and accuracy."""
    accuracy = None if run.accuracy is None or twin.accuracy is None else run.accuracy - twin.accuracy
    return {"setting": f"{setting} ({run.cfg.model})", "time_ratio": twin.throughput / run.throughput,
            "time_basis": "training time per sample", "time_beyond_spread": _beyond_spread(run, twin),
            "memory_ratio": run.peak_memory_bytes / twin.peak_memory_bytes,
            "size_ratio": run.model_size_bytes / twin.model_size_bytes, "accuracy_change": accuracy, "pairs": pairs}


def _deployed(new: pd.Series, old: pd.Series, setting: str, memory_ratio: float) -> dict:
    """An inference table's row against its dense or fp32 row: CPU latency, size and accuracy."""
    return {"setting": setting, "time_ratio": new.cpu_latency_s / old.cpu_latency_s,
            "time_basis": "CPU inference latency", "memory_ratio": memory_ratio,
            "size_ratio": new.model_size_bytes / old.model_size_bytes,
            "accuracy_change": new.test_accuracy - old.test_accuracy, "pairs": 1}


def _technique_row(tech: Technique, single: list[RunResult], prof: Profile) -> dict | None:
    index = {_key(r.cfg, tech.ignore): r for r in single}
    pairs = []
    for run in (r for r in single if tech.on(r.cfg)):
        try:
            twin = index.get(_key(run.cfg.replace(**tech.twin(run.cfg)), tech.ignore))
        except ConfigError:
            continue
        if twin is not None and twin.accuracy is not None and run.accuracy is not None:
            pairs.append((run, twin))
    if not pairs:
        return None
    model = config.workload(prof)["model"]
    run, twin = min(pairs, key=lambda p: (p[0].cfg.model != model, tech.prefer(p[0].cfg) if tech.prefer else 0))
    cfg = run.cfg
    setting = ", ".join(f"{k}={value_text(getattr(cfg, k))}" for k in tech.twin(cfg) if getattr(cfg, k) is not None
                        and k in ("precision", "batch_size", "grad_accum", "checkpointing", "optimizer", "freeze",
                                  "lora_rank"))
    setting += f" on {value_text(cfg.lora_targets)}" if tech.name == "LoRA" else ""
    return _trained(run, twin, setting, len(pairs))


def _distributed_row(runs: list[RunResult]) -> dict | None:
    jobs = [r for r in runs if r.distributed and r.distributed.get("world_size", 1) > 1]
    singles = {(_key(r.cfg, ()), r.distributed is not None): r for r in runs if not r.distributed or
               r.distributed.get("world_size") == 1}
    for job in sorted(jobs, key=lambda r: -r.distributed["world_size"]):
        twin = singles.get((_key(job.cfg, ()), True)) or singles.get((_key(job.cfg, ()), False))
        if twin is not None:
            setting = f"{job.distributed['world_size']} processes, {job.distributed['backend']}"
            return {**_trained(job, twin, setting, len(jobs)), "size_ratio": 1.0}
    return None


def _newest_frame(prefix: str) -> pd.DataFrame | None:
    for path in sorted(results.results_dir().glob(f"{prefix}-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            return results.read_cached_frame(path)
        except (ValueError, KeyError):
            continue
    return None


def _pruning_row() -> dict | None:
    frame = _newest_frame("prune-structured")
    if frame is None:
        return None
    dense, slim = frame.iloc[0], frame.iloc[-1]
    return _deployed(slim, dense, f"{slim.amount:.0%} of channels, after {int(slim.recovery_steps)} recovery steps",
                     slim.inference_peak_bytes / dense.inference_peak_bytes)


def _quantization_row(prof: Profile) -> dict | None:
    frame = _newest_frame("quant-compare")
    if frame is None:
        return None
    frame = frame[frame.ran.astype(bool)]
    fp32 = frame[frame.method == "fp32"].set_index("model")
    for method in ("int8_static", "int8_dynamic"):
        rows = frame[(frame.method == method) & (frame.model == config.workload(prof)["model"])]
        rows = rows if len(rows) else frame[frame.method == method]
        if len(rows):
            q = rows.iloc[0]
            return _deployed(q, fp32.loc[q.model], f"{method} ({q.model})", math.nan)
    return None


@dataclass
class Summary(LabResult):
    """One row per technique (`SUMMARY_COLUMNS` and ``label``): ratios new / old, ``time_basis`` what was timed,
    ``accuracy_change`` a fraction, ``pairs`` the pairs found (0: not run yet here)."""

    shown = ("label", "setting", "time_basis", "time_ratio", "memory_ratio", "size_ratio", "accuracy_change")

    @worded
    def finding(self) -> str:
        frame = self.frame
        measured, missing = frame[frame.pairs > 0], frame[frame.pairs == 0]
        if not len(measured):
            return "No cached runs yet: run notebooks 01-08 first, then this cell again."
        parts = []
        for column, what in (("time_ratio", "time"), ("memory_ratio", "peak memory"), ("size_ratio", "model size")):
            rows = measured[measured.time_beyond_spread.ne(False)] if column == "time_ratio" else measured
            values = rows[column].dropna()
            if len(values) and values.min() < 1:
                best = measured.loc[values.idxmin()]
                parts.append(f"{what}: {best.label} ({best[column]:.2f}x)")
        text = "Most saved here, " + "; ".join(parts) if parts else "No technique saved time, memory or size here"
        if len(missing):
            text += "; not run yet on this machine: " + ", ".join(missing.label)
        return text + "."


def summary(prof: Profile | None = None) -> Summary:
    """Each technique of notebooks 01-08: its cached run against the same run without it (the profile's workload
    preferred); a training time counts as saved only beyond the runs' step-time spreads."""
    prof = prof or profile()
    runs = cached_runs()
    single = [r for r in runs if r.distributed is None and r.inference is None]
    found = {(tech.notebook, tech.name): _technique_row(tech, single, prof) for tech in _techniques(prof)}
    found.update({("04", "structured pruning"): _pruning_row(), ("06", "int8 quantization"): _quantization_row(prof),
                  ("07", "data parallel"): _distributed_row(runs)})
    rows = [{"notebook": notebook, "technique": name, **(row or {"pairs": 0})} for (notebook, name), row in
            found.items()]
    frame = pd.DataFrame(rows).reindex(columns=SUMMARY_COLUMNS).sort_values("notebook", kind="stable")
    frame["label"] = frame.notebook + " " + frame.technique
    return Summary(frame.reset_index(drop=True))


def reference_rows() -> pd.DataFrame:
    """The published figures in the summary's terms (AMP's 2-3x speed-up as a time ratio) and as they are."""
    ref = results.load_reference()
    amp = ref[ref.speedup_vs_fp32.notna()]
    return pd.DataFrame({"label": "01 mixed precision", "time_ratio": 1 / amp.speedup_vs_fp32,
                         "source": "published: PyTorch AMP recipe (tensor-core GPUs)", "setup": amp.setup,
                         "citation": amp.source})

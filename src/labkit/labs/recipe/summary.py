"""Section 6 of notebook 09: what each technique of notebooks 01-08 bought on this machine, from cached runs.

`summary` reads the learner's result cache and pairs each technique's run with the same run without it (mixed
precision against fp32, freezing against no freezing, ...); pruning and quantization come from the tables their
notebooks cached (``prune-structured``, ``quant-compare``), data parallelism from the cached jobs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from ... import config, results
from ...config import RunConfig
from ...env import Profile, env_report, profile
from ...errors import ConfigError
from ...measure import separated
from ...messages import worded
from ...result import RunResult
from .stages import value_text


@dataclass(frozen=True)
class Technique:
    """How a technique shows in cached runs.

    Attributes:
        notebook, name: where it is taught. on: ``on(cfg)`` picks its runs. twin: the changes that give the run
            without it. prefer: orders several runs (lower first). ignore: fields allowed to differ.
    """

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
        except ValueError:
            continue
        if not isinstance(payload, dict) or "config" not in payload or "step_time_s" not in payload:
            continue  # a measured table or record, not a run
        try:
            run = RunResult.from_dict(payload)
            run.cfg  # noqa: B018 - an old config that no longer validates is skipped
        except (TypeError, ConfigError):
            continue
        if run.ok and run.env.get("device") == here.get("device") and run.env.get("gpu") == here.get("gpu"):
            found.append(run)
    return found


def _key(cfg: RunConfig, ignore: tuple) -> tuple:
    values = cfg.to_dict()
    for name in ignore:
        values.pop(name)
    return tuple(sorted((k, str(v)) for k, v in values.items()))


def _beyond_spread(run: RunResult, twin: RunResult) -> bool | None:
    """Whether the two runs' times per sample differ beyond both runs' p10-p90 step-time spread (None: unknown)."""
    bands = []
    for r in (run, twin):
        if not r.throughput or not r.step_time_s:
            return None
        per_sample = 1 / r.throughput / r.step_time_s
        bands.append([r.step_time_p10_s * per_sample, r.step_time_p90_s * per_sample])
    order = separated(*bands)
    return None if order is None else order != 0


def _pair_row(tech: Technique, run: RunResult, twin: RunResult, pairs: int) -> dict:
    cfg = run.cfg
    setting = ", ".join(f"{k}={value_text(getattr(cfg, k))}" for k in tech.twin(cfg) if getattr(cfg, k) is not None
                        and k in ("precision", "batch_size", "grad_accum", "checkpointing", "optimizer", "freeze",
                                  "lora_rank"))
    if tech.name == "LoRA":
        setting += f" on {value_text(cfg.lora_targets)}"
    return {"notebook": tech.notebook, "technique": tech.name, "setting": f"{setting} ({cfg.model})",
            "time_ratio": twin.throughput / run.throughput, "time_basis": "training time per sample",
            "time_beyond_spread": _beyond_spread(run, twin),
            "memory_ratio": run.peak_memory_bytes / twin.peak_memory_bytes,
            "size_ratio": run.model_size_bytes / twin.model_size_bytes,
            "accuracy_change": None if run.accuracy is None or twin.accuracy is None else run.accuracy - twin.accuracy,
            "pairs": pairs}


def _training_rows(runs: list[RunResult], prof: Profile) -> list[dict]:
    single = [r for r in runs if r.distributed is None and r.inference is None]
    rows = []
    for tech in _techniques(prof):
        index = {_key(r.cfg, tech.ignore): r for r in single}
        pairs = []
        for run in single:
            cfg = run.cfg
            if not tech.on(cfg):
                continue
            try:
                twin = index.get(_key(cfg.replace(**tech.twin(cfg)), tech.ignore))
            except ConfigError:
                continue
            if twin is not None and twin.accuracy is not None and run.accuracy is not None:
                pairs.append((run, twin))
        if not pairs:
            rows.append({"notebook": tech.notebook, "technique": tech.name, "pairs": 0})
            continue
        workload_model = config.workload(prof)["model"]
        pairs.sort(key=lambda p: (p[0].cfg.model != workload_model, tech.prefer(p[0].cfg) if tech.prefer else 0))
        rows.append(_pair_row(tech, *pairs[0], len(pairs)))
    return rows


def _distributed_row(runs: list[RunResult]) -> dict:
    jobs = [r for r in runs if r.distributed and r.distributed.get("world_size", 1) > 1]
    singles = {(_key(r.cfg, ()), r.distributed is not None): r for r in runs if not r.distributed or
               r.distributed.get("world_size") == 1}
    for job in sorted(jobs, key=lambda r: -r.distributed["world_size"]):
        twin = singles.get((_key(job.cfg, ()), True)) or singles.get((_key(job.cfg, ()), False))
        if twin is not None:
            return {"notebook": "07", "technique": "data parallel",
                    "setting": f"{job.distributed['world_size']} processes, {job.distributed['backend']} "
                               f"({job.cfg.model})",
                    "time_ratio": twin.throughput / job.throughput, "time_basis": "training time per sample",
                    "time_beyond_spread": _beyond_spread(job, twin),
                    "memory_ratio": job.peak_memory_bytes / twin.peak_memory_bytes, "size_ratio": 1.0,
                    "accuracy_change": job.accuracy - twin.accuracy, "pairs": len(jobs)}
    return {"notebook": "07", "technique": "data parallel", "pairs": 0}


def _newest_frame(prefix: str) -> pd.DataFrame | None:
    paths = sorted(results.results_dir().glob(f"{prefix}-*.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(paths):
        try:
            return results.read_cached_frame(path)
        except (ValueError, KeyError):
            continue
    return None


def _pruning_row() -> dict:
    frame = _newest_frame("prune-structured")
    row = {"notebook": "04", "technique": "structured pruning", "pairs": 0}
    if frame is None:
        return row
    dense, slim = frame.iloc[0], frame.iloc[-1]
    return {**row, "setting": f"{slim.amount:.0%} of channels, after {int(slim.recovery_steps)} recovery steps",
            "time_ratio": slim.cpu_latency_s / dense.cpu_latency_s, "time_basis": "CPU inference latency",
            "memory_ratio": slim.inference_peak_bytes / dense.inference_peak_bytes,
            "size_ratio": slim.model_size_bytes / dense.model_size_bytes,
            "accuracy_change": slim.test_accuracy - dense.test_accuracy, "pairs": 1}


def _quantization_row(prof: Profile) -> dict:
    frame = _newest_frame("quant-compare")
    row = {"notebook": "06", "technique": "int8 quantization", "pairs": 0}
    if frame is None:
        return row
    frame = frame[frame.ran.astype(bool)]
    model = config.workload(prof)["model"]
    for method in ("int8_static", "int8_dynamic"):
        rows = frame[(frame.method == method) & (frame.model == model)]
        rows = rows if len(rows) else frame[frame.method == method]
        base = frame[frame.method == "fp32"].set_index("model")
        if len(rows):
            q = rows.iloc[0]
            fp32 = base.loc[q.model]
            return {**row, "setting": f"{method} ({q.model})", "time_ratio": q.cpu_latency_s / fp32.cpu_latency_s,
                    "time_basis": "CPU inference latency", "memory_ratio": math.nan,
                    "size_ratio": q.model_size_bytes / fp32.model_size_bytes,
                    "accuracy_change": q.test_accuracy - fp32.test_accuracy, "pairs": 1}
    return row


def summary(prof: Profile | None = None) -> pd.DataFrame:
    """One row per technique of notebooks 01-08: its cached run against the same run without it.

    Args:
        prof: the profile (whose workload's runs are preferred).

    Returns:
        DataFrame: `SUMMARY_COLUMNS` and ``label``. ``time_ratio`` is new / old time (training time per sample, or
        inference latency for pruning and quantization: ``time_basis``), ``memory_ratio`` the peak memory's,
        ``size_ratio`` the saved model's, ``accuracy_change`` a fraction (0.01 is a point), ``pairs`` the pairs
        found (0: not run yet here), ``time_beyond_spread`` whether the training times differ beyond both runs'
        p10-p90 spread (None for inference latencies, measured in turns by their notebooks).

    Example:
        >>> summary().set_index("technique").time_ratio
    """
    prof = prof or profile()
    runs = cached_runs()
    rows = _training_rows(runs, prof)
    rows.insert(3, _pruning_row())
    rows.insert(6, _quantization_row(prof))
    rows.insert(7, _distributed_row(runs))
    frame = pd.DataFrame(rows).reindex(columns=SUMMARY_COLUMNS)
    frame["label"] = frame.notebook + " " + frame.technique
    return frame.sort_values("notebook", kind="stable").reset_index(drop=True)


def reference_rows() -> pd.DataFrame:
    """The published figures in the summary's terms (AMP's 2-3x speed-up as a time ratio) and as they are."""
    ref = results.load_reference()
    amp = ref[ref.speedup_vs_fp32.notna()]
    return pd.DataFrame({"label": "01 mixed precision", "time_ratio": 1 / amp.speedup_vs_fp32,
                         "source": "published: PyTorch AMP recipe (tensor-core GPUs)", "setup": amp.setup,
                         "citation": amp.source})


@worded
def summary_finding(frame: pd.DataFrame) -> str:
    """One line: which technique saved the most time, memory and size here, and which are not run yet.

    Args:
        frame: `summary`'s. A time saving counts only beyond the runs' spread (``time_beyond_spread`` not False).
    """
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

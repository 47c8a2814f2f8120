"""Notebook 09 (the recipe): its experiments and the findings worded from their live numbers.

- `RECIPE_PATH`, `recipe_stages`: the seed's staged recipe, a YAML `RunConfig` whose keys are the stages in order.
- `staged`, `stage_table`, `stage_chart_frame`, `recipe_finding`: the stages applied one on top of the other to
  `workload`, in the seed's order, each technique alone, and again in the order those measurements suggest;
  time per epoch, peak memory, accuracy and size of the deployed model for every stage.
- `profile_step`, `profile_finding`: one training step under ``torch.profiler`` before and after mixed precision:
  the top operators, where the time goes by kind of operator, and a Chrome trace file.
- `BROKEN`, `broken`: the deliberately broken configs that notebook 09 hands to `labkit.doctor`.
- `summary`, `summary_finding`, `reference_rows`: what each technique of notebooks 01-08 bought on this machine,
  read from the learner's cached runs, beside the published figures.
- `panel_config`, `panel_run`, `RecipeRun`: the panel; `own_stack_numbers`, `stacked_memory_ratio`: exercise
  ``09.own_stack`` and ``09.measured_order`` (in `exercises`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ... import config, measure, results, train
from ...config import RunConfig, load_config, parse_yaml
from ...data import cache_dir
from ...env import Profile, env_report, profile, resolve_device
from ...errors import ConfigError
from ...messages import worded, wrap
from ...result import RunResult
from ...techniques.precision import resolve_precision
from ...units import mib

RECIPE_PATH = Path(__file__).resolve().parents[2] / "assets" / "recipes" / "seed_recipe.yaml"
# Fields that belong to the stage of another field (LoRA's rank carries its targets, quantize its kept layers).
STAGE_OF = {"lora_targets": "lora_rank", "lora_alpha": "lora_rank", "lora_dropout": "lora_rank",
            "quantize_keep_float": "quantize", "prune_structured": "prune_amount"}
STAGE_NAMES = {"batch_size": "larger batch", "precision": "mixed precision", "checkpointing": "checkpointing",
               "optimizer": "8-bit optimizer", "freeze": "freezing", "lora_rank": "LoRA", "grad_accum": "accumulation",
               "quantize": "quantization", "prune_amount": "pruning", "channels_last": "channels_last"}
INFERENCE_FIELDS = ("quantize", "prune_amount")  # stages that act on the trained model: they stay last
ORDER_METRICS = ("peak_memory_bytes", "epoch_time_s")  # what the measured order ranks each stage alone by
SEED, ALONE, MEASURED = "seed's order", "each alone", "measured order"
PROFILE_TOP = 10  # operators in the profiler's table
TRACE_DIR = "traces"  # under the data cache: Chrome traces of the profiled steps


def workload(prof: Profile | None = None) -> RunConfig:
    """The recipe's baseline: the profile's pretrained workload, trained for whole epochs (about the profile's step
    budget at its batch size), so that a larger batch sees the same data in fewer steps.

    Example:
        >>> workload(labkit.profile("ci")).epochs
        2
    """
    prof = prof or profile()
    epochs = max(1, round(prof.max_steps * prof.batch_size / prof.train_size))
    return config.baseline(prof, max_steps=None, epochs=epochs)


@dataclass(frozen=True)
class Stage:
    """One stage of a recipe: the `RunConfig` fields it sets, and a name."""

    name: str
    changes: dict

    @property
    def key(self) -> str:
        return next(iter(self.changes))

    @property
    def inference(self) -> bool:
        return self.key in INFERENCE_FIELDS

    def label(self) -> str:
        said = ", ".join(f"{k}={_value(v)}" for k, v in self.changes.items())
        return f"{self.name} ({said})"


def _value(value) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def recipe_stages(path: str | Path = RECIPE_PATH) -> list[Stage]:
    """The stages of a recipe file, in the file's order: each key one stage (with the keys that belong to it,
    `STAGE_OF`). The file is checked as a `RunConfig` first (`labkit.load_config`): an unknown key is an error.

    Example:
        >>> [s.key for s in recipe_stages()]
        ['batch_size', 'precision', 'checkpointing', 'optimizer', 'freeze', 'quantize']
    """
    path = Path(path)
    loaded = load_config(path)
    keys = list(parse_yaml(path.read_text(), path.name) or {})
    stages: dict[str, dict] = {}
    for key in keys:
        owner = STAGE_OF.get(key, key)
        stages.setdefault(owner, {})[key] = getattr(loaded, key)
    if not stages:
        raise ConfigError(path.name, "{}", "at least one RunConfig field: each key is a stage")
    for owner, changes in stages.items():
        if owner not in changes:
            raise ConfigError(path.name, list(changes), f"{owner} too: {list(changes)} belong to its stage")
    return [Stage(STAGE_NAMES.get(owner, owner), changes) for owner, changes in stages.items()]


def stacked_configs(base: RunConfig, stages: list[Stage]) -> list[tuple[str, RunConfig]]:
    """``base`` and then each stage applied on top of the ones before it: ``[(label, config), ...]``."""
    configs, cfg = [("baseline", base)], base
    for stage in stages:
        cfg = cfg.replace(**stage.changes)
        configs.append((stage.label(), cfg))
    return configs


def _rows(configs: list[tuple[str, RunConfig]], order: str, refresh: bool, progress: bool) -> pd.DataFrame:
    done = results.run_configs([cfg for _, cfg in configs], refresh=refresh, progress=progress)
    frame = results.to_frame(done)
    frame.insert(0, "order", order)
    frame.insert(1, "stage", range(len(configs)))
    frame.insert(2, "added", [label for label, _ in configs])
    train_size = len(train.run_splits(configs[0][1])["train"])
    frame["epoch_time_s"] = train_size / frame.throughput
    frame["deployed_accuracy"] = frame.inference_accuracy.fillna(frame.accuracy)
    frame["deployed_size_bytes"] = frame.inference_size_bytes.fillna(frame.model_size_bytes)
    return frame


@dataclass
class Recipe:
    """`staged`'s runs. Attributes: ``base`` (the baseline config), ``stages`` (the seed's order), ``order`` (the measured order), ``seed``,
    ``alone`` and ``measured`` (one frame each: ``order``, ``stage``, ``added``, the run's columns,
    ``epoch_time_s``, ``deployed_accuracy``, ``deployed_size_bytes``)."""

    base: RunConfig
    stages: list[Stage]
    order: list[Stage]
    seed: pd.DataFrame
    alone: pd.DataFrame
    measured: pd.DataFrame

    @property
    def frame(self) -> pd.DataFrame:
        return pd.concat([self.seed, self.measured], ignore_index=True)


def changes_nothing(stage: Stage, row: pd.Series, base: pd.Series) -> bool:
    """Whether ``stage`` ran the same computation as the baseline here: a precision that resolved to the baseline's
    (``auto`` is fp32 on a CPU). Its time and memory ratios are then timing noise, not an effect."""
    return set(stage.changes) == {"precision"} and "precision_used" in row and \
        row.precision_used == base.precision_used


def measured_order(stages: list[Stage], alone: pd.DataFrame) -> list[Stage]:
    """The stages ranked by what each bought alone: the product of its peak-memory and epoch-time ratios to the
    baseline, smallest first (the most saved). A stage that changes nothing here (`changes_nothing`) or whose run
    failed goes after the others, and stages that act on the trained model (quantization, pruning) stay last."""
    base = alone.iloc[0]
    score = {}
    for stage, (_, row) in zip(stages, alone.iloc[1:].iterrows(), strict=True):
        ratios = [row[m] / base[m] for m in ORDER_METRICS]
        failed = not pd.isna(row.error) or any(map(math.isnan, ratios))
        score[id(stage)] = (failed, changes_nothing(stage, row, base), math.inf if failed else math.prod(ratios))
    return sorted(stages, key=lambda s: (s.inference, *score[id(s)]))


def staged(base: RunConfig | None = None, path: str | Path = RECIPE_PATH, refresh: bool = False,
           progress: bool = True) -> Recipe:
    """Apply the recipe's stages to ``base`` one on top of the other in the file's order; run each stage alone on
    ``base``; and apply them again in the order those alone-runs suggest (`measured_order`). Every run is cached.

    Example:
        >>> rec = staged(); stage_table(rec)
    """
    base = workload() if base is None else base
    stages = recipe_stages(path)
    seed = _rows(stacked_configs(base, stages), SEED, refresh, progress)
    alone = _rows([("baseline", base), *((s.label(), base.replace(**s.changes)) for s in stages)], ALONE, refresh,
                  progress)
    order = measured_order(stages, alone)
    measured = _rows(stacked_configs(base, order), MEASURED, refresh, progress)
    return Recipe(base, stages, order, seed, alone, measured)


def stage_table(rec: Recipe, which: str = "stacked") -> pd.DataFrame:
    """The stages in display units: ``stacked`` (the seed's order, then the measured one) or ``alone``."""
    if which not in ("stacked", "alone"):
        raise ConfigError("which", which, "'stacked' (both orders) or 'alone' (each stage on the baseline)")
    frame = rec.frame if which == "stacked" else rec.alone
    base = frame.iloc[0]
    table = pd.DataFrame({
        "order": frame.order, "stage": frame.stage, "added": frame.added,
        "epoch time s": frame.epoch_time_s.round(2), "vs baseline": (frame.epoch_time_s / base.epoch_time_s).round(2),
        "peak MiB": (frame.peak_memory_bytes / 2**20).round(1),
        "memory vs baseline": (frame.peak_memory_bytes / base.peak_memory_bytes).round(2),
        "accuracy %": (100 * frame.deployed_accuracy).round(1),
        "deployed size MiB": (frame.deployed_size_bytes / 2**20).round(2),
        "precision used": frame.precision_used, "error": frame.error.fillna(""),
    })
    return table


def stage_chart_frame(rec: Recipe) -> pd.DataFrame:
    """One row per stage of both orders, for `labkit.plots.lines` with ``x="stage"`` and ``hue="order"``."""
    frame = rec.frame.copy()
    return frame[["order", "stage", "added", "epoch_time_s", "peak_memory_bytes", "deployed_accuracy",
                  "deployed_size_bytes", "error"]].rename(columns={"deployed_accuracy": "accuracy",
                                                                   "deployed_size_bytes": "model_size_bytes"})


def _ratio(new, old) -> str:
    return f"{new / old:.2f}x"


@worded
def recipe_finding(rec: Recipe) -> str:
    """What the whole recipe did, which stage bought the most, and how the measured order differs."""
    seed = rec.seed
    failed = seed[seed.error.notna()]
    base, last = seed.iloc[0], seed.iloc[-1]
    lines = []
    if len(failed):
        lines.append("Failed stages: " + "; ".join(f"{r.added}: {r.error}" for r in failed.itertuples()))
    noise = measure.accuracy_noise(base.deployed_accuracy, len(train.run_splits(rec.base)["test"]))
    lines.append(
        f"The whole recipe: epoch time {_ratio(last.epoch_time_s, base.epoch_time_s)} the baseline's, peak memory "
        f"{_ratio(last.peak_memory_bytes, base.peak_memory_bytes)}, deployed model "
        f"{_ratio(last.deployed_size_bytes, base.deployed_size_bytes)} the size, accuracy {base.deployed_accuracy:.1%} "
        f"-> {last.deployed_accuracy:.1%} (test-set noise about {noise * 100:.0f} points).")
    steps = seed.iloc[1:].reset_index(drop=True)
    before = seed.iloc[:-1].reset_index(drop=True)
    ok = steps.error.isna() & before.error.isna()
    if ok.any():
        memory = (steps.peak_memory_bytes / before.peak_memory_bytes)[ok]
        time = (steps.epoch_time_s / before.epoch_time_s)[ok]
        acc = (steps.deployed_accuracy - before.deployed_accuracy)[ok]
        lines.append(f"In the seed's order the most memory went with {steps.added[memory.idxmin()]} "
                     f"({memory.min():.2f}x the stage before), the most time with {steps.added[time.idxmin()]} "
                     f"({time.min():.2f}x).")
        slower = steps.added[time.idxmax()]
        if time.max() > 1.05:
            lines.append(f"{slower} made the epoch slower ({time.max():.2f}x the stage before): it trades time for "
                         "memory, or the device has no fast path for it.")
        if (-acc).max() > noise:
            lines.append(f"{steps.added[acc.idxmin()]} cost {(-acc).max() * 100:.1f} accuracy points, beyond the "
                         "test set's noise.")
        size = (steps.deployed_size_bytes / before.deployed_size_bytes)[ok]
        weak = [steps.added[i] for i in memory.index if memory[i] > 0.97 and time[i] > 0.97 and size[i] > 0.97]
        if weak:
            lines.append("Bought almost nothing in time, memory or size where they stand in this order: "
                         + ", ".join(weak) + ".")
    alone_base = rec.alone.iloc[0]
    idle = [stage.label() for stage, (_, row) in zip(rec.stages, rec.alone.iloc[1:].iterrows(), strict=True)
            if changes_nothing(stage, row, alone_base)]
    if idle:
        lines.append(f"Changes nothing on this device: {', '.join(idle)} resolved to the baseline's "
                     f"{alone_base.precision_used}; its ratios are timing noise, so it goes last in the measured order.")
    seed_keys, measured_keys = [s.key for s in rec.stages], [s.key for s in rec.order]
    if seed_keys == measured_keys:
        lines.append("The measurements suggest the seed's own order.")
    else:
        lines.append("The measured order (what each bought alone, memory x time): "
                     + " > ".join(s.name for s in rec.order) + ".")
    return "\n".join(lines)


# --- the profiler --------------------------------------------------------------------------------------------

CASTS = "copies and casts"
OP_KINDS = (  # (kind, pattern on the operator's name, case ignored), first match wins
    ("matmul / convolution", r"conv|addmm|\bmm\b|aten::mm|bmm|matmul|linear|gemm|mkldnn"),
    (CASTS, r"aten::to$|_to_copy|aten::copy_|type_as|contiguous|clone"),
    ("normalization", r"norm"),
    ("optimizer", r"foreach|adam|optimizer|lerp|addcdiv|addcmul|sqrt|bitsandbytes|zero_"),
    ("elementwise / activation", r"relu|gelu|clamp|add|mul|sub|div|threshold|sigmoid|softmax|dropout|pool|mean|sum"),
)


def op_kind(name: str) -> str:
    """Which kind of work an operator is (`OP_KINDS`), else ``other``."""
    for kind, pattern in OP_KINDS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return kind
    return "other"


@dataclass
class ProfiledStep:
    """One training step under ``torch.profiler``: ``precision`` (as resolved), ``ops`` (the top operators by
    self time), ``kinds`` (self time by `op_kind`), ``step_time_s`` (the profiled step, profiler overhead
    included), ``trace_path`` (a Chrome trace: chrome://tracing or https://ui.perfetto.dev), ``device``."""

    precision: str
    ops: pd.DataFrame
    kinds: pd.DataFrame
    step_time_s: float
    trace_path: Path
    device: str


@contextlib.contextmanager
def quiet_native_output():
    """Drop what C++ writes to the process's stdout and stderr meanwhile: the profiler's library (Kineto) logs
    "profiler_start" and, on a CUDA build without a GPU, a harmless "gpuGetDeviceCount failed", which Jupyter would
    show as a red box."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def profiler_precision(cfg: RunConfig) -> str:
    """The mixed precision to profile against fp32: what ``auto`` gives on this device, or bf16 where ``auto`` keeps
    fp32 (a CPU, a P100), so that the casts show."""
    device = resolve_device(cfg.device)
    auto = resolve_precision("auto", device).name
    return auto if auto != "fp32" else "bf16"


def profile_step(cfg: RunConfig, precision: str | None = None, warmup_steps: int = 2, top: int = PROFILE_TOP) -> ProfiledStep:
    """Train ``warmup_steps`` steps of ``cfg`` in ``precision`` (default ``cfg.precision``), then profile one more.

    Example:
        >>> before = profile_step(cfg, "fp32"); before.kinds
    """
    cfg = cfg.replace(precision=precision or cfg.precision)
    trainer = train.Trainer(cfg)
    device = trainer.device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    batches = trainer.batches(warmup_steps + 1)
    for _ in range(warmup_steps):
        trainer.step(*next(batches))
    measure.synchronize(device)
    images, labels = next(batches)
    timer = measure.StepTimer(device)
    with quiet_native_output(), torch.profiler.profile(activities=activities) as prof:
        timer.start()
        trainer.step(images, labels)
        timer.stop()
        measure.synchronize(device)
    events = prof.key_averages()
    on_gpu = device.type == "cuda"
    rows = [{"operator": e.key, "calls": e.count,
             "self_ms": (e.self_device_time_total if on_gpu else e.self_cpu_time_total) / 1e3,
             "total_ms": (e.device_time_total if on_gpu else e.cpu_time_total) / 1e3} for e in events]
    ops = pd.DataFrame(rows)
    ops = ops[ops.self_ms > 0].sort_values("self_ms", ascending=False)
    ops["share"] = ops.self_ms / ops.self_ms.sum()
    ops["kind"] = ops.operator.map(op_kind)
    kinds = ops.groupby("kind", as_index=False).agg(self_ms=("self_ms", "sum"), operators=("operator", "count"))
    kinds["share"] = kinds.self_ms / kinds.self_ms.sum()
    trace = trace_folder() / f"{cfg.model}-bs{cfg.batch_size}-{trainer.precision.name}-{device.type}.json"
    with quiet_native_output():
        prof.export_chrome_trace(str(trace))
    return ProfiledStep(trainer.precision.name, ops.head(top).reset_index(drop=True),
                        kinds.sort_values("self_ms", ascending=False).reset_index(drop=True),
                        timer.times_s()[0], trace, device.type)


def trace_folder() -> Path:
    """Where the Chrome traces of profiled steps are written (under the data cache)."""
    folder = cache_dir() / TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def profile_pair(cfg: RunConfig, warmup_steps: int = 2) -> tuple[ProfiledStep, ProfiledStep]:
    """`profile_step` in fp32 and in `profiler_precision`."""
    return profile_step(cfg, "fp32", warmup_steps), profile_step(cfg, profiler_precision(cfg), warmup_steps)


def kinds_table(before: ProfiledStep, after: ProfiledStep) -> pd.DataFrame:
    """Self time by kind of operator in both steps, ms and share."""
    columns = ["kind", "self_ms", "share"]
    both = before.kinds[columns].merge(after.kinds[columns], on="kind", how="outer",
                                       suffixes=(f" {before.precision}", f" {after.precision}")).fillna(0.0)
    return both.sort_values(f"self_ms {before.precision}", ascending=False).round(3).reset_index(drop=True)


def kinds_frame(before: ProfiledStep, after: ProfiledStep) -> pd.DataFrame:
    """Both steps' self time by kind, long (``kind``, ``precision``, ``self_ms``, ``share``): a chart's rows."""
    return pd.concat([step.kinds.assign(precision=step.precision) for step in (before, after)], ignore_index=True)


@worded
def profile_finding(before: ProfiledStep, after: ProfiledStep) -> str:
    """Where the time of a step goes before and after mixed precision, from the two profiles."""
    table = kinds_table(before, after).set_index("kind")
    b, a = before.precision, after.precision
    top_b, top_a = table[f"share {b}"].idxmax(), table[f"share {a}"].idxmax()
    cast_b = table[f"share {b}"].get(CASTS, 0.0)
    cast_a = table[f"share {a}"].get(CASTS, 0.0)
    lines = [f"Profiled step ({before.device}, profiler overhead included): {b} {before.step_time_s * 1e3:.0f} ms, "
             f"{a} {after.step_time_s * 1e3:.0f} ms ({after.step_time_s / before.step_time_s:.2f}x).",
             f"Largest kind of work: {top_b} in {b} ({table.loc[top_b, f'share {b}']:.0%} of the operators' self time), "
             f"{top_a} in {a} ({table.loc[top_a, f'share {a}']:.0%}).",
             f"Copies and casts take {cast_b:.0%} of the time in {b} (moving data) and {cast_a:.0%} in {a} (moving "
             "data, plus autocast's conversions of weights and activations before each matmul or convolution)."]
    mm = "matmul / convolution"
    if mm in table.index:
        lines.append(f"Matmuls and convolutions: {table.loc[mm, f'self_ms {b}']:.1f} ms in {b}, "
                     f"{table.loc[mm, f'self_ms {a}']:.1f} ms in {a}.")
    lines.append(f"Traces: {before.trace_path.name} and {after.trace_path.name} in {before.trace_path.parent}.")
    return "\n".join(lines)


# --- the doctor's broken configs ------------------------------------------------------------------------------

BROKEN = {  # symptom -> RunConfig changes that produce it on the workload
    "nan_loss": {"optimizer": "sgd", "lr": 50.0},
    "amp_slower": {"precision": "fp16", "batch_size": 8},
    "quantization_drop": {"quantize": "int3_simulated"},
    "pruning_memory": {"prune_amount": 0.5},
    "distributed_hang": {},
}
HANG = {"nproc": 2, "fail_rank": 1, "fail_step": 2, "fail_how": "hang", "timeout_s": 3}  # the hang's launch


def broken(cfg: RunConfig, symptom: str) -> RunConfig:
    """``cfg`` with the changes that produce ``symptom`` (`BROKEN`), trained for the profile's step budget.

    Example:
        >>> labkit.doctor(broken(workload(), "nan_loss"))
    """
    if symptom not in BROKEN:
        raise ConfigError("symptom", symptom, f"one of {list(BROKEN)}")
    return cfg.replace(epochs=1, max_steps=profile().max_steps, **BROKEN[symptom])


# --- the summary of notebooks 01-08 ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Technique:
    """How a technique shows in cached runs: ``on(cfg)`` picks its runs, ``twin`` the changes that give the run
    without it, ``prefer`` orders several runs (lower first), ``ignore`` fields allowed to differ."""

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
        Technique("03", "gradient checkpointing", lambda c: c.checkpointing is True, lambda c: {"checkpointing": False}),
        Technique("03", "8-bit optimizer", lambda c: c.optimizer == "adamw8bit", lambda c: {"optimizer": "adamw"}),
        Technique("05", "freezing", lambda c: c.freeze not in (None, "none"), lambda c: {"freeze": None},
                  lambda c: ("medium", "heavy", "light", "head_only").index(c.freeze)),
        Technique("08", "LoRA", lambda c: c.lora_rank is not None,
                  lambda c: {"lora_rank": None, **config.LORA_DEFAULTS}, lambda c: (c.lora_rank != 8, c.lora_targets != ("qkv",), c.lora_rank),
                  ignore=("lr",)),
    ]


SUMMARY_COLUMNS = ("notebook", "technique", "setting", "time_ratio", "time_basis", "memory_ratio", "size_ratio",
                   "accuracy_change", "pairs")


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


def _pair_row(tech: Technique, run: RunResult, twin: RunResult, pairs: int) -> dict:
    cfg = run.cfg
    setting = ", ".join(f"{k}={_value(getattr(cfg, k))}" for k in tech.twin(cfg) if getattr(cfg, k) is not None
                        and k in ("precision", "batch_size", "grad_accum", "checkpointing", "optimizer", "freeze",
                                  "lora_rank"))
    if tech.name == "LoRA":
        setting += f" on {_value(cfg.lora_targets)}"
    return {"notebook": tech.notebook, "technique": tech.name, "setting": f"{setting} ({cfg.model})",
            "time_ratio": twin.throughput / run.throughput, "time_basis": "training time per sample",
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
                    "setting": f"{job.distributed['world_size']} processes, {job.distributed['backend']} ({job.cfg.model})",
                    "time_ratio": twin.throughput / job.throughput, "time_basis": "training time per sample",
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
    """What each technique of notebooks 01-08 bought on this machine, from the learner's cached runs: one row per
    technique, its run against the same run without it (``pairs`` counts the pairs found; 0: not run yet here).

    Columns: `SUMMARY_COLUMNS`. ``time_ratio`` is new / old time (training time per sample, or inference latency for
    pruning and quantization: ``time_basis``), ``memory_ratio`` the peak memory's (training; inference for pruning),
    ``size_ratio`` the saved model's, ``accuracy_change`` in accuracy (a fraction: 0.01 is a point).

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
    """Which technique bought the most time, memory and size here, and which are not run yet."""
    measured = frame[frame.pairs > 0]
    missing = frame[frame.pairs == 0]
    lines = []
    if len(measured):
        for column, what in (("time_ratio", "time"), ("memory_ratio", "peak memory"), ("size_ratio", "model size")):
            values = measured[column].dropna()
            if len(values) and values.min() < 0.97:
                best = measured.loc[values.idxmin()]
                lines.append(f"Most {what} saved: {best.label} ({best.setting}): {best[column]:.2f}x.")
        acc = measured.accuracy_change.dropna()
        if len(acc):
            worst = measured.loc[acc.idxmin()]
            lines.append(f"Largest accuracy change: {worst.label}, {worst.accuracy_change * 100:+.1f} points.")
    if len(missing):
        lines.append("Not run yet on this machine (run those notebooks, then this cell again): "
                     + ", ".join(missing.label) + ".")
    return "\n".join(lines) or "No cached runs yet: run notebooks 01-08 first."


# --- the panel and the exercise -------------------------------------------------------------------------------


@dataclass
class RecipeRun:
    """One panel run: the stacked config's headline numbers."""

    setting: str
    epoch_time_s: float
    peak_memory_bytes: int | None
    accuracy: float | None
    model_size_bytes: int | None
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return wrap(f"{self.setting}: {self.epoch_time_s:.2f} s an epoch, peak {mib(self.peak_memory_bytes)}, "
                    f"accuracy {self.accuracy:.1%}, deployed model {mib(self.model_size_bytes)}")


def panel_config(cfg: RunConfig) -> RunConfig:
    """The panel's starting point: the recipe's training stages on ``cfg``, quantized for inference."""
    for stage in recipe_stages():
        cfg = cfg.replace(**stage.changes)
    return cfg


def panel_run(cfg: RunConfig, on_step=None, progress: bool = False) -> RecipeRun:
    """Train ``cfg`` through the cache and report what the recipe's table reports."""
    result = results.cached_fit(cfg, progress=progress, on_step=on_step)
    deployed = result.inference or {}
    parts = [f"bs{cfg.batch_size}", result.precision_used, "ckpt" if cfg.checkpointing else "",
             "8bit" if "8bit" in cfg.optimizer else "", f"freeze {cfg.freeze}" if cfg.freeze else "",
             cfg.quantize or ""]
    setting = " ".join(part for part in parts if part)  # short: the panel's bars are labelled with it
    return RecipeRun(setting, len(train.run_splits(cfg)["train"]) / result.throughput, result.peak_memory_bytes,
                     deployed.get("accuracy", result.accuracy), deployed.get("size_bytes", result.model_size_bytes),
                     list(result.warnings))


OWN_STACK = {"batch_size": "batch", "precision": "amp", "checkpointing": "ckpt", "optimizer": "opt8", "freeze": "freeze"}


def own_stack_numbers(rec: Recipe) -> dict:
    """Exercise ``09.own_stack``'s numbers from the learner's recipe: the peak-memory ratio of each training stage
    alone to the baseline, rounded as printed (the seed's five training stages)."""
    base = rec.alone.iloc[0].peak_memory_bytes
    ratios = {stage.key: row.peak_memory_bytes / base for stage, (_, row) in
              zip(rec.stages, rec.alone.iloc[1:].iterrows(), strict=True)}
    missing = [key for key in OWN_STACK if key not in ratios or math.isnan(ratios[key])]
    if missing:
        raise ConfigError("recipe", [s.key for s in rec.stages], f"the seed's training stages {list(OWN_STACK)}, each "
                          f"run (missing or failed: {missing})")
    return {name: round(float(ratios[key]), 3) for key, name in OWN_STACK.items()}


def stacked_memory_ratio(rec: Recipe) -> float:
    """The seed-order stack's peak memory after its last training stage, as a ratio to the baseline's."""
    training = [i for i, stage in enumerate(rec.stages, start=1) if not stage.inference]
    return float(rec.seed.peak_memory_bytes.iloc[training[-1]] / rec.seed.peak_memory_bytes.iloc[0])

"""Sections 1-3 of notebook 09: a staged recipe (a YAML `RunConfig`, one stage a key) stacked in the file's order,
each stage alone on the baseline, and stacked again in the order those alone-runs suggest."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ... import config, results
from ...config import RunConfig
from ...configfile import load_config, parse_yaml
from ...env import Profile, profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Comparison, Measured, compare
from ...messages import worded
from ...runsetup import run_splits

RECIPE_PATH = Path(__file__).resolve().parents[2] / "assets" / "recipes" / "staged_recipe.yaml"
# Fields that belong to the stage of another field (LoRA's rank carries its targets, quantize its kept layers).
# A learning rate goes with a larger batch (scaled, warmed up) or else with LoRA (its larger step): the first of
# the owners the file has.
STAGE_OF = {"lora_targets": "lora_rank", "lora_alpha": "lora_rank", "lora_dropout": "lora_rank",
            "quantize_keep_float": "quantize", "prune_structured": "prune_amount",
            "lr": ("batch_size", "lora_rank"), "lr_warmup_steps": "batch_size"}
STAGE_NAMES = {"batch_size": "larger batch", "precision": "mixed precision", "optimizer": "8-bit optimizer",
               "freeze": "freezing", "lora_rank": "LoRA", "grad_accum": "accumulation", "quantize": "quantization",
               "prune_amount": "pruning"}  # any other field is its own stage's name
INFERENCE_FIELDS = ("quantize", "prune_amount")  # stages that act on the trained model: they stay last
ORDER_METRICS = ("peak_memory_bytes", "epoch_time_s")  # what the measured order ranks each stage alone by
MIN_EPOCHS = 2  # one epoch of ci's 512 images is 2 steps at batch 256: fewer than the untimed ones
GIVEN, ALONE, MEASURED = "given order", "each alone", "measured order"
STAGE_COLUMNS = ("order", "stage", "added", "epoch_time_s", "epoch_time_p10_s", "epoch_time_p90_s",
                 "peak_memory_bytes", "accuracy", "model_size_bytes", "precision_used", "error")
FASTER = ("faster", "slower")
# the training stages of exercise 09.own_stack, by the names of its numbers
OWN_STACK = {"batch_size": "batch", "precision": "amp", "optimizer": "opt8", "freeze": "freeze"}


def workload(prof: Profile | None = None) -> RunConfig:
    """The profile's pretrained workload for whole epochs: its step budget's worth, at least `MIN_EPOCHS`."""
    prof = prof or profile()
    epochs = max(MIN_EPOCHS, round(prof.max_steps * prof.batch_size / prof.train_size))
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
        said = ", ".join(f"{k}={value_text(v)}" for k, v in self.changes.items())
        return f"{self.name} ({said})"


def value_text(value) -> str:
    """A config value as a recipe line shows it: lists in brackets."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _owner(key: str, keys: list[str]) -> str:
    owner = STAGE_OF.get(key, key)
    if isinstance(owner, tuple):
        return next((o for o in owner if o in keys), owner[0])
    return owner


def recipe_stages(path: str | Path = RECIPE_PATH, base: RunConfig | None = None) -> list[Stage]:
    """The stages of a recipe file in its order, the file checked as a `RunConfig` (on ``base`` where given)."""
    path = Path(path)
    values = parse_yaml(path.read_text(), path.name) or {}
    loaded = load_config(path) if base is None else RunConfig.from_dict({**base.to_dict(), **values},
                                                                         source=path.name)
    stages: dict[str, dict] = {}
    for key in values:
        stages.setdefault(_owner(key, list(values)), {})[key] = getattr(loaded, key)
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


def stage_rows(configs: list[tuple[str, RunConfig]], order: str, refresh: bool, progress: bool) -> pd.DataFrame:
    """The cached runs of ``configs``, one row per stage, with the epoch time's spread and the deployed model's
    accuracy and size."""
    frame = results.to_frame(results.run_configs([cfg for _, cfg in configs], refresh=refresh, progress=progress))
    frame.insert(0, "order", order)
    frame.insert(1, "stage", range(len(configs)))
    frame.insert(2, "added", [label for label, _ in configs])
    frame["epoch_time_s"] = len(run_splits(configs[0][1])["train"]) / frame.throughput
    # the timed steps' spread, scaled to an epoch: how far this run's own epoch time could be off
    frame["epoch_time_p10_s"] = frame.epoch_time_s * frame.step_time_p10_s / frame.step_time_s
    frame["epoch_time_p90_s"] = frame.epoch_time_s * frame.step_time_p90_s / frame.step_time_s
    frame["deployed_accuracy"] = frame.inference_accuracy.fillna(frame.accuracy)
    frame["deployed_size_bytes"] = frame.inference_size_bytes.fillna(frame.model_size_bytes)
    return frame


def stage_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s `STAGE_COLUMNS`, ``accuracy`` and ``model_size_bytes`` those of the deployed model."""
    frame = frame.drop(columns=["accuracy", "model_size_bytes"])
    frame = frame.rename(columns={"deployed_accuracy": "accuracy", "deployed_size_bytes": "model_size_bytes"})
    return frame[list(STAGE_COLUMNS)].reset_index(drop=True)


def _time(new: pd.Series, old: pd.Series) -> Comparison:
    return compare(Measured.row(new, "epoch_time_s"), Measured.row(old, "epoch_time_s"), FASTER)


def _name(row: pd.Series) -> str:
    """The stage's name without its settings: "larger batch (batch_size=256)" -> "larger batch"."""
    return row.added.split(" (")[0]


def changes_nothing(stage: Stage, row: pd.Series, base: pd.Series) -> bool:
    """Whether ``stage`` ran the baseline's computation here: a precision that resolved to the baseline's (``auto``
    is fp32 where bf16 would be emulated), whose ratios are noise."""
    return set(stage.changes) == {"precision"} and "precision_used" in row and \
        row.precision_used == base.precision_used


def measured_order(stages: list[Stage], alone: pd.DataFrame) -> list[Stage]:
    """The stages by what each bought alone (``alone``: the baseline first): peak-memory ratio x epoch-time ratio,
    smallest first; failed stages and those that change nothing after, inference stages last."""
    base = alone.iloc[0]
    score = {}
    for stage, (_, row) in zip(stages, alone.iloc[1:].iterrows(), strict=True):
        ratios = [row[m] / base[m] for m in ORDER_METRICS]
        failed = not pd.isna(row.error) or any(map(math.isnan, ratios))
        score[id(stage)] = (failed, changes_nothing(stage, row, base), math.inf if failed else math.prod(ratios))
    return sorted(stages, key=lambda s: (s.inference, *score[id(s)]))


@dataclass
class Alone(LabResult):
    """Each stage alone on the baseline (``frame``: the baseline first), and the order they suggest."""

    shown = ("added", "epoch_time_s", "peak_memory_bytes", "accuracy", "model_size_bytes", "precision_used")
    stages: list
    order: list

    @worded
    def finding(self) -> str:
        base = self.frame.iloc[0]
        idle = [stage.name for stage, (_, row) in zip(self.stages, self.frame.iloc[1:].iterrows(), strict=True)
                if changes_nothing(stage, row, base)]
        same = [s.key for s in self.stages] == [s.key for s in self.order]
        text = "Measured order: " + " > ".join(s.name for s in self.order)
        text += " (the given order)" if same else " (not the given order)"
        if idle:
            text += f"; {', '.join(idle)} resolved to the baseline's {base.precision_used} here, so it changes nothing"
        return text + "."


@dataclass
class Recipe(LabResult):
    """`staged`'s runs: ``frame`` both stacked orders (`stage_table`); ``given``, ``alone``, ``measured`` each
    order's full rows; ``order`` the measured order of the ``stages``."""

    shown = ("order", "added", "epoch_time_s", "peak_memory_bytes", "accuracy", "model_size_bytes", "precision_used")
    base: RunConfig
    stages: list
    order: list
    given: pd.DataFrame
    alone: pd.DataFrame
    measured: pd.DataFrame

    @property
    def each_alone(self) -> Alone:
        """Each stage alone on the baseline, worded by the order it suggests."""
        return Alone(stage_table(self.alone), stages=self.stages, order=self.order)

    def whole_time(self) -> Comparison:
        """The whole recipe's epoch time against the baseline's, with both runs' spreads."""
        return _time(self.given.iloc[-1], self.given.iloc[0])

    @worded
    def finding(self) -> str:
        given = self.given
        base, last = given.iloc[0], given.iloc[-1]
        test_size = len(run_splits(self.base)["test"])
        accuracy = compare(Measured.accuracy(last.deployed_accuracy, test_size),
                           Measured.accuracy(base.deployed_accuracy, test_size))
        text = (f"The whole recipe: epoch time {self.whole_time()}, peak memory "
                f"{last.peak_memory_bytes / base.peak_memory_bytes:.2f}x, deployed size "
                f"{last.deployed_size_bytes / base.deployed_size_bytes:.2f}x the baseline's, accuracy "
                f"{base.deployed_accuracy:.1%} -> {last.deployed_accuracy:.1%} ({accuracy.verdict})")
        pairs = [(given.iloc[i], given.iloc[i - 1]) for i in range(1, len(given))
                 if pd.isna(given.error.iloc[i]) and pd.isna(given.error.iloc[i - 1])]
        time = {_name(new): _time(new, old).direction for new, old in pairs}  # -1 faster, 1 slower than before
        memory = min(pairs, key=lambda p: p[0].peak_memory_bytes / p[1].peak_memory_bytes, default=None)
        if memory is not None and memory[0].peak_memory_bytes < memory[1].peak_memory_bytes:
            text += f"; the most memory saved by {_name(memory[0])}"
        fastest = min(pairs, key=lambda p: p[0].epoch_time_s / p[1].epoch_time_s, default=None)
        if fastest is not None and time[_name(fastest[0])] == -1:
            text += f", the most time by {_name(fastest[0])}"
        idle = [_name(new) for new, old in pairs if time[_name(new)] != -1 and new.peak_memory_bytes >=
                old.peak_memory_bytes and new.deployed_size_bytes >= old.deployed_size_bytes]
        if idle:
            text += f"; bought nothing where it stands: {', '.join(idle)}"
        if slower := [name for name, direction in time.items() if direction == 1]:
            text += f"; {FASTER[1]} than the stage before: {', '.join(slower)}"
        failed = given[given.error.notna()]
        if len(failed):
            text += "; failed: " + ", ".join(failed.added)
        return text + "."

    def own_stack_numbers(self) -> dict:
        """Exercise ``09.own_stack``'s numbers: each training stage's peak-memory ratio alone, rounded."""
        base = self.alone.iloc[0].peak_memory_bytes
        ratios = {stage.key: row.peak_memory_bytes / base for stage, (_, row) in
                  zip(self.stages, self.alone.iloc[1:].iterrows(), strict=True)}
        missing = [key for key in OWN_STACK if key not in ratios or math.isnan(ratios[key])]
        if missing:
            raise ConfigError("recipe", [s.key for s in self.stages], f"the training stages {list(OWN_STACK)}, each "
                              f"run (missing or failed: {missing})")
        return {name: round(float(ratios[key]), 3) for key, name in OWN_STACK.items()}

    def stacked_memory_ratio(self) -> float:
        """The given-order stack's peak memory after its last training stage, as a ratio to the baseline's."""
        last = max(i for i, stage in enumerate(self.stages, start=1) if not stage.inference)
        return float(self.given.peak_memory_bytes.iloc[last] / self.given.peak_memory_bytes.iloc[0])


def staged(base: RunConfig | None = None, path: str | Path = RECIPE_PATH, refresh: bool = False,
           progress: bool = True) -> Recipe:
    """Stack the recipe's stages in the given order, run each alone, and stack them in the measured order (cached)."""
    base = workload() if base is None else base
    stages = recipe_stages(path, base)
    given = stage_rows(stacked_configs(base, stages), GIVEN, refresh, progress)
    alone = stage_rows([("baseline", base), *((s.label(), base.replace(**s.changes)) for s in stages)], ALONE, refresh,
                       progress)
    order = measured_order(stages, alone)
    measured = stage_rows(stacked_configs(base, order), MEASURED, refresh, progress)
    frame = stage_table(pd.concat([given, measured], ignore_index=True))
    return Recipe(frame, base=base, stages=stages, order=order, given=given, alone=alone, measured=measured)

"""Sections 1-3 of notebook 09: a staged recipe applied one stage at a time, and the order its measurements suggest.

The recipe is a YAML `RunConfig` whose keys are the stages in order (`RECIPE_PATH`: a staged recipe that follows
notebooks 01-08: a larger batch with its learning rate scaled and warmed up, no checkpointing where memory is not
the limit). `staged` applies the stages on top of each other in the file's order (the given
order), runs each stage alone on the baseline, and stacks them again in the order those alone-runs suggest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ... import config, measure, results, train
from ...config import RunConfig
from ...configfile import load_config, parse_yaml
from ...env import Profile, profile
from ...errors import ConfigError
from ...measure import separated
from ...messages import worded

RECIPE_PATH = Path(__file__).resolve().parents[2] / "assets" / "recipes" / "staged_recipe.yaml"
# Fields that belong to the stage of another field (LoRA's rank carries its targets, quantize its kept layers).
# A learning rate goes with a larger batch (scaled, warmed up) or else with LoRA (its larger step): the first of
# the owners the file has.
STAGE_OF = {"lora_targets": "lora_rank", "lora_alpha": "lora_rank", "lora_dropout": "lora_rank",
            "quantize_keep_float": "quantize", "prune_structured": "prune_amount",
            "lr": ("batch_size", "lora_rank"), "lr_warmup_steps": "batch_size"}
STAGE_NAMES = {"packing": "packing", "batch_size": "larger batch", "precision": "mixed precision",
               "checkpointing": "checkpointing", "optimizer": "8-bit optimizer", "freeze": "freezing",
               "lora_rank": "LoRA", "grad_accum": "accumulation", "quantize": "quantization",
               "prune_amount": "pruning", "channels_last": "channels_last"}
INFERENCE_FIELDS = ("quantize", "prune_amount")  # stages that act on the trained model: they stay last
ORDER_METRICS = ("peak_memory_bytes", "epoch_time_s")  # what the measured order ranks each stage alone by
MIN_EPOCHS = 2  # one epoch of ci's 512 images is 2 steps at batch 256: fewer than the untimed ones
GIVEN, ALONE, MEASURED = "given order", "each alone", "measured order"
STAGE_COLUMNS = ("order", "stage", "added", "epoch_time_s", "epoch_time_p10_s", "epoch_time_p90_s",
                 "peak_memory_bytes", "accuracy", "model_size_bytes", "precision_used", "error")


def workload(prof: Profile | None = None) -> RunConfig:
    """The recipe's baseline: the profile's pretrained workload, trained for whole epochs.

    Args:
        prof: the profile. Its step budget at its batch size gives the epochs, so that a larger batch sees the same
            data in fewer steps; at least `MIN_EPOCHS`, so that the recipe's batch of 256 still takes a few timed
            steps on `ci`'s 512 images.

    Example:
        >>> workload(labkit.profile("ci")).epochs
        2
    """
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
    """The stages of a recipe file, in the file's order, checked as a `RunConfig` first (an unknown key is an error).

    Args:
        path: the YAML file. Each key is one stage, with the keys that belong to it (`STAGE_OF`).
        base: the config the stages apply to, on which the file is checked (None: the file alone; a language
            model's recipe needs its model).

    Example:
        >>> [s.key for s in recipe_stages()]
        ['batch_size', 'precision', 'optimizer', 'freeze', 'quantize']
    """
    path = Path(path)
    if base is None:
        loaded = load_config(path)
        keys = list(parse_yaml(path.read_text(), path.name) or {})
    else:
        values = parse_yaml(path.read_text(), path.name) or {}
        keys = list(values)
        loaded = RunConfig.from_dict({**base.to_dict(), **values}, source=path.name)
    stages: dict[str, dict] = {}
    for key in keys:
        stages.setdefault(_owner(key, keys), {})[key] = getattr(loaded, key)
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
    """The runs of ``configs`` (cached), one row per stage: ``order``, ``stage``, ``added``, the runs' columns, the
    epoch time with its spread, and the deployed model's accuracy and size."""
    done = results.run_configs([cfg for _, cfg in configs], refresh=refresh, progress=progress)
    frame = results.to_frame(done)
    frame.insert(0, "order", order)
    frame.insert(1, "stage", range(len(configs)))
    frame.insert(2, "added", [label for label, _ in configs])
    train_size = len(train.run_splits(configs[0][1])["train"])
    frame["epoch_time_s"] = train_size / frame.throughput
    # the timed steps' spread, scaled to an epoch: how far this run's own epoch time could be off
    frame["epoch_time_p10_s"] = frame.epoch_time_s * frame.step_time_p10_s / frame.step_time_s
    frame["epoch_time_p90_s"] = frame.epoch_time_s * frame.step_time_p90_s / frame.step_time_s
    frame["deployed_accuracy"] = frame.inference_accuracy.fillna(frame.accuracy)
    frame["deployed_size_bytes"] = frame.inference_size_bytes.fillna(frame.model_size_bytes)
    return frame


@dataclass
class Recipe:
    """`staged`'s runs.

    Attributes:
        base: the baseline config. stages: the stages in the file's order. order: the measured order.
        given, alone, measured: one frame each (``order``, ``stage``, ``added``, the run's columns, ``epoch_time_s``
            and its p10/p90, ``deployed_accuracy``, ``deployed_size_bytes``): the stages stacked in the given order,
            each alone on the baseline, stacked in the measured order.
    """

    base: RunConfig
    stages: list[Stage]
    order: list[Stage]
    given: pd.DataFrame
    alone: pd.DataFrame
    measured: pd.DataFrame

    @property
    def frame(self) -> pd.DataFrame:
        return pd.concat([self.given, self.measured], ignore_index=True)


def changes_nothing(stage: Stage, row: pd.Series, base: pd.Series) -> bool:
    """Whether ``stage`` ran the same computation as the baseline here.

    Args:
        stage: the stage. row, base: its alone-run and the baseline's. A precision that resolved to the baseline's
            (``auto`` is fp32 where bf16 would be emulated) changes nothing: its ratios are noise, not an effect.
    """
    return set(stage.changes) == {"precision"} and "precision_used" in row and \
        row.precision_used == base.precision_used


def measured_order(stages: list[Stage], alone: pd.DataFrame) -> list[Stage]:
    """The stages ranked by what each bought alone: peak-memory ratio x epoch-time ratio, smallest first.

    Args:
        stages: the recipe's stages. alone: their alone-runs, the baseline first. A stage that changes nothing here
            (`changes_nothing`) or whose run failed goes after the others; stages that act on the trained model
            (quantization, pruning) stay last.
    """
    base = alone.iloc[0]
    score = {}
    for stage, (_, row) in zip(stages, alone.iloc[1:].iterrows(), strict=True):
        ratios = [row[m] / base[m] for m in ORDER_METRICS]
        failed = not pd.isna(row.error) or any(map(math.isnan, ratios))
        score[id(stage)] = (failed, changes_nothing(stage, row, base), math.inf if failed else math.prod(ratios))
    return sorted(stages, key=lambda s: (s.inference, *score[id(s)]))


def staged(base: RunConfig | None = None, path: str | Path = RECIPE_PATH, refresh: bool = False,
           progress: bool = True) -> Recipe:
    """Stack the recipe's stages in the given order, run each alone, and stack them in the measured order (cached).

    Args:
        base: the baseline (default: `workload`). path: the recipe file. refresh: run again. progress: show bars.

    Example:
        >>> rec = staged(); stage_table(rec)
    """
    base = workload() if base is None else base
    stages = recipe_stages(path, base)
    given = stage_rows(stacked_configs(base, stages), GIVEN, refresh, progress)
    alone = stage_rows([("baseline", base), *((s.label(), base.replace(**s.changes)) for s in stages)], ALONE, refresh,
                  progress)
    order = measured_order(stages, alone)
    measured = stage_rows(stacked_configs(base, order), MEASURED, refresh, progress)
    return Recipe(base, stages, order, given, alone, measured)


def stage_table(rec: Recipe, which: str = "stacked") -> pd.DataFrame:
    """The stages' `STAGE_COLUMNS`, ``accuracy`` and ``model_size_bytes`` those of the deployed model.

    Args:
        rec: `staged`'s. which: ``stacked`` (the given order, then the measured one) or ``alone``.
    """
    if which not in ("stacked", "alone"):
        raise ConfigError("which", which, "'stacked' (both orders) or 'alone' (each stage on the baseline)")
    frame = rec.frame if which == "stacked" else rec.alone
    frame = frame.drop(columns=["accuracy", "model_size_bytes"])
    frame = frame.rename(columns={"deployed_accuracy": "accuracy", "deployed_size_bytes": "model_size_bytes"})
    return frame[list(STAGE_COLUMNS)].reset_index(drop=True)


def stage_chart_frame(rec: Recipe) -> pd.DataFrame:
    """One row per stage of both orders, for `labkit.plots.lines` with ``x="stage"`` and ``hue="order"``."""
    return stage_table(rec, "stacked")


def _order(new: pd.Series, old: pd.Series) -> int | None:
    """-1 faster, 1 slower beyond both runs' own spread of epoch times, 0 within it, None: no spread measured."""
    return separated((new.epoch_time_p10_s, new.epoch_time_p90_s), (old.epoch_time_p10_s, old.epoch_time_p90_s))


def _faster(new: pd.Series, old: pd.Series) -> bool:
    return _order(new, old) == -1


def _slower(new: pd.Series, old: pd.Series) -> bool:
    return _order(new, old) == 1


def _name(row: pd.Series) -> str:
    """The stage's name without its settings: "larger batch (batch_size=256)" -> "larger batch"."""
    return row.added.split(" (")[0]


@worded
def recipe_finding(rec: Recipe) -> str:
    """One line: what the whole recipe did, which stage saved the most, which bought nothing where it stands.

    Args:
        rec: `staged`'s. Time differences count only outside the runs' spread, accuracy outside the test noise.
    """
    given = rec.given
    base, last = given.iloc[0], given.iloc[-1]
    noise = measure.accuracy_noise(base.deployed_accuracy, len(train.run_splits(rec.base)["test"]))
    change = last.deployed_accuracy - base.deployed_accuracy
    accuracy = "within the test noise" if abs(change) <= noise else "beyond the test noise"
    text = (f"The whole recipe: epoch time {last.epoch_time_s / base.epoch_time_s:.2f}x, peak memory "
            f"{last.peak_memory_bytes / base.peak_memory_bytes:.2f}x, deployed size "
            f"{last.deployed_size_bytes / base.deployed_size_bytes:.2f}x the baseline's, accuracy "
            f"{base.deployed_accuracy:.1%} -> {last.deployed_accuracy:.1%} ({accuracy}, ±{noise:.1%})")
    pairs = [(given.iloc[i], given.iloc[i - 1]) for i in range(1, len(given))
             if pd.isna(given.error.iloc[i]) and pd.isna(given.error.iloc[i - 1])]
    memory = min(pairs, key=lambda p: p[0].peak_memory_bytes / p[1].peak_memory_bytes, default=None)
    if memory is not None and memory[0].peak_memory_bytes < memory[1].peak_memory_bytes:
        text += f"; the most memory saved by {_name(memory[0])}"
    time = min(pairs, key=lambda p: p[0].epoch_time_s / p[1].epoch_time_s, default=None)
    if time is not None and _faster(*time):
        text += f", the most time by {_name(time[0])}"
    idle = [_name(new) for new, old in pairs if not _faster(new, old) and new.peak_memory_bytes >= old.peak_memory_bytes
            and new.deployed_size_bytes >= old.deployed_size_bytes]
    slower = [_name(new) for new, old in pairs if _slower(new, old)]
    if idle:
        text += f"; bought nothing where it stands: {', '.join(idle)}"
    if slower:
        text += f"; slower beyond the runs' spread: {', '.join(slower)}"
    failed = given[given.error.notna()]
    if len(failed):
        text += "; failed: " + ", ".join(failed.added)
    return text + "."


@worded
def order_finding(rec: Recipe) -> str:
    """One line: the measured order, whether it is the given one, and which stage changes nothing here.

    Args:
        rec: `staged`'s.
    """
    base = rec.alone.iloc[0]
    idle = [stage.name for stage, (_, row) in zip(rec.stages, rec.alone.iloc[1:].iterrows(), strict=True)
            if changes_nothing(stage, row, base)]
    same = [s.key for s in rec.stages] == [s.key for s in rec.order]
    text = "Measured order: " + " > ".join(s.name for s in rec.order)
    text += " (the given order)" if same else " (not the given order)"
    if idle:
        text += f"; {', '.join(idle)} resolved to the baseline's {base.precision_used} here, so it changes nothing"
    return text + "."


OWN_STACK = {"batch_size": "batch", "precision": "amp", "optimizer": "opt8", "freeze": "freeze"}


def own_stack_numbers(rec: Recipe) -> dict:
    """Exercise ``09.own_stack``'s numbers: each training stage's peak-memory ratio alone, rounded as printed.

    Args:
        rec: `staged`'s, on a recipe with the four training stages of `OWN_STACK` (the shipped recipe's).
    """
    base = rec.alone.iloc[0].peak_memory_bytes
    ratios = {stage.key: row.peak_memory_bytes / base for stage, (_, row) in
              zip(rec.stages, rec.alone.iloc[1:].iterrows(), strict=True)}
    missing = [key for key in OWN_STACK if key not in ratios or math.isnan(ratios[key])]
    if missing:
        raise ConfigError("recipe", [s.key for s in rec.stages], f"the training stages {list(OWN_STACK)}, each run "
                          f"(missing or failed: {missing})")
    return {name: round(float(ratios[key]), 3) for key, name in OWN_STACK.items()}


def stacked_memory_ratio(rec: Recipe) -> float:
    """The given-order stack's peak memory after its last training stage, as a ratio to the baseline's."""
    training = [i for i, stage in enumerate(rec.stages, start=1) if not stage.inference]
    return float(rec.given.peak_memory_bytes.iloc[training[-1]] / rec.given.peak_memory_bytes.iloc[0])

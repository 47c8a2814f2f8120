"""Section 5 of notebook 04: "accuracy rose after pruning", repeated over random seeds, with its spread."""

from __future__ import annotations

import copy
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from ... import data
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...runsetup import run_splits
from ...techniques import pruning
from ...validate import is_int
from .common import fine_tuned, points

# Random seeds of the repeated fine-tunes. Two give a spread, the least a check needs (`ci`); three to read it.
REPEAT_SEEDS = {"ci": (0, 1), "quick": (0, 1, 2), "full": (0, 1, 2)}
RISE_AMOUNTS = (0.2, 0.4, 0.6, 0.8)


def _predictions(model: nn.Module, cfg: RunConfig) -> torch.Tensor:
    """Whether each test image is classified right (a bool per image)."""
    split = run_splits(cfg, training=False)["test"]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    right = []
    with torch.no_grad():
        for images, labels in data.make_loader(split, batch_size=256, shuffle=False):
            x = data.to_model_input(images, split, device, cfg.channels_last, cfg.image_size)
            right.append(model(x).argmax(dim=1).cpu() == labels)
    model.train(was_training)
    return torch.cat(right)


@dataclass
class Repeats(LabResult):
    """Per amount, the change in test accuracy over seeds (``frame``); ``runs``: one row per seed and amount."""

    shown = ("amount", "accuracy_change", "rose", "seeds", "gained", "lost")
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    test_size: int | None = None  # the test split's size (None: the profile's)

    @classmethod
    def of(cls, runs: pd.DataFrame, test_size: int | None = None) -> Repeats:
        rows = [{"amount": amount, "accuracy_change": statistics.mean(group.delta),
                 "change_std": statistics.stdev(group.delta) if len(group) > 1 else 0.0,
                 "rose": int((group.delta > 0).sum()), "seeds": len(group),
                 "gained": int(group.gained.sum()), "lost": int(group.lost.sum())}
                for amount, group in runs.groupby("amount")]
        return cls(pd.DataFrame(rows), runs=runs, test_size=test_size)

    @worded
    def finding(self) -> str:
        best = self.frame.loc[self.frame.accuracy_change.idxmax()]
        at_best = self.runs[self.runs.amount == best.amount]
        # Real only beyond both noises: each seed's own change (paired, against nothing) and the test split's.
        seeds = compare(list(at_best.delta), Measured.exact_value(0.0), words=("fell", "rose"))
        size = self.test_size or profile().test_size
        test = compare(Measured.accuracy(at_best.test_accuracy.mean(), size),
                       Measured.accuracy(at_best.unpruned_accuracy.mean(), size), words=("lower", "higher"))
        verdict = ("possibly real, worth more seeds." if seeds.direction == 1 and test.direction == 1 else
                   "no rise beyond chance.")
        return (f"Over {self.runs.seed.nunique()} seeds x {len(self.frame)} amounts, accuracy rose in "
                f"{int((self.runs.delta > 0).sum())} of {len(self.runs)} cases; the best mean change, "
                f"{points(best.accuracy_change, sign=True, digits=2)} at {best.amount:.0%}: over the seeds' spread "
                f"{seeds.verdict}, against the test split's noise {test.verdict}: {verdict}")


def repeats(cfg: RunConfig, seeds: Iterable[int] | None = None, amounts: Iterable[float] = RISE_AMOUNTS,
            scope: str = "global") -> Repeats:
    """Fine-tune once per random seed (default: the profile's `REPEAT_SEEDS`), prune each at every amount, and
    compare with that seed's unpruned model; ``gained``/``lost``: test images it now gets right/wrong."""
    seeds = list(REPEAT_SEEDS[profile().name] if seeds is None else seeds)
    if len(set(seeds)) < 2 or not all(is_int(s) and s >= 0 for s in seeds):
        raise ConfigError("seeds", seeds, "at least two different seeds (integers >= 0): a spread needs repeats")
    amounts = [pruning.check_amount(a, "amounts") for a in amounts]  # before any fine-tune runs
    rows = []
    for seed in seeds:
        model, _ = fine_tuned(cfg.replace(seed=seed))
        right = _predictions(model, cfg)
        for amount in amounts:
            now = _predictions(pruning.l1_unstructured(copy.deepcopy(model), amount, scope=scope), cfg)
            rows.append({"seed": seed, "amount": amount, "test_accuracy": float(now.float().mean()),
                         "unpruned_accuracy": float(right.float().mean()),
                         "delta": float(now.float().mean() - right.float().mean()),
                         "gained": int((now & ~right).sum()), "lost": int((~now & right).sum())})
    return Repeats.of(pd.DataFrame(rows), test_size=len(run_splits(cfg, training=False)["test"]))

"""Section 5 of notebook 04: "accuracy rose after pruning", repeated over random seeds, with its spread."""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Iterable

import pandas as pd
import torch
from torch import nn

from ... import data, measure
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...messages import worded
from ...techniques import pruning
from ...validate import is_int
from .common import _splits, fine_tuned, points

# Random seeds of the repeated fine-tunes. Two give a spread, the least a check needs (`ci`); three to read it.
REPEAT_SEEDS = {"ci": (0, 1), "quick": (0, 1, 2), "full": (0, 1, 2)}
RISE_AMOUNTS = (0.2, 0.4, 0.6, 0.8)


def _predictions(model: nn.Module, cfg: RunConfig) -> torch.Tensor:
    """Whether each test image is classified right (a bool per image)."""
    split = _splits(cfg)["test"]
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


def repeats(cfg: RunConfig, seeds: Iterable[int] | None = None, amounts: Iterable[float] = RISE_AMOUNTS,
            scope: str = "global") -> pd.DataFrame:
    """Fine-tune once per random seed, prune each at every amount, and compare with that seed's unpruned model.

    Args:
        cfg: the fine-tune.
        seeds: its random seeds (default: the profile's `REPEAT_SEEDS`).
        amounts: shares of weights to prune.
        scope: ``global`` or ``layer``.

    Returns:
        Rows ``seed``, ``amount``, ``test_accuracy``, ``unpruned_accuracy``, ``delta`` (pruned - unpruned, same
        seed), ``gained`` / ``lost`` (test images the pruned model gets right / wrong that the unpruned one got
        wrong / right).
    """
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
    return pd.DataFrame(rows)


def rise_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per amount, the change in test accuracy over seeds: its mean, its spread, and the images gained and lost.

    Args:
        frame: `repeats`' rows.

    Returns:
        Rows ``amount``, ``accuracy_change`` (mean over seeds), ``change_std`` (standard deviation between
        seeds), ``rose`` (seeds where it rose), ``seeds``, ``gained``, ``lost`` (images, summed).
    """
    rows = []
    for amount, group in frame.groupby("amount"):
        deltas = list(group.delta)
        rows.append({"amount": amount, "accuracy_change": statistics.mean(deltas),
                     "change_std": statistics.stdev(deltas) if len(deltas) > 1 else 0.0,
                     "rose": int((group.delta > 0).sum()), "seeds": len(group),
                     "gained": int(group.gained.sum()), "lost": int(group.lost.sum())})
    return pd.DataFrame(rows)


@worded
def rise_finding(frame: pd.DataFrame) -> str:
    """One line from `repeats`' rows: does the best mean rise stand out from the spread between seeds?

    Args:
        frame: `repeats`' rows.
    """
    summary = rise_summary(frame)
    n = frame.seed.nunique()
    noise = measure.accuracy_noise(frame.unpruned_accuracy.mean(), profile().test_size)
    best = summary.loc[summary.accuracy_change.idxmax()]
    real = best.accuracy_change > 2 * best.change_std / math.sqrt(n) and best.accuracy_change > noise / 2
    text = (f"Over {n} seeds x {len(summary)} amounts, accuracy rose in {int((frame.delta > 0).sum())} of "
            f"{len(frame)} cases; the best mean change, {points(best.accuracy_change, sign=True, digits=2)} at "
            f"{best.amount:.0%}, ")
    if real:
        return text + (f"exceeds twice its standard error ({points(best.change_std, digits=2)} between seeds) and half "
                       f"the test noise ({points(noise)}): possibly real, worth more seeds.")
    return text + (f"does not stand out from the spread between seeds ({points(best.change_std, digits=2)}) and the "
                   f"test noise ({points(noise)}): chance.")

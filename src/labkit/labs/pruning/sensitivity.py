"""Section 3 of notebook 04: each layer pruned alone (on the validation split), and per-layer ratios chosen from it."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import pandas as pd
from torch import nn

from ... import measure
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...messages import worded
from ...techniques import pruning
from .common import accuracy, fine_tuned, points

SCAN_SPARSITIES = (0.3, 0.5, 0.7, 0.9)


def sensitivity_scan(cfg: RunConfig, sparsities: Iterable[float] = SCAN_SPARSITIES) -> pd.DataFrame:
    """Each prunable layer pruned alone at each sparsity; accuracy on the validation split (never the test split).

    Args:
        cfg: the fine-tune.
        sparsities: the shares of each layer's weights to prune.

    Returns:
        Rows ``layer``, ``params``, ``sparsity``, ``val_accuracy``, ``accuracy_drop`` (the unpruned model's
        validation accuracy minus this one's), ``base_val_accuracy``.
    """
    sparsities = [pruning.check_amount(s, "sparsities") for s in sparsities]
    if not sparsities:
        raise ConfigError("sparsities", sparsities, "a non-empty list of fractions in [0, 1)")
    model, _ = fine_tuned(cfg)
    base = accuracy(model, cfg, "val")
    rows = []
    for name, module in pruning.prunable_layers(model):
        for s in sparsities:
            pruned = copy.deepcopy(model)
            pruning.l1_unstructured(pruned, {name: s})
            acc = accuracy(pruned, cfg, "val")
            rows.append({"layer": name, "params": module.weight.numel(), "sparsity": s, "val_accuracy": acc,
                         "accuracy_drop": base - acc, "base_val_accuracy": base})
    return pd.DataFrame(rows)


def choose_ratios(scan: pd.DataFrame, max_drop: float = 0.02) -> dict:
    """Per layer, the highest scanned sparsity whose validation accuracy fell by at most ``max_drop`` (0 if none).

    Args:
        scan: `sensitivity_scan`'s rows.
        max_drop: the accuracy a layer may lose, e.g. 0.02 for 2 points.
    """
    if not 0 <= max_drop < 1:
        raise ConfigError("max_drop", max_drop, "an accuracy drop in [0, 1), e.g. 0.02 for 2 points")
    chosen = {}
    for layer, rows in scan.groupby("layer", sort=False):
        ok = rows[rows.accuracy_drop <= max_drop]
        chosen[layer] = float(ok.sparsity.max()) if len(ok) else 0.0
    return chosen


def overall_sparsity(model: nn.Module, ratios: dict) -> float:
    """The share of all prunable weights that per-layer ``ratios`` remove.

    Args:
        model: the model.
        ratios: layer -> share of its weights.
    """
    layers = dict(pruning.prunable_layers(model))
    total = sum(m.weight.numel() for m in layers.values())
    return sum(round(r * layers[n].weight.numel()) for n, r in ratios.items()) / total


def compare_ratios(cfg: RunConfig, ratios: dict) -> pd.DataFrame:
    """Per-layer ratios against one uniform ratio and global pruning that remove the same share of weights.

    Args:
        cfg: the fine-tune.
        ratios: layer -> share of its weights to prune (`choose_ratios`).

    Returns:
        Rows ``scheme`` (``unpruned``, ``per-layer (from the scan)``, ``uniform``, ``global``), ``sparsity``,
        ``val_accuracy``, ``test_accuracy``.
    """
    model, _ = fine_tuned(cfg)
    target = overall_sparsity(model, ratios)
    schemes = {"unpruned": lambda m: m, "per-layer (from the scan)": lambda m: pruning.l1_unstructured(m, ratios),
               "uniform": lambda m: pruning.l1_unstructured(m, target),
               "global": lambda m: pruning.l1_unstructured(m, target, scope="global")}
    rows = []
    for scheme, apply in schemes.items():
        pruned = apply(copy.deepcopy(model))
        rows.append({"scheme": scheme, "sparsity": pruning.sparsity(pruned).overall,
                     "val_accuracy": accuracy(pruned, cfg, "val"), "test_accuracy": accuracy(pruned, cfg, "test")})
    return pd.DataFrame(rows)


@worded
def ratios_line(ratios: dict) -> str:
    """The ratios chosen per layer, in one line: "Chosen per layer: stem.0 0%, ...".

    Args:
        ratios: layer -> share of its weights to prune (`choose_ratios`).
    """
    return "Chosen per layer: " + ", ".join(f"{layer} {r:.0%}" for layer, r in ratios.items()) + "."


@worded
def ratios_finding(compared: pd.DataFrame) -> str:
    """One line from `compare_ratios`' rows: did the scan's ratios beat one uniform ratio beyond the test noise?

    Args:
        compared: `compare_ratios`' rows.
    """
    by = compared.set_index("scheme")
    per, uni = by.loc["per-layer (from the scan)"], by.loc["uniform"]
    noise = measure.accuracy_noise(per.test_accuracy, profile().test_size)
    diff = per.test_accuracy - uni.test_accuracy
    text = (f"At {per.sparsity:.0%} of all weights: {per.test_accuracy:.1%} test accuracy with the scan's ratios, "
            f"{uni.test_accuracy:.1%} uniform, {by.loc['global'].test_accuracy:.1%} global "
            f"(unpruned {by.loc['unpruned'].test_accuracy:.1%}); ")
    if abs(diff) <= noise:
        return text + f"scan against uniform, {points(diff, sign=True)}, is within the test noise ({points(noise)})."
    winner = "the scan's ratios" if diff > 0 else "the uniform ratio"
    return text + f"{winner} won by {points(abs(diff))}, beyond the test noise ({points(noise)})."

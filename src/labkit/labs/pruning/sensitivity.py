"""Section 3 of notebook 04: each layer pruned alone (on the validation split), and per-layer ratios chosen from it."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
from torch import nn

from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...inference import accuracy
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques import pruning
from .common import fine_tuned

SCAN_SPARSITIES = (0.3, 0.5, 0.7, 0.9)


@dataclass
class Sensitivity(LabResult):
    """`sensitivity_scan`'s rows: each layer pruned alone at each sparsity, its validation accuracy."""

    shown = ("layer", "sparsity", "val_accuracy", "accuracy_drop")

    def ratios(self, max_drop: float = 0.02) -> dict:
        """Per layer, the highest scanned sparsity whose validation accuracy fell by at most ``max_drop`` (else 0)."""
        if not 0 <= max_drop < 1:
            raise ConfigError("max_drop", max_drop, "an accuracy drop in [0, 1), e.g. 0.02 for 2 points")
        ok = self.frame[self.frame.accuracy_drop <= max_drop].groupby("layer").sparsity.max()
        return {layer: float(ok.get(layer, 0.0)) for layer in self.frame.layer.unique()}


def sensitivity_scan(cfg: RunConfig, sparsities: Iterable[float] = SCAN_SPARSITIES) -> Sensitivity:
    """Each prunable layer pruned alone at each sparsity; accuracy on the validation split (never the test split)."""
    sparsities = [pruning.check_amount(s, "sparsities") for s in sparsities]
    if not sparsities:
        raise ConfigError("sparsities", sparsities, "a non-empty list of fractions in [0, 1)")
    model, _ = fine_tuned(cfg)
    base = accuracy(model, cfg, "val")
    rows = []
    for name, module in pruning.prunable_layers(model):
        for s in sparsities:
            acc = accuracy(pruning.l1_unstructured(copy.deepcopy(model), {name: s}), cfg, "val")
            rows.append({"layer": name, "params": module.weight.numel(), "sparsity": s, "val_accuracy": acc,
                         "accuracy_drop": base - acc, "base_val_accuracy": base})
    return Sensitivity(pd.DataFrame(rows))


def overall_sparsity(model: nn.Module, ratios: dict) -> float:
    """The share of all prunable weights that per-layer ``ratios`` remove."""
    layers = dict(pruning.prunable_layers(model))
    total = sum(m.weight.numel() for m in layers.values())
    return sum(round(r * layers[n].weight.numel()) for n, r in ratios.items()) / total


@dataclass
class Ratios(LabResult):
    """`compare_ratios`' rows: the scan's per-layer ratios, one uniform ratio and global pruning, same share."""

    shown = ("scheme", "sparsity", "val_accuracy", "test_accuracy")
    ratios: dict = field(default_factory=dict)
    test_size: int | None = None  # the test split's size (None: the profile's)

    @worded
    def finding(self) -> str:
        by = self.frame.set_index("scheme")
        per, uni = by.loc["per-layer (from the scan)"], by.loc["uniform"]
        c = compare(Measured.accuracy(per.test_accuracy, self.test_size or profile().test_size),
                    Measured.accuracy(uni.test_accuracy, self.test_size or profile().test_size))
        chosen = ", ".join(f"{layer} {r:.0%}" for layer, r in self.ratios.items())
        return (f"Chosen per layer: {chosen}. At {per.sparsity:.0%} of all weights: {per.test_accuracy:.1%} test "
                f"accuracy with the scan's ratios, {uni.test_accuracy:.1%} uniform, "
                f"{by.loc['global'].test_accuracy:.1%} global (unpruned {by.loc['unpruned'].test_accuracy:.1%}); "
                f"scan against uniform: {c.difference * 100:+.1f} points, {c.verdict}.")


def compare_ratios(cfg: RunConfig, ratios: dict) -> Ratios:
    """Per-layer ``ratios`` against one uniform ratio and global pruning that remove the same share of weights."""
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
    return Ratios(pd.DataFrame(rows), ratios=dict(ratios), test_size=profile().test_size)

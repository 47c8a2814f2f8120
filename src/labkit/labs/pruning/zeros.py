"""Section 1 of notebook 04: magnitude pruning stores its zeros densely, so only accuracy moves."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
from torch import nn

from ... import measure
from ...config import RunConfig
from ...errors import ConfigError
from ...inference import accuracy, example_batch
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques import pruning
from .common import fine_tuned, nonzero_params, timed

PUZZLE_AMOUNTS = (0.0, 0.2, 0.4, 0.6, 0.8)  # the range the popular claim quotes


@dataclass
class LayerSparsity(LabResult):
    shown = ("layer", "weights_params", "zeros_layer_scope_fraction", "zeros_global_scope_fraction")


def per_layer_sparsity(model: nn.Module, amount: float = 0.8) -> LayerSparsity:
    """Each prunable layer's share of zeros after layer-wise and after global pruning at ``amount`` (on copies)."""
    amount = pruning.check_amount(amount)
    scopes = {scope: pruning.sparsity(pruning.l1_unstructured(copy.deepcopy(model), amount, scope=scope))
              for scope in pruning.SCOPES}
    return LayerSparsity(pd.DataFrame([{"layer": name, "weights_params": m.weight.numel(),
                                        "zeros_layer_scope_fraction": scopes["layer"].per_layer[name],
                                        "zeros_global_scope_fraction": scopes["global"].per_layer[name]}
                                       for name, m in pruning.prunable_layers(model)]))


@dataclass
class Puzzle(LabResult):
    """`puzzle`'s rows, one per amount: what moved with the zeros and what did not."""

    shown = ("amount", "nonzero_params", "model_size_bytes", "size_with_masks_bytes", "inference_peak_bytes",
             "latency_s", "test_accuracy")

    @worded
    def finding(self) -> str:
        frame = self.frame.sort_values("amount")
        base, top = frame.iloc[0], frame.iloc[-1]
        latency = {row.amount: compare(Measured.row(row, "latency_s"), Measured.row(base, "latency_s"),
                                       ("faster", "slower")) for row in frame.iloc[1:].itertuples()}
        real = [f"{amount:.0%} {c}" for amount, c in latency.items() if c.real]
        verdicts = sorted({c.verdict for c in latency.values()})  # none real: within the noise, or no spread
        moved = f"; real at {', '.join(real)}" if real else (f", {' or '.join(verdicts)}" if verdicts else "")
        text = (f"At {top.sparsity:.0%} zeros the file is {top.size_ratio:.2f}x the dense one "
                f"({top.masks_size_ratio:.2f}x with the masks attached), the inference peak {top.peak_ratio:.2f}x; "
                f"latency {frame.latency_ratio.min():.2f}x-{frame.latency_ratio.max():.2f}x{moved}; "
                f"test accuracy {base.test_accuracy:.1%} -> {top.test_accuracy:.1%}")
        best = frame.loc[frame.test_accuracy.idxmax()]
        if best.amount > 0 and best.test_accuracy > base.test_accuracy:
            return text + f", highest at {best.amount:.0%} ({best.test_accuracy:.1%}): a rise, tested in section 5."
        return text + ", never above the unpruned model."


def puzzle(cfg: RunConfig, amounts: Iterable[float] = PUZZLE_AMOUNTS, scope: str = "global") -> Puzzle:
    """The fine-tuned model pruned by magnitude at each amount (0 added: the reference), measured in full."""
    amounts = [pruning.check_amount(a) for a in amounts]
    if not amounts:
        raise ConfigError("amounts", amounts, "a non-empty list of fractions in [0, 1)")
    amounts = amounts if 0.0 in amounts else [0.0, *amounts]
    model, _ = fine_tuned(cfg)
    x = example_batch(cfg)
    rows, pruned_models = [], []
    for amount in amounts:
        pruned = pruning.l1_unstructured(copy.deepcopy(model), amount, scope=scope, permanent=False)
        with_masks_bytes = measure.model_size_bytes(pruned)
        pruning.make_permanent(pruned)
        rows.append({
            "amount": amount, "sparsity": pruning.sparsity(pruned).overall, "nonzero_params": nonzero_params(pruned),
            "num_params": measure.count_parameters(pruned)[0],
            "model_size_bytes": measure.model_size_bytes(pruned), "size_with_masks_bytes": with_masks_bytes,
            "inference_peak_bytes": measure.inference_peak_bytes(pruned, x),
            "val_accuracy": accuracy(pruned, cfg, "val"), "test_accuracy": accuracy(pruned, cfg, "test"),
        })
        pruned_models.append(pruned)
    frame = pd.DataFrame(rows).assign(**timed(pruned_models, x, reference=amounts.index(0.0)))
    base = frame[frame.amount == 0].iloc[0]
    for column, name in (("model_size_bytes", "size_ratio"), ("inference_peak_bytes", "peak_ratio"),
                         ("latency_s", "latency_ratio")):
        frame[name] = frame[column] / base[column]
    frame["masks_size_ratio"] = frame.size_with_masks_bytes / base.model_size_bytes
    return Puzzle(frame)

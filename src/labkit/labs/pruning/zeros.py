"""Section 1 of notebook 04: magnitude pruning stores its zeros densely, so only accuracy moves."""

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
from .common import accuracy, example_batch, fine_tuned, latencies_with_band, nonzero_params

PUZZLE_AMOUNTS = (0.0, 0.2, 0.4, 0.6, 0.8)  # the range the popular claim quotes


def per_layer_sparsity(model: nn.Module, amount: float = 0.8) -> pd.DataFrame:
    """Each prunable layer's share of zeros after layer-wise and after global pruning at ``amount`` (on copies).

    Args:
        model: the model (left unpruned).
        amount: the share of weights pruned, overall.

    Returns:
        Rows ``layer``, ``weights_params`` (its weights), ``zeros_layer_scope_fraction``,
        ``zeros_global_scope_fraction``.
    """
    amount = pruning.check_amount(amount)
    scopes = {scope: pruning.sparsity(pruning.l1_unstructured(copy.deepcopy(model), amount, scope=scope))
              for scope in pruning.SCOPES}
    return pd.DataFrame([{"layer": name, "weights_params": m.weight.numel(),
                          "zeros_layer_scope_fraction": scopes["layer"].per_layer[name],
                          "zeros_global_scope_fraction": scopes["global"].per_layer[name]}
                         for name, m in pruning.prunable_layers(model)])


def puzzle(cfg: RunConfig, amounts: Iterable[float] = PUZZLE_AMOUNTS, scope: str = "global") -> pd.DataFrame:
    """The fine-tuned model pruned by magnitude at each amount: what moved and what did not.

    Args:
        cfg: the fine-tune.
        amounts: shares of weights to prune (0 is added: the reference).
        scope: ``global`` (one threshold) or ``layer``.

    Returns:
        Rows per amount: ``sparsity``, ``nonzero_params``, ``model_size_bytes`` (after ``prune.remove``),
        ``size_with_masks_bytes``, ``inference_peak_bytes`` (batch 64), ``latency_s`` (median, timed in turns),
        ``val_accuracy``, ``test_accuracy``; ratios to the unpruned row (``size_ratio``, ``peak_ratio``,
        ``latency_ratio``, ``masks_size_ratio``); ``latency_p10_ratio`` / ``latency_p90_ratio``: the noise band
        of a latency ratio (`latencies_with_band`).
    """
    amounts = [pruning.check_amount(a) for a in amounts]
    if not amounts:
        raise ConfigError("amounts", amounts, "a non-empty list of fractions in [0, 1)")
    if 0.0 not in amounts:
        amounts = [0.0, *amounts]  # the reference every ratio is relative to
    model, _ = fine_tuned(cfg)
    prof = profile()
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
    frame = pd.DataFrame(rows)
    frame["latency_s"], band = latencies_with_band(pruned_models, x, prof, reference=amounts.index(0.0))
    frame["latency_p10_ratio"], frame["latency_p90_ratio"] = band
    base = frame[frame.amount == 0].iloc[0]
    for column, name in (("model_size_bytes", "size_ratio"), ("inference_peak_bytes", "peak_ratio"),
                         ("latency_s", "latency_ratio")):
        frame[name] = frame[column] / base[column]
    frame["masks_size_ratio"] = frame.size_with_masks_bytes / base.model_size_bytes
    return frame


@worded
def puzzle_finding(frame: pd.DataFrame) -> str:
    """One line from `puzzle`'s frame: did size, memory and latency move with the zeros, and did accuracy rise?

    Args:
        frame: `puzzle`'s rows.
    """
    base = frame[frame.amount == 0].iloc[0]
    top = frame.sort_values("amount").iloc[-1]
    low, high = frame.latency_ratio.min(), frame.latency_ratio.max()
    band = f"{base.latency_p10_ratio:.2f}x-{base.latency_p90_ratio:.2f}x"
    if base.latency_p10_ratio <= low and high <= base.latency_p90_ratio:
        latency = f"within the dense model's timing noise ({band}): unchanged"
    else:
        latency = f"partly outside the dense model's timing noise ({band}): see below"
    text = (f"At {top.sparsity:.0%} zeros the file is {top.size_ratio:.2f}x the dense one ({top.masks_size_ratio:.2f}x "
            f"with the masks attached), the inference peak {top.peak_ratio:.2f}x; latency {low:.2f}x-{high:.2f}x, "
            f"{latency}; test accuracy {base.test_accuracy:.1%} -> {top.test_accuracy:.1%}")
    best = frame.loc[frame.test_accuracy.idxmax()]
    if best.amount > 0 and best.test_accuracy > base.test_accuracy:
        return text + f", highest at {best.amount:.0%} ({best.test_accuracy:.1%}): a rise, tested in section 5."
    return text + ", never above the unpruned model."

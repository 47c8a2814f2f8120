"""Notebook 05's check cells hold on a GPU too (rounding, non-deterministic kernels) and still catch real failures."""

import json
from pathlib import Path

import pandas as pd
import pytest

import labkit
from labkit.labs.freezing.caching import FeatureCaching
from labkit.techniques import freezing

ROOT = Path(__file__).resolve().parents[2]


def cell_with(marker: str) -> str:
    nb = json.loads((ROOT / "notebooks" / "05_freezing.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if c["cell_type"] == "code" and marker in "".join(c["source"])]
    return "".join(cell["source"])


def caching(weight_diff, accuracies, speedup_times=(1.0, 0.1)):
    frame = pd.DataFrame({"method": ["through the network", "cached features"], "epoch_time_s": list(speedup_times),
                          "accuracy": accuracies})
    return FeatureCaching(frame, extract_s=0.5, cache_bytes=1, head_weight_diff=weight_diff, epochs=3)


def test_the_caching_check_allows_gpu_rounding_but_not_another_training():
    check = cell_with("the cache trains the same head")
    setup = {"labkit": labkit, "P": labkit.profile("full")}
    exec(check, {**setup, "caching": caching(2e-4, [0.9112, 0.9104])})  # a few of 5,000 images, kernels' rounding
    with pytest.raises(AssertionError):
        exec(check, {**setup, "caching": caching(0.2, [0.91, 0.91])})
    with pytest.raises(AssertionError):
        exec(check, {**setup, "caching": caching(1e-6, [0.91, 0.80])})
    with pytest.raises(AssertionError):  # the cache must make an epoch faster
        exec(check, {**setup, "caching": caching(1e-6, [0.91, 0.91], speedup_times=(1.0, 2.0))})


def sweep_frame(**changes):
    levels = list(freezing.LEVELS)
    frame = pd.DataFrame({
        "level": levels, "error": None, "num_trainable_params": [100, 99, 90, 70, 1],
        "mem_optimizer_state_bytes": [800, 792, 720, 560, 8], "mem_gradients_bytes": [400, 396, 360, 280, 4],
        "saved_activation_bytes": [50, 40, 20, 10, 1], "backward_flops": [30, 25, 15, 8, 1],
        "predicted_backward_flops": [30, 25, 15, 8, 1], "state_ratio": [1, 0.99, 0.9, 0.7, 0.01]})
    for column, values in changes.items():
        frame[column] = values
    return frame


def test_the_sweep_check_catches_a_miscounted_backward_pass_and_optimizer_state():
    check = cell_with("its backward pass is exactly the layer-by-layer count")
    exec(check, {"sweep": sweep_frame(), "freezing": freezing})
    with pytest.raises(AssertionError, match="the backward pass, layer by layer"):
        exec(check, {"sweep": sweep_frame(predicted_backward_flops=[30, 25, 15, 8, 2]), "freezing": freezing})
    with pytest.raises(AssertionError):  # head-only kept more than 10 % of the optimizer state
        exec(check, {"sweep": sweep_frame(state_ratio=[1, 0.99, 0.9, 0.7, 0.2]), "freezing": freezing})

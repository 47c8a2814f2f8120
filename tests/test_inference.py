"""labkit.inference: a model's device even when it has no parameters, latencies in turns, split accuracy."""

import pytest
import torch
from torch import nn

from labkit import inference
from labkit.errors import ConfigError


def test_model_device_falls_back_to_the_cpu_for_a_model_without_tensors():
    assert inference.model_device(nn.Linear(2, 2)).type == "cpu"
    assert inference.model_device(nn.ReLU()).type == "cpu"
    norm = nn.BatchNorm1d(3, affine=False)  # buffers only
    assert inference.model_device(norm).type == "cpu"


def test_latencies_time_each_model_and_keep_their_order():
    slow, fast = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]), nn.Linear(256, 256)
    x = torch.randn(64, 256)
    times = inference.latencies([slow, fast], x)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert times[0] > times[1]  # 8 layers against 1: a ratio far beyond timing noise


def test_latencies_give_every_model_each_place_in_the_rounds(monkeypatch):
    calls = []

    def fake(model, x, warmup, repeats):
        calls.append(model)
        return type("L", (), {"times_s": [0.001] * repeats})()

    monkeypatch.setattr(inference.measure, "measure_latency", fake)
    a, b, c = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
    inference.latencies([a, b, c], torch.randn(1, 2))
    timed = calls[3:]  # after one untimed warm-up call each
    rounds = [timed[i:i + 3] for i in range(0, len(timed), 3)]
    assert len(rounds) == inference.LATENCY_ROUNDS and rounds[0] == [a, b, c] and rounds[1] == [c, b, a]
    assert sum(r[0] is a for r in rounds) == sum(r[0] is c for r in rounds)


def test_accuracy_refuses_the_training_split(tiny_cfg):
    with pytest.raises(ConfigError, match=r"split='train' is not allowed"):
        inference.accuracy(nn.Linear(2, 2), tiny_cfg, "train")

"""labkit.capacity: the bytes-per-parameter calculator, one measured step, the memory model and the largest batch."""


import pandas as pd
import pytest

import labkit
from labkit import capacity
from labkit.errors import ConfigError
from labkit.result import MEMORY_CATEGORIES


@pytest.mark.parametrize("kwargs, expected", [
    ({}, (4000, 4000, 8000, 0)),  # fp32 + AdamW: 16 bytes per parameter
    ({"precision": "fp16"}, (2000, 2000, 8000, 4000)),  # mixed with master weights: ZeRO's 2 + 2 + 12
    ({"precision": "bf16", "master_weights": False}, (2000, 2000, 4000, 0)),  # pure bf16: bf16 moments
    ({"optimizer": "sgd"}, (4000, 4000, 4000, 0)),
    ({"optimizer": "sgd", "momentum": False}, (4000, 4000, 0, 0)),
    ({"optimizer": "adamw8bit"}, (4000, 4000, 2000 + 8 * 4 + 2048, 0)),  # 4 blocks of 256, 2 KiB of maps
    ({"optimizer": "paged_adamw8bit", "tensor_sizes": [100, 900], "min_8bit_size": 500},
     (4000, 4000, 800 + 1800 + 8 * 4 + 2048, 0)),  # the 100-element tensor keeps fp32 moments
    ({"optimizer": "adamw8bit", "tensor_sizes": [10, 990], "min_8bit_size": 4096}, (4000, 4000, 8000, 0)),
    ({"trainable_params": 250}, (4000, 1000, 2000, 0)),
    ({"precision": "bf16", "trainable_params": 250}, (2000, 500, 2000, 1000)),
])
def test_training_memory_counts_bytes_per_parameter(kwargs, expected):
    out = capacity.training_memory(1000, **kwargs)
    assert (out["weights"], out["gradients"], out["optimizer_state"], out["master_weights"]) == expected
    assert out["total"] == sum(expected)


def test_training_memory_for_7b_and_175b():
    assert capacity.training_memory(7e9)["total"] == 112e9
    assert capacity.training_memory(7e9, "bf16")["total"] == 112e9  # the same 16 bytes, split differently
    assert capacity.training_memory(175e9)["optimizer_state"] == 1.4e12
    assert capacity.training_memory(175e9, optimizer="adamw8bit")["optimizer_state"] == 355_468_752_048


@pytest.mark.parametrize("kwargs, match", [
    ({"num_params": 0}, r"num_params=0 is not allowed: a number of parameters > 0"),
    ({"precision": "auto"}, r"precision='auto' is not allowed: one of \['fp32', 'fp16', 'bf16'\] \(the dtype of the "
                            r"stored weights\). torch.autocast keeps fp32 weights"),
    ({"optimizer": "lion"}, r"optimizer='lion' is not allowed: one of \['adamw', 'sgd', 'adamw8bit', "
                            r"'paged_adamw8bit'\]"),
    ({"master_weights": True}, r"master_weights=True is not allowed: None or False with precision='fp32'. fp32 "
                               r"weights are their own master copy"),
    ({"master_weights": "yes"}, r"master_weights='yes' is not allowed: None \(the default for the precision\)"),
    ({"trainable_params": 2000}, r"trainable_params=2000 is not allowed: None or a number from 0 to num_params=1000"),
    ({"optimizer": "adamw8bit", "tensor_sizes": [10, 20]},
     r"tensor_sizes='2 sizes summing to 30' is not allowed: element counts .* summing to 1000"),
    ({"min_8bit_size": -1}, r"min_8bit_size=-1 is not allowed: an integer >= 0"),
    ({"momentum": False}, r"momentum=False is not allowed: True \(the default\) unless optimizer='sgd'. adamw has no "
                          r"momentum setting"),
])
def test_training_memory_rejects_bad_input(kwargs, match):
    kwargs = {"num_params": 1000, **kwargs}
    with pytest.raises(ConfigError, match=match):
        capacity.training_memory(**kwargs)


def test_find_max_batch_size_with_a_budget_is_exact(tiny_cfg):
    budget = 20 * 2**20
    search = capacity.batch_search(tiny_cfg, budget_bytes=budget)
    best = search.best
    assert labkit.find_max_batch_size(tiny_cfg, budget_bytes=budget) == best
    peaks = {p.batch_size: p.peak_bytes for p in search.tried}
    assert peaks[best] <= budget < peaks[best + 1]
    assert 30 < best < 60 and search.tried[0] == (32, True, peaks[32])  # starts at cfg.batch_size
    # A fresh measurement agrees: the answer fits and one more sample does not.
    assert capacity.step_memory(tiny_cfg, best).peak_bytes == peaks[best]
    assert capacity.step_memory(tiny_cfg, best + 1).peak_bytes > budget
    assert search.budget_bytes == budget and search.device == "cpu" and search.elapsed_s > 0
    assert search.limit == 65536 and search.limit_reason == "labkit's default limit, 65,536 samples"


def test_search_with_grad_accum_tries_multiples_only(tiny_cfg):
    cfg = tiny_cfg.replace(grad_accum=4)
    search = capacity.batch_search(cfg, budget_bytes=12 * 2**20, limit=1000)
    assert all(p.batch_size % 4 == 0 for p in search.tried) and search.best % 4 == 0
    peaks = {p.batch_size: p.peak_bytes for p in search.tried}
    assert peaks[search.best] <= 12 * 2**20 < peaks[search.best + 4]
    assert search.limit == 1000 and search.limit_reason == "the limit asked for"  # a multiple of 4


def test_the_probe_counts_its_largest_activation_on_the_run_device(tiny_cfg):
    from labkit.capacity.steps import _StepProbe

    probe = _StepProbe(tiny_cfg)
    images, _ = probe._inputs(1)
    assert probe.activation_elements_per_sample() >= images[0].numel()  # at least what the stem takes in


@pytest.mark.parametrize("machine, limit", [("t4", 2674), ("h200", 2674), ("cpu_bf16", 65536), ("cpu_avx2", 65536)])
def test_search_limit_follows_the_machine(machine, limit):
    """On CUDA a search stops where the largest activation reaches 2**31 elements; CPU kernels index with 64 bits."""
    from labkit.capacity.search import default_limit

    with labkit.machine.described(machine):
        device = labkit.machine.here().device
        found, reason = default_limit(device, 64 * 112 * 112)  # a ResNet-18 at 224 x 224: its first convolution
    assert found == limit
    assert ("32-bit indexing" in reason) == (device == "cuda")
    assert default_limit("cuda", 10)[0] == 65536  # a small activation: the default binds first
    with pytest.raises(ConfigError, match="elements_per_sample=None"):
        default_limit("cuda", None)


def test_the_step_measured_for_the_search_is_the_step_fit_measures(tiny_cfg):
    res = labkit.fit(tiny_cfg.replace(evaluate=False))
    mem = capacity.step_memory(tiny_cfg, tiny_cfg.batch_size)
    assert mem.peak_bytes == res.peak_memory_bytes == mem.total_bytes
    assert set(mem.by_category) == set(MEMORY_CATEGORIES)


def test_budget_below_the_models_own_memory(tiny_cfg):
    with pytest.raises(ConfigError, match=r"budget_bytes=1048576 is not allowed: at least the model's own "
                                          r"4731764 bytes \(4\.5 MiB\): parameters 1185792 \+ gradients 1181960 \+ "
                                          r"adamw state 2364012"):
        labkit.find_max_batch_size(tiny_cfg, budget_bytes=2**20)


def test_computed_model_memory_matches_the_measured_step(tiny_cfg):
    # At 2 samples the peak is inside optimizer.step(): parameters, gradients and state are all alive.
    mem = capacity.step_memory(tiny_cfg, 2)
    model = labkit.models.build("small_cnn", 10)[0]
    state = capacity.state_bytes(model, tiny_cfg)
    assert {k: mem.by_category[k] for k in ("parameters", "gradients", "optimizer_state")} == {
        k: state[k] for k in ("parameters", "gradients", "optimizer_state")}
    sgd = capacity.state_bytes(model, tiny_cfg.replace(optimizer="sgd", momentum=0.0))
    assert sgd["optimizer_state"] == 0 and sgd["total"] == state["parameters"] + state["gradients"]


def test_budget_too_small_for_the_smallest_batch(tiny_cfg):
    with pytest.raises(ConfigError, match=r"budget_bytes=5000000 is not allowed: enough for the smallest batch: "
                                          r"2 samples \(small_cnn has BatchNorm.*\) need \d+ bytes"):
        labkit.find_max_batch_size(tiny_cfg, budget_bytes=5_000_000)


def test_cpu_needs_a_budget(tiny_cfg):
    with pytest.raises(ConfigError, match=r"budget_bytes=None is not allowed: a number of bytes when training on "
                                          r"a CPU. A CPU has no device memory limit to find.*256 \* 2\*\*20"):
        labkit.find_max_batch_size(tiny_cfg)
    with pytest.raises(ConfigError, match=r"budget_bytes=-5 is not allowed"):
        labkit.find_max_batch_size(tiny_cfg, budget_bytes=-5)
    with pytest.raises(ConfigError, match=r"start=30 is not allowed: a positive multiple of grad_accum=4"):
        capacity.batch_search(tiny_cfg.replace(grad_accum=4), budget_bytes=2**30, start=30)


def test_memory_model_predicts_a_size_it_did_not_measure(tiny_cfg):
    model = capacity.memory_model(tiny_cfg)
    assert model.note is None and 256 not in model.batch_sizes[:-1] and 384 not in model.batch_sizes
    measured = capacity.step_memory(tiny_cfg, 384).peak_bytes
    predicted = labkit.estimate_memory(tiny_cfg, 384)
    assert predicted == model.predict(384)
    assert set(predicted) == {*MEMORY_CATEGORIES, "total"} and predicted["total"] == sum(
        predicted[k] for k in MEMORY_CATEGORIES)
    assert predicted["total"] == pytest.approx(measured, rel=0.02)
    # fixed + per-sample line: activations are what grows
    per_sample = model.bytes_per_sample
    assert per_sample["parameters"] == 0 and per_sample["activations"] > 0.9 * per_sample["total"]
    assert model.fixed_bytes["total"] + 384 * per_sample["total"] == pytest.approx(predicted["total"], abs=2)
    frame = model.to_frame()
    assert frame.batch_size.tolist() == model.batch_sizes and frame.total.iloc[0] > 0


def test_memory_model_from_two_given_sizes(tiny_cfg):
    model = capacity.memory_model(tiny_cfg, batch_sizes=(128, 64))
    assert model.batch_sizes == [64, 128]
    assert model.predict(192)["total"] == pytest.approx(capacity.step_memory(tiny_cfg, 192).peak_bytes, rel=0.02)
    with pytest.raises(ConfigError, match=r"batch_sizes=\[64, 64\] is not allowed: at least two different"):
        capacity.memory_model(tiny_cfg, batch_sizes=[64, 64])
    with pytest.raises(ConfigError, match=r"batch_size=1 is not allowed: a multiple of grad_accum=1, at least 2 "
                                          r"\(small_cnn has BatchNorm"):
        capacity.memory_model(tiny_cfg, batch_sizes=[1, 64])
    with pytest.raises(ConfigError, match=r"batch_size=30 is not allowed: a multiple of grad_accum=4"):
        capacity.MemoryModel([8, 16], [{}, {}], {}, {}, grad_accum=4, min_batch_size=8).predict(30)


def test_fit_linear_memory():
    fixed, per_sample, r2 = capacity.fit_linear_memory([16, 32, 64], [1000 + 16 * 50, 1000 + 32 * 50, 1000 + 64 * 50])
    assert (fixed, per_sample, r2) == (pytest.approx(1000), pytest.approx(50), pytest.approx(1.0))
    line = capacity.fit_linear_memory(pd.Series([8, 16, 999]), pd.Series([180.0, 340.0, None]))  # a failed run
    assert line.bytes_per_sample == pytest.approx(20) and line.fixed_bytes == pytest.approx(20)
    noisy = capacity.fit_linear_memory([1, 2, 3, 4], [10, 22, 29, 41])
    assert 0.95 < noisy.r2 < 1.0
    with pytest.raises(ConfigError, match=r"batch_sizes=\[8.0, 8.0\] is not allowed: at least two different"):
        capacity.fit_linear_memory([8, 8], [1, 2])
    with pytest.raises(ConfigError, match=r"peak_bytes='1 values' is not allowed: one per batch size"):
        capacity.fit_linear_memory([8, 16], [1])


def test_state_bytes_counts_8bit_optimizer_state_as_measured(tiny_cfg):
    cfg = tiny_cfg.replace(optimizer="adamw8bit")
    model, _ = labkit.models.build(cfg.model, 10)
    eight_bit, adamw = capacity.state_bytes(model, cfg), capacity.state_bytes(model, tiny_cfg)
    assert eight_bit["optimizer_state"] < adamw["optimizer_state"] / 3  # ~2 B vs 8 B per parameter
    measured = capacity.step_memory(cfg, 8).breakdown.peak_by_category["optimizer_state"]
    assert eight_bit["optimizer_state"] == measured

"""labkit.labs.pruning: notebook 04's experiments measure what they say, on a tiny seeded fine-tune."""

import pandas as pd
import pytest
import torch

from labkit import measure, results
from labkit.errors import ConfigError
from labkit.labs import pruning as lab
from labkit.labs.pruning import channels
from labkit.labs.pruning.common import latencies
from labkit.labs.pruning.rise import REPEAT_SEEDS, Repeats
from labkit.labs.pruning.sensitivity import overall_sparsity
from labkit.labs.pruning.zeros import Puzzle
from labkit.runsetup import run_splits
from labkit.techniques import pruning


@pytest.fixture
def cfg(tiny_cfg):
    return tiny_cfg


def test_the_fine_tuned_model_comes_back_from_the_cache_without_training(cfg, monkeypatch):
    model, result = lab.fine_tuned(cfg)
    monkeypatch.setattr(results, "fit", lambda *a, **k: pytest.fail("trained again"))
    again, cached = lab.fine_tuned(cfg)
    assert again is not model and cached.accuracy == result.accuracy
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert lab.accuracy(again, cfg, "test") == pytest.approx(result.accuracy)


def test_a_model_from_the_cache_is_frozen_as_the_run_was(cfg):
    frozen_cfg = cfg.replace(freeze="heavy")
    trained, _ = results.cached_model(frozen_cfg)
    again, _ = results.cached_model(frozen_cfg)
    assert again is not trained
    assert [p.requires_grad for p in again.parameters()] == [p.requires_grad for p in trained.parameters()]
    assert not all(p.requires_grad for p in again.parameters())


def test_a_cache_without_weights_trains_again(cfg):
    lab.fine_tuned(cfg)
    key = results.cache_key(cfg, results.env_report(cfg.device))
    (results.results_dir() / f"{key}.pt").unlink()  # as if interrupted between the two files
    model, _ = lab.fine_tuned(cfg)
    assert (results.results_dir() / f"{key}.pt").exists() and model is not None


def test_the_puzzle_zeros_change_neither_size_nor_memory(cfg):
    frame = lab.puzzle(cfg, amounts=(0.5,))
    assert list(frame.amount) == [0.0, 0.5]  # the unpruned reference is added
    assert frame.model_size_bytes.nunique() == 1 and frame.inference_peak_bytes.nunique() == 1
    assert (frame.size_with_masks_bytes > 1.8 * frame.model_size_bytes).all()
    assert frame.sparsity.iloc[1] == pytest.approx(0.5, abs=0.01)
    assert frame.nonzero_params.iloc[1] < 0.55 * frame.nonzero_params.iloc[0]
    assert (frame.latency_p10_s <= frame.latency_s).all() and (frame.latency_p90_s >= frame.latency_s).all()
    text = frame.finding()
    assert text.startswith("At 50% zeros the file is 1.00x the dense one (")
    assert f"({frame.masks_size_ratio.iloc[1]:.2f}x with the masks attached)" in text
    assert "latency " in text and "\n" not in str.__str__(text) and "inference peak" in repr(frame)


def _puzzle(latency_ratios, band=(0.9, 1.1), accuracies=(0.80, 0.82, 0.70)):
    latency = pd.Series(latency_ratios) * 0.01
    return Puzzle(pd.DataFrame({"amount": [0.0, 0.4, 0.8], "sparsity": [0.0, 0.4, 0.8], "size_ratio": 1.0,
                                "masks_size_ratio": [2.0] * 3, "peak_ratio": 1.0, "latency_ratio": latency_ratios,
                                "latency_s": latency, "latency_p10_s": latency * band[0],
                                "latency_p90_s": latency * band[1], "test_accuracy": accuracies}))


@pytest.mark.parametrize("latency_ratios, accuracies, verdict", [
    ([1.0, 0.97, 1.05], (0.80, 0.82, 0.70), "latency 0.97x-1.05x, within the noise; "
                                            "test accuracy 80.0% -> 70.0%, highest at 40% (82.0%)"),
    ([1.0, 1.30, 1.02], (0.80, 0.78, 0.70), "latency 1.00x-1.30x; real at 40% 1.3x (slower); test accuracy"),
    ([1.0, 1.0, 1.0], (0.80, 0.78, 0.70), "never above the unpruned model."),
])
def test_the_puzzle_finding_calls_a_latency_change_real_only_outside_the_measured_spread(latency_ratios, accuracies,
                                                                                         verdict):
    assert verdict in _puzzle(latency_ratios, accuracies=accuracies).finding()


def test_accuracy_is_measured_on_validation_or_test_only(cfg):
    model, _ = lab.fine_tuned(cfg)
    assert 0 <= lab.accuracy(model, cfg, "val") <= 1
    with pytest.raises(ConfigError, match=r"split='train' is not allowed: 'val' \(for choosing\)"):
        lab.accuracy(model, cfg, "train")


def test_sparse_storage_pays_only_at_high_sparsity(cfg):
    frame = lab.sparse_storage(cfg, sparsities=(0.0, 0.5, 0.95))
    assert frame.layer.iloc[0] == "block3.1.0" and frame.weight_shape.iloc[0] == "128x128x3x3"
    assert frame.coo_bytes.iloc[0] > 8 * frame.dense_bytes.iloc[0] > 8 * frame.coo_bytes.iloc[2]
    assert frame.break_even("coo_bytes") == pytest.approx(0.95, abs=0.01)
    assert frame.break_even("csr_bytes") == pytest.approx(0.95, abs=0.01)  # 50 % is not enough for CSR either
    assert frame.predicted()["coo_predicted"] == pytest.approx(8 / 9)
    assert len(frame.long("bytes")) == 9 and len(frame.long("time")) == 6
    assert (frame.csr_matmul_p10_s <= frame.csr_matmul_s).all()
    text = frame.finding()
    assert text.startswith("block3.1.0 (128x128x3x3): COO took fewer bytes than dense from 95% zeros (predicted 89%)")
    assert "; the CSR matmul " in text and "at 95% " in text
    with pytest.raises(ConfigError, match=r"what='speed' is not allowed"):
        frame.long("speed")


def test_semi_structured_says_why_it_cannot_time_on_a_cpu(cfg):
    record = lab.semi_structured(cfg)
    assert record.speedup is None and "CUDA GPU of compute capability 8.0+" in record.reason
    assert "stem.0" not in record.layers and 0.3 < record.sparsity <= 0.5
    assert "Speed not measured" in str(record) and str(record) == str(record.finding())


def test_the_sensitivity_scan_prunes_one_layer_at_a_time_on_the_validation_split(cfg):
    model, _ = lab.fine_tuned(cfg)
    scan = lab.sensitivity_scan(cfg, sparsities=(0.5, 0.9))
    layers = [name for name, _ in pruning.prunable_layers(model)]
    assert list(scan.layer.unique()) == layers and len(scan) == 2 * len(layers)
    assert (scan.base_val_accuracy == lab.accuracy(model, cfg, "val")).all()
    assert scan.accuracy_drop.equals(scan.base_val_accuracy - scan.val_accuracy)
    assert scan.ratios(max_drop=0.99) == dict.fromkeys(layers, 0.9)
    strict = scan.ratios(max_drop=0.0)
    for layer, chosen in strict.items():
        rows = scan[(scan.layer == layer) & (scan.accuracy_drop <= 0)]
        assert chosen == (rows.sparsity.max() if len(rows) else 0.0)
    with pytest.raises(ConfigError, match=r"max_drop=2 is not allowed"):
        scan.ratios(max_drop=2)


def test_compared_schemes_remove_the_same_share_of_weights(cfg):
    model, _ = lab.fine_tuned(cfg)
    ratios = {"block3.1.0": 0.9, "block3.0.0": 0.5}
    result = lab.compare_ratios(cfg, ratios)
    compared = result.set_index("scheme")
    target = overall_sparsity(model, ratios)
    assert compared.sparsity["unpruned"] == 0
    for scheme in ("per-layer (from the scan)", "uniform", "global"):
        assert compared.sparsity[scheme] == pytest.approx(target, abs=0.005), scheme
    text = result.finding()
    assert text.startswith("Chosen per layer: block3.1.0 90%, block3.0.0 50%. "
                           f"At {compared.sparsity['uniform']:.0%} of all weights: ")
    assert text.endswith(("within the noise.", "lower.", "higher."))


def test_structured_pruning_shrinks_the_model_and_recovery_trains_it(cfg, monkeypatch):
    trained = []
    recover = channels.recover

    def spy(model, run_cfg, steps, **kwargs):
        before = [p.detach().clone() for p in model.parameters()]
        result = recover(model, run_cfg, steps, **kwargs)
        moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        trained.append((steps, result.steps, moved))
        return result

    monkeypatch.setattr(channels, "recover", spy)
    frame = lab.structured(cfg, amount=0.5, recovery_steps=5)
    by = frame.set_index("model")
    assert list(frame.model) == ["dense", "pruned", "pruned + BN re-estimated", "pruned + recovery"]
    assert by.num_params_ratio["pruned"] < 1 / 1.9 and by.flops_ratio["pruned"] < 0.5
    assert by.num_params["pruned"] == by.num_params["pruned + recovery"]
    assert trained == [(5, 5, True)]  # the pruned model itself was fine-tuned for 5 steps
    assert (frame.cpu_latency_s == frame.latency_s).all()  # on a CPU run the two are one measurement
    text = frame.finding()
    assert f"{by.num_params['dense'] / by.num_params['pruned']:.1f}x fewer parameters" in text
    assert "after 5 recovery steps test accuracy is" in text and "x (" in text.split("latency ")[1]


def test_the_own_flops_numbers_pick_the_conv_that_shrank_most(cfg):
    model, _ = lab.fine_tuned(cfg)
    x = lab.example_batch(cfg, 4)
    slim = pruning.prune_channels(model, 0.5, x[:2])
    mine = lab.own_flops(model, slim, x)
    numbers = mine.numbers
    assert numbers["in_after"] * 2 == numbers["in_before"] and numbers["out_after"] * 2 == numbers["out_before"]
    measured = channels.layer_flops(slim, numbers["layer"], x) / channels.layer_flops(model, numbers["layer"], x)
    assert measured == pytest.approx(0.25) == mine.frame.flops_ratio.iloc[0]
    assert "0.250x the FLOPs" in mine.finding()
    with pytest.raises(ConfigError, match=r"layer='head.2' is not allowed: a conv"):
        lab.own_flops(model, slim, x, "head.2")


def test_repeats_count_the_images_gained_and_lost(cfg):
    result = lab.repeats(cfg, seeds=(0, 1), amounts=(0.3, 0.8))
    frame, summary = result.runs, result.frame
    assert len(frame) == 4 and set(frame.seed) == {0, 1}
    test_size = len(run_splits(cfg, training=False)["test"])
    assert ((frame.gained - frame.lost) / test_size - frame.delta).abs().max() < 1e-9
    assert list(summary.seeds) == [2, 2] and summary.accuracy_change.tolist() == pytest.approx(
        frame.groupby("amount").delta.mean().tolist())
    assert result.finding().startswith("Over 2 seeds x 2 amounts, accuracy rose in ")
    with pytest.raises(ConfigError, match=r"seeds=\[0\] is not allowed: at least two different seeds"):
        lab.repeats(cfg, seeds=(0,))
    with pytest.raises(ConfigError, match=r"seeds=\[3, 3\] is not allowed: at least two different seeds"):
        lab.repeats(cfg, seeds=(3, 3))
    with pytest.raises(ConfigError, match=r"amounts=1.5 is not allowed: a fraction in \[0, 1\)"):
        lab.repeats(cfg, seeds=(5, 6), amounts=(1.5,))  # refused before seeds 5 and 6 are fine-tuned
    assert len(REPEAT_SEEDS["ci"]) == 2 and all(len(set(s)) >= 2 for s in REPEAT_SEEDS.values())


def _repeats(deltas_by_seed, unpruned=(0.80, 0.81, 0.79)):
    return Repeats.of(pd.DataFrame([{"seed": seed, "amount": 0.2, "delta": d, "unpruned_accuracy": u,
                                     "test_accuracy": u + d, "gained": 1, "lost": 0}
                                    for seed, (d, u) in enumerate(zip(deltas_by_seed, unpruned, strict=True))]),
                      test_size=1000)


def test_the_rise_finding_calls_a_rise_real_only_beyond_the_seeds_and_the_test_noise():
    mixed = _repeats([0.004, -0.004, 0.008]).finding()
    assert "over the seeds' spread within the noise" in mixed and mixed.endswith("no rise beyond chance.")
    # a steady rise of 6 points on every seed, beyond 1,000 test images' noise (about 3.6 points at 80 %)
    assert _repeats([0.06, 0.061, 0.059]).finding().endswith("rose, against the test split's noise higher: possibly "
                                                             "real, worth more seeds.")
    # every seed rose, but by half a point: within the test split's noise
    small = _repeats([0.005, 0.006, 0.004], unpruned=(0.800, 0.801, 0.799)).finding()
    assert "spread rose, against the test split's noise within the noise: no rise beyond chance." in small
    # seeds far apart in accuracy, each up by a point or so: paired, the rise is steady but small
    assert _repeats([0.01, 0.012, 0.011], unpruned=(0.80, 0.86, 0.83)).finding().endswith("no rise beyond chance.")
    assert "(no spread measured)" not in _repeats([0.06, 0.06, 0.06]).finding()
    assert "over the seeds' spread no spread measured" in _repeats([0.06, 0.06, 0.06]).finding()


@pytest.mark.parametrize("method", lab.METHODS)
def test_a_panel_run_measures_the_pruned_model(cfg, method):
    run = lab.panel_run(cfg, method=method, amount=0.5, recovery_steps=4)
    row = run.to_row()
    assert row["method"] == method and row["params_removed"] > 0.45 and row["seed"] == cfg.seed
    if method == "structured":
        assert run.sparsity < 0.01 and run.num_params < run.dense_params / 1.9
    else:
        assert run.sparsity == pytest.approx(0.5, abs=0.01) and run.num_params == run.dense_params
    assert f"{method} at 50%, 4 recovery steps" in str(run)


def test_panel_inputs_are_checked_and_the_estimate_reads_the_cache(cfg):
    other = cfg.replace(seed=7)
    assert lab.panel_estimate(other) is None  # not fine-tuned yet
    with pytest.raises(ConfigError, match=r"method='channels' is not allowed"):
        lab.panel_run(cfg, method="channels")
    with pytest.raises(ConfigError, match=r"recovery_steps=2 is not allowed: 0 or more than 3"):
        lab.panel_run(cfg, recovery_steps=2)
    with pytest.raises(ConfigError, match=r"amount=1.0 is not allowed"):
        lab.panel_run(cfg, amount=1.0)
    lab.fine_tuned(other)
    assert lab.panel_estimate(other).startswith("Estimated time: a few seconds")


def test_latencies_time_models_in_turns_and_a_slimmer_model_is_faster(cfg):
    model, _ = lab.fine_tuned(cfg)
    x = lab.example_batch(cfg)
    slim = pruning.prune_channels(model, 0.75, x[:2])
    dense_s, slim_s = latencies([model, slim], x)
    assert slim_s < dense_s  # 16x fewer multiply-adds in the middle layers: far beyond timing noise
    assert measure.inference_peak_bytes(slim, x) < measure.inference_peak_bytes(model, x)


def test_per_layer_sparsity_is_even_layer_wise_and_uneven_globally(cfg):
    model, _ = lab.fine_tuned(cfg)
    frame = lab.per_layer_sparsity(model, 0.8)
    assert list(frame.layer) == [name for name, _ in pruning.prunable_layers(model)]
    assert frame.zeros_layer_scope_fraction.round(2).eq(0.8).all()
    assert frame.zeros_global_scope_fraction.max() - frame.zeros_global_scope_fraction.min() > 0.1
    overall = (frame.zeros_global_scope_fraction * frame.weights_params).sum() / frame.weights_params.sum()
    assert overall == pytest.approx(0.8, abs=1e-4)

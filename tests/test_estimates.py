"""labkit.estimates: how long a run will take, scaled from runs finished on this machine."""

import dataclasses

import pytest

import labkit
from labkit import estimates, results


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "results_dir", lambda: tmp_path)
    monkeypatch.setattr(estimates, "results_dir", lambda: tmp_path)
    return tmp_path


def test_no_similar_run_no_estimate_and_a_cached_run_is_instant(tiny_cfg, empty_cache):
    assert estimates.estimate_run(tiny_cfg) is None
    results.cached_fit(tiny_cfg, progress=False)
    estimate = estimates.estimate_run(tiny_cfg)
    assert estimate.cached and estimate.seconds == 0 and str(estimate) == "Cached: Run shows it at once."
    assert estimates.estimate_run(tiny_cfg.replace(precision="bf16")) is None  # another cost per sample


def test_an_estimate_scales_the_closest_cached_run_by_the_samples_to_process(tiny_cfg, empty_cache):
    res = results.cached_fit(tiny_cfg.replace(evaluate=False), progress=False)
    per_sample_s = res.train_time_s / (res.steps * tiny_cfg.batch_size)
    larger = tiny_cfg.replace(batch_size=64, max_steps=12, evaluate=False)
    estimate = estimates.estimate_run(larger)
    assert not estimate.cached
    assert estimate.seconds == pytest.approx(per_sample_s * 12 * 64)
    assert str(estimate).startswith("Estimated time: about ")
    assert estimate.basis == "from a cached fp32 run at batch 32 on this machine"
    evaluated = estimates.estimate_run(larger.replace(evaluate=True))
    test_size = labkit.profile().test_size
    assert evaluated.seconds == pytest.approx(estimate.seconds + per_sample_s / 3 * test_size)


def test_an_emulated_basis_predicts_the_same_cut(tiny_cfg, empty_cache, monkeypatch):
    from labkit.techniques import precision

    monkeypatch.setattr(precision, "cpu_fp16_native", lambda: False)
    monkeypatch.setitem(labkit.env.PROFILES, "ci", dataclasses.replace(labkit.env.PROFILES["ci"], emulated_steps=4))
    cfg = tiny_cfg.replace(precision="fp16", batch_size=8, max_steps=8, evaluate=False)  # fp16: emulated on most CPUs
    res = results.cached_fit(cfg, progress=False)
    assert res.planned_steps == 8
    estimate = estimates.estimate_run(cfg.replace(max_steps=100))
    assert estimate.seconds == pytest.approx(res.train_time_s)  # 4 steps again, not 100


def test_a_basis_must_cost_the_same_per_sample_and_cached_can_be_refused(tiny_cfg, empty_cache):
    results.cached_fit(tiny_cfg, progress=False)
    assert estimates.estimate_run(tiny_cfg.replace(image_size=64)) is None  # 4x the pixels: no basis
    assert estimates.estimate_run(tiny_cfg.replace(grad_accum=2)) is None
    again = estimates.estimate_run(tiny_cfg, cached=False)  # e.g. a panel whose lr rule changes the config
    assert not again.cached and again.seconds > 0


def test_a_lora_run_scales_a_lora_run_on_the_same_targets_whatever_its_rank(empty_cache):
    base = labkit.RunConfig(model="tiny_vit", batch_size=16, max_steps=4, train_size=64, device="cpu", evaluate=False)
    results.cached_fit(base, progress=False)  # full fine-tuning: no basis for LoRA
    assert estimates.estimate_run(base.replace(lora_rank=8, lora_targets=["qkv"])) is None
    results.cached_fit(base.replace(lora_rank=2, lora_targets=("qkv",)), progress=False)
    for targets in ("qkv", ["qkv"], ("qkv",)):  # one name, a YAML list, a tuple: the same layers
        assert estimates.estimate_run(base.replace(lora_rank=9, lora_targets=targets)) is not None
    assert estimates.estimate_run(base.replace(lora_rank=9, lora_targets="all-linear")) is None


def test_format_seconds():
    assert estimates.format_seconds(42.4) == "42 s" and estimates.format_seconds(210) == "3.5 min"


def test_the_panel_shows_the_estimate_and_updates_it(tiny_cfg, empty_cache):
    from labkit.widgets import ExperimentPanel

    results.cached_fit(tiny_cfg, progress=False)
    panel = ExperimentPanel(results.cached_fit, {"batch_size": [32, 64]}, base=tiny_cfg, show=lambda r: None)
    assert panel.estimate_line.value == "<i>Cached: Run shows it at once.</i>"
    panel.controls["batch_size"].value = 64
    assert panel.estimate_line.value.startswith("<i>Estimated time: about ")
    panel.controls["batch_size"].value = 32
    other = ExperimentPanel(results.cached_fit, {"precision": ["fp32", "bf16"]}, base=tiny_cfg, show=lambda r: None)
    other.controls["precision"].value = "bf16"  # nothing like it has run here
    assert other.estimate_line.value == ("<i>No time estimate yet: "
                                         "no run like this one has finished on this machine.</i>")
    quiet = ExperimentPanel(results.cached_fit, {"batch_size": [32, 64]}, base=tiny_cfg, estimate=None)
    assert quiet.estimate_line.value == ""

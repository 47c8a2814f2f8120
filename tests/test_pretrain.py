import json

import pytest

import labkit
from labkit import models
from labkit.bench import run_bench
from labkit.errors import ConfigError
from labkit.pretrain import pretrain


def test_pretrain_writes_a_verified_checkpoint_that_fit_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CHECKPOINT_DIR", str(tmp_path))
    info = pretrain("small_cnn", steps=5)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["small_cnn"]["sha256"] and info["source_dataset"] == "shapes_source" and info["steps"] == 5
    res = labkit.fit(labkit.RunConfig(max_steps=5, train_size=64, batch_size=32, evaluate=False))
    assert res.weights == "labkit:small_cnn.pt" and res.warnings == []


def test_pretrain_refuses_models_too_big_to_ship():
    with pytest.raises(labkit.errors.ConfigError, match=r"model='resnet50' is not allowed: one of"):
        pretrain("resnet50")


def test_committed_checkpoint_transfers_to_the_fine_tuning_task():
    """The shipped small_cnn checkpoint (trained on shapes_source) must beat a random start on shapes10."""
    models.load_checkpoint("small_cnn")  # sha256 matches the manifest
    cfg = labkit.config.baseline(labkit.profile("ci"))
    pretrained, scratch = labkit.fit(cfg), labkit.fit(cfg.replace(pretrained=False))
    assert pretrained.weights == "labkit:small_cnn.pt" and scratch.weights == "random"
    assert pretrained.accuracy > scratch.accuracy + 0.2


def test_bench_writes_a_labelled_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "quick")  # the caller's profile must neither leak in nor change
    (path,) = run_bench(out_dir=tmp_path, profile_name="ci", experiments=["00_start_here"])
    payload = json.loads(path.read_text())
    assert path.name.startswith("00_start_here-baseline-cpu-") and payload["profile"] == "ci"
    assert labkit.profile().name == "quick"
    assert payload["versions"]["torch"] and payload["runs"][0]["config"]["model"] == "small_cnn"
    assert payload["extras"]["timing_pitfalls"]["warm_median_s"] > 0


def test_bench_parts_for_notebooks_01_and_02_load_back(tmp_path, monkeypatch, tiny_cfg):
    from labkit import results

    cfg = tiny_cfg.replace(max_steps=8)
    paths = run_bench(out_dir=tmp_path, profile_name="ci",
                      experiments=["01_mixed_precision", "02_batch_size", "03_memory_savers"], cfg=cfg)
    parts = sorted(p.name.split("-cpu-")[0] for p in paths)
    assert parts == sorted(["01_mixed_precision-compare", "01_mixed_precision-memory", "01_mixed_precision-layouts",
                            "01_mixed_precision-scaler", "02_batch_size-sweep", "02_batch_size-accumulation",
                            "02_batch_size-search", "02_batch_size-prediction", "03_memory_savers-tradeoff",
                            "03_memory_savers-staged", "03_memory_savers-optimizers"])
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    compare = labkit.load_reference("01_mixed_precision-compare*")
    assert len(compare) == 4 and compare.source.str.startswith("reference: CPU").all()
    sweep = labkit.load_reference("02_batch_size-sweep*")
    assert {"epoch_time_s", "inference_time_s", "lr_setting"} <= set(sweep.columns)  # rows kept as they were
    search = json.loads(next(p for p in paths if "-search-" in p.name).read_text())["extras"]
    assert search["best"] > 0 and search["budget_bytes"] == 64 * 2**20 and search["tried"][0]["fits"] in (True, False)
    staged = labkit.load_reference("03_memory_savers-staged*")
    assert list(staged.stage) == ["baseline", "+AMP", "+checkpointing", "+8-bit optimizer", "all together"]
    with pytest.raises(ConfigError, match="experiments=\\['03_nope'\\] is not allowed"):
        run_bench(out_dir=tmp_path, experiments=["03_nope"])


def test_committed_tiny_vit_checkpoint_transfers_to_the_fine_tuning_task():
    """The shipped tiny_vit checkpoint (notebook 06's Linear-heavy model) must beat a random start on shapes10."""
    models.load_checkpoint("tiny_vit")  # sha256 matches the manifest
    cfg = labkit.config.baseline(labkit.profile("ci"), model="tiny_vit")
    pretrained, scratch = labkit.fit(cfg), labkit.fit(cfg.replace(pretrained=False))
    assert pretrained.weights == "labkit:tiny_vit.pt" and scratch.weights == "random"
    assert pretrained.accuracy > scratch.accuracy + 0.2

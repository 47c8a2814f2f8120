import json

import pytest

import labkit
from labkit import models
from labkit.bench import run_bench
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
    path = run_bench(out_dir=tmp_path, profile_name="ci")
    payload = json.loads(path.read_text())
    assert path.name.startswith("cpu-") and payload["profile"] == "ci"
    assert labkit.profile().name == "quick"
    assert payload["versions"]["torch"] and payload["runs"][0]["config"]["model"] == "small_cnn"
    assert payload["extras"]["timing_pitfalls"]["warm_median_s"] > 0

import dataclasses
import json

import pytest

import labkit
from labkit import env, models
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


def test_committed_tiny_vit_checkpoint_transfers_to_the_fine_tuning_task():
    """The shipped tiny_vit checkpoint (notebook 06's Linear-heavy model) must beat a random start on shapes10."""
    models.load_checkpoint("tiny_vit")  # sha256 matches the manifest
    cfg = labkit.config.baseline(labkit.profile("ci"), model="tiny_vit")
    pretrained, scratch = labkit.fit(cfg), labkit.fit(cfg.replace(pretrained=False))
    assert pretrained.weights == "labkit:tiny_vit.pt" and scratch.weights == "random"
    assert pretrained.accuracy > scratch.accuracy + 0.2


def test_pretrain_makes_the_language_models_checkpoint_on_its_source_task(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CHECKPOINT_DIR", str(tmp_path))
    info = pretrain("tiny_llama", steps=4)
    assert info["source_dataset"] == "digits_source" and info["steps"] == 4
    model, weights = models.build_language_model("tiny_llama", vocab_size=16)
    assert weights.source == "labkit:tiny_llama.pt" and model.lm_head.weight.shape == (16, 128)


def test_committed_tiny_llama_checkpoint_transfers_to_sorting(monkeypatch):
    """The shipped tiny_llama (trained to reverse digit strings) must beat a random start at sorting them. 80 steps
    (it first unlearns reversing: its first loss on sorting is far above a random start's); measured on a 2-core
    AVX2 machine: 24.6 % against 5.9 % exact match (120 steps: 52 % against 13 %; 60 steps: no gap yet), on 256 test
    strings: on ci's 128 the test-set noise (about 6 points either way) is as wide as the gap it checks."""
    monkeypatch.setitem(env.PROFILES, "ci", dataclasses.replace(env.PROFILES["ci"], test_size=256))
    cfg = labkit.RunConfig(model="tiny_llama", dataset="digits_sort", batch_size=32, lr=3e-3, lr_warmup_steps=10,
                           max_steps=80, train_size=4096, packing="pack", device="cpu")
    pretrained, scratch = labkit.fit(cfg, progress=False), labkit.fit(cfg.replace(pretrained=False), progress=False)
    assert pretrained.weights == "labkit:tiny_llama.pt" and scratch.weights == "random"
    assert pretrained.accuracy > scratch.accuracy + 0.1, (pretrained.accuracy, scratch.accuracy)

"""labkit.models: building, stages, weights sources and checkpoints (CPU, offline, no network)."""

import hashlib
import json
import re
import socket
import urllib.error
import warnings
from collections import Counter

import pytest
import torch
import torchvision
from torch import nn

from labkit import downloads, models
from labkit.errors import ChecksumError, ConfigError

PARAM_COUNTS = {"small_cnn": 295_490, "resnet18": 11_181_642, "resnet50": 23_528_522,
                "shufflenet_v2_x0_5": 352_042, "shufflenet_v2_x1_0": 1_263_854, "tiny_vit": 545_930}


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No test may reach the network, nor see (or write) the checkpoints shipped with the package."""
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    monkeypatch.setenv("LABKIT_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))

    def no_network(*args, **kwargs):
        raise OSError("network access is disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", no_network)


def test_available_names():
    assert models.available() == list(PARAM_COUNTS)


@pytest.mark.parametrize("name", list(PARAM_COUNTS))
def test_every_model_builds_and_maps_32px_images_to_class_logits(name):
    model, weights = models.build(name, num_classes=10, pretrained=False)
    assert weights == models.WeightsInfo("random", None)
    assert model.labkit_name == name
    assert sum(p.numel() for p in model.parameters()) == PARAM_COUNTS[name]
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name, stages", [
    ("small_cnn", ["stem", "block1", "block2", "block3", "head"]),
    ("tiny_vit", ["stem", "block1", "block2", "block3", "block4", "head"]),
    ("resnet18", ["stem", "layer1", "layer2", "layer3", "layer4", "head"]),
    ("resnet50", ["stem", "layer1", "layer2", "layer3", "layer4", "head"]),
    ("shufflenet_v2_x0_5", ["stem", "stage2", "stage3", "stage4", "conv5", "head"]),
    ("shufflenet_v2_x1_0", ["stem", "stage2", "stage3", "stage4", "conv5", "head"]),
])
def test_named_stages_cover_every_parameter_exactly_once(name, stages):
    model, _ = models.build(name, num_classes=7, pretrained=False)
    named = models.named_stages(model)
    assert [stage for stage, _ in named] == stages
    counts = Counter(id(p) for _, module in named for p in module.parameters())
    assert set(counts) == {id(p) for p in model.parameters()}
    assert set(counts.values()) == {1}
    head_params = list(named[-1][1].parameters())
    assert [tuple(p.shape) for p in head_params][-1] == (7,)  # the head ends with the classifier's bias


@pytest.mark.parametrize("name", list(PARAM_COUNTS))
def test_the_forward_is_the_blocks_in_a_row_then_the_head(name):
    """The contract gradient checkpointing relies on: the blocks in a row, then forward_head, are the forward.

    block_names are the stages before the head, and running them in a row followed by forward_head is the
    model's own forward.
    """
    torch.manual_seed(0)
    model, _ = models.build(name, num_classes=10, pretrained=False)
    model.eval()
    stages = dict(models.named_stages(model))
    assert models.block_names(model) == list(stages)[:-1] == models.block_names(name)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        h = x
        for block in models.block_names(model):
            h = stages[block](h)
        assert torch.equal(models.forward_head(model, h), model(x))


def test_block_names_of_models_labkit_cannot_split():
    with pytest.raises(ConfigError, match=r"model='Linear' is not allowed: a model built by labkit.models.build .* "
                                          r"to have blocks"):
        models.block_names(nn.Linear(3, 4))
    with pytest.raises(ConfigError, match=r"model='vgg16' is not allowed: one of \['small_cnn'"):
        models.block_names("vgg16")
    with pytest.raises(ConfigError, match=r"model='Linear' is not allowed: a model built by labkit.models.build .* "
                                          r"to have a known head"):
        models.forward_head(nn.Linear(3, 4), torch.zeros(1, 3))


def test_named_stages_unwraps_and_recognises_models_not_built_by_labkit():
    plain = torchvision.models.shufflenet_v2_x0_5()
    assert [s for s, _ in models.named_stages(plain)][0] == "stem"
    model, _ = models.build("small_cnn", 10, pretrained=False)
    assert models.named_stages(nn.DataParallel(model))[0][1] is model.stem
    with pytest.raises(ConfigError, match=r"model='Linear' is not allowed: a model built by labkit.models.build"):
        models.named_stages(nn.Linear(3, 4))


def test_unknown_model_and_bad_arguments():
    with pytest.raises(ConfigError, match=r"model='vgg16' is not allowed: one of \['small_cnn', 'resnet18'"):
        models.build("vgg16", 10)
    with pytest.raises(ConfigError, match=r"num_classes=0 is not allowed: a positive integer"):
        models.build("small_cnn", 0)
    with pytest.raises(ConfigError, match=r"pretrained='yes' is not allowed: True or False"):
        models.build("small_cnn", 10, pretrained="yes")


@pytest.mark.parametrize("value, online", [("1", False), ("true", False), ("YES", False), ("0", True), ("", True)])
def test_is_online_reads_labkit_offline(monkeypatch, value, online):
    monkeypatch.setenv("LABKIT_OFFLINE", value)
    assert models.is_online() is online


@pytest.mark.parametrize("name, reason, fix", [
    ("small_cnn", "torchvision has no ImageNet weights for small_cnn", "`labkit pretrain small_cnn`"),
    ("resnet18", r"\$LABKIT_OFFLINE is set",
     "use a model labkit ships weights for (small_cnn, shufflenet_v2_x0_5, tiny_vit)"),
])
def test_pretrained_offline_without_checkpoint_warns_and_is_random(name, reason, fix, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a note on stdout, never a UserWarning box with a library path
        _, weights = models.build(name, 10, pretrained=True)
    printed = " ".join(capsys.readouterr().out.split())
    assert re.search(f"^labkit note: NO PRETRAINED WEIGHTS for {name}: {reason}.*RANDOM weights", printed)
    assert weights.source == "random"
    assert "labkit has no offline checkpoint" in weights.warning and fix in weights.warning


def _trained_bn(model):
    """Give BatchNorm running statistics that differ from their initial values, so buffers are checked too."""
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, 32, 32) * 3 + 1)
    return model


def _head_names(model):
    return {f"{n}" for n, _ in model.named_parameters() if n.startswith(("head.", "fc."))}


@pytest.mark.parametrize("name", ["small_cnn", "shufflenet_v2_x0_5"])
def test_checkpoint_round_trip_restores_the_backbone_and_renews_the_head(name):
    torch.manual_seed(0)
    source = _trained_bn(models.build(name, 10, pretrained=False)[0])
    path = models.save_checkpoint(source, name, {"task": "shapes_source", "val_accuracy": 0.9})
    assert path == models.checkpoint_dir() / f"{name}.pt"
    manifest = json.loads((models.checkpoint_dir() / "manifest.json").read_text())
    assert manifest[name] == {"file": f"{name}.pt", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                              "task": "shapes_source", "val_accuracy": 0.9}
    saved = models.load_checkpoint(name)
    assert not _head_names(source) & set(saved)  # the head is not saved
    assert set(saved) == set(source.state_dict()) - _head_names(source)

    torch.manual_seed(1)
    fresh = models.build(name, 10, pretrained=False)[0].state_dict()
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checkpoint found offline is no reason to warn
        model, weights = models.build(name, 10, pretrained=True)
    assert weights == models.WeightsInfo(f"labkit:{name}.pt", None)
    state, source_state = model.state_dict(), source.state_dict()
    for key in source_state:
        if key in _head_names(source):
            assert torch.equal(state[key], fresh[key]) and not torch.equal(state[key], source_state[key]), key
        else:
            assert torch.equal(state[key], source_state[key]), key


def test_checkpoint_fits_another_number_of_classes():
    models.save_checkpoint(models.build("small_cnn", 10, pretrained=False)[0], "small_cnn", {})
    model, weights = models.build("small_cnn", 3, pretrained=True)
    assert weights.source == "labkit:small_cnn.pt" and model.head[2].out_features == 3


def test_save_checkpoint_updates_the_manifest_and_rejects_bad_names():
    model = models.build("small_cnn", 10, pretrained=False)[0]
    models.save_checkpoint(model, "small_cnn", {"steps": 1})
    models.save_checkpoint(model, "small_cnn_v2", {"steps": 2})
    manifest = json.loads((models.checkpoint_dir() / "manifest.json").read_text())
    assert sorted(manifest) == ["small_cnn", "small_cnn_v2"] and manifest["small_cnn"]["steps"] == 1
    with pytest.raises(ConfigError, match=r"name='../x' is not allowed: a file name"):
        models.save_checkpoint(model, "../x", {})
    with pytest.raises(ConfigError, match=r"meta=.* is not allowed: a dict without the keys 'file' and 'sha256'"):
        models.save_checkpoint(model, "small_cnn", {"sha256": "0"})
    with pytest.raises(ConfigError, match=r"meta=.* is not allowed: JSON-serialisable values"):
        models.save_checkpoint(model, "small_cnn", {"when": object()})


def test_tampered_checkpoint_raises_checksum_error_with_both_digests():
    path = models.save_checkpoint(models.build("small_cnn", 10, pretrained=False)[0], "small_cnn", {})
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(path.read_bytes() + b"\0")
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ChecksumError, match=f"small_cnn.pt is corrupted.*sha256 is {actual}.*expects {expected}"
                                            ".*labkit pretrain"):
        models.load_checkpoint("small_cnn")
    with pytest.raises(ChecksumError, match="sha256"):
        models.build("small_cnn", 10, pretrained=True)


def test_missing_checkpoint_names_what_exists():
    with pytest.raises(ConfigError, match=r"checkpoint='resnet18' is not allowed: one of \[\]"):
        models.load_checkpoint("resnet18")


def test_online_imagenet_weights_load_into_the_backbone(monkeypatch):
    # "Online" without a network: torchvision's download is replaced by a reference model's weights.
    torch.manual_seed(0)
    reference = _trained_bn(torchvision.models.shufflenet_v2_x0_5()).state_dict()  # 1000 ImageNet classes
    calls = []

    def fake_download(weights, **kwargs):
        calls.append((str(weights), socket.getdefaulttimeout()))
        return reference

    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    monkeypatch.setattr(torchvision.models.ShuffleNet_V2_X0_5_Weights, "get_state_dict", fake_download)
    model, weights = models.build("shufflenet_v2_x0_5", 10, pretrained=True)
    assert weights == models.WeightsInfo("imagenet", None)
    assert calls == [("ShuffleNet_V2_X0_5_Weights.IMAGENET1K_V1", downloads.DOWNLOAD_TIMEOUT_S)]
    assert socket.getdefaulttimeout() is None  # restored after the download
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in reference.items() if not k.startswith("fc."))
    assert state["fc.weight"].shape == (10, 1024)


def test_failed_download_falls_back_to_the_checkpoint_then_to_random(monkeypatch, capsys):
    def broken_download(weights, **kwargs):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    monkeypatch.setattr(torchvision.models.ShuffleNet_V2_X0_5_Weights, "get_state_dict", broken_download)
    _, weights = models.build("shufflenet_v2_x0_5", 10, pretrained=True)
    assert re.search(r"could not be downloaded \(URLError.*no route to host.*RANDOM weights",
                     " ".join(capsys.readouterr().out.split()))
    assert weights.source == "random"

    models.save_checkpoint(models.build("shufflenet_v2_x0_5", 10, pretrained=False)[0], "shufflenet_v2_x0_5", {})
    _, weights = models.build("shufflenet_v2_x0_5", 10, pretrained=True)
    assert re.search(r"NO IMAGENET WEIGHTS .*could not be downloaded.*starts from labkit's offline checkpoint",
                     " ".join(capsys.readouterr().out.split()))
    assert weights.source == "labkit:shufflenet_v2_x0_5.pt" and "shapes_source" in weights.warning


def test_tiny_vit_puts_almost_all_its_work_in_linear_layers():
    """What makes it the quantization notebook's Linear-heavy model: nearly all its multiply-adds are in Linears.

    int8 dynamic quantization reaches Linear layers only (a conv stays in float), and nearly every multiply-add
    of this model is in one.
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = models.build("tiny_vit", num_classes=10, pretrained=False)[0].eval()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert linear / sum(p.numel() for p in model.parameters()) > 0.9
    assert not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())  # its projections are nn.Linear
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 3, 32, 32))
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(v for op, v in counts.items() if "addmm" in str(op) or "mm" in str(op) or "bmm" in str(op))
    assert matmuls / counter.get_total_flops() > 0.85


def test_the_shrunk_resnet_keeps_resnet18s_stages_blocks_and_batchnorm(monkeypatch):
    from labkit.models.architectures import shrunk_resnet

    real, _ = models.build("resnet18", 10, pretrained=False)
    small = shrunk_resnet("resnet18", 10)
    small.labkit_name = "resnet18"
    assert [n for n, _ in models.named_stages(small)] == [n for n, _ in models.named_stages(real)]
    assert [type(m).__name__ for m in small.modules()][1:] == [type(m).__name__ for m in real.modules()][1:]
    assert models.has_batchnorm(small) and small(torch.randn(2, 3, 48, 48)).shape == (2, 10)
    assert sum(p.numel() for p in small.parameters()) < 0.3 * sum(p.numel() for p in real.parameters())
    monkeypatch.setenv("LABKIT_SHRINK", "1")
    built, weights = models.build("resnet18", 10)  # what `full` builds under LABKIT_SHRINK
    assert built.fc.in_features == 256 and weights.source == "random" and "half its width" in weights.warning

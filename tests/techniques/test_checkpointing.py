"""labkit.techniques.checkpointing: checkpointed blocks train exactly like the plain model and store less."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import labkit
from labkit import models
from labkit.errors import ConfigError
from labkit.techniques import checkpointing as ckpt


def twins(name: str, checkpointing):
    """Two copies of one seeded model, the second checkpointed."""
    torch.manual_seed(0)
    plain = models.build(name, num_classes=10, pretrained=False)[0]
    return plain, ckpt.apply_checkpointing(copy.deepcopy(plain), checkpointing)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    model.train()
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    return loss.detach(), grads, buffers


def test_torch_checkpoint_alone_updates_batchnorm_statistics_twice():
    """Why labkit's checkpointing does more than call torch: the recomputation runs BatchNorm again."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    checkpoint(bn, torch.randn(8, 3, requires_grad=True), use_reentrant=False).sum().backward()
    assert int(bn.num_batches_tracked) == 2


@pytest.mark.parametrize("name, checkpointing", [
    ("small_cnn", True), ("small_cnn", 1), ("small_cnn", 2), ("small_cnn", 3),
    ("resnet18", True), ("shufflenet_v2_x0_5", 2),
])
def test_checkpointed_step_equals_the_plain_one(name, checkpointing):
    plain, checkpointed = twins(name, checkpointing)
    torch.manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for _ in range(2):  # the second step starts from running statistics the first one updated
        loss, grads, buffers = train_step(plain, x, y)
        loss_ck, grads_ck, buffers_ck = train_step(checkpointed, x, y)
        assert torch.equal(loss, loss_ck)
        for key, grad in grads.items():
            torch.testing.assert_close(grads_ck[key], grad, rtol=1e-5, atol=1e-7)
        for key, buffer in buffers.items():  # running_mean, running_var, num_batches_tracked
            assert torch.equal(buffers_ck[key], buffer), key
    assert int(dict(checkpointed.named_buffers())[next(k for k in buffers if "num_batches" in k)]) == 2


def test_checkpointing_keeps_the_state_dict_and_can_be_undone():
    plain, checkpointed = twins("small_cnn", True)
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    assert checkpointed.labkit_checkpoint_segments == [["stem"], ["block1"], ["block2"], ["block3"]]
    ckpt.apply_checkpointing(checkpointed, False)
    assert "forward" not in vars(checkpointed) and checkpointed.labkit_checkpoint_segments == []
    clone = copy.deepcopy(ckpt.apply_checkpointing(checkpointed, 2))
    assert clone.forward.model is clone  # a copy checkpoints its own blocks, not the original's
    with torch.no_grad():  # evaluation runs the plain forward
        x = torch.randn(2, 3, 32, 32)
        assert torch.equal(clone.eval()(x), plain.eval()(x))


@pytest.mark.parametrize("name, checkpointing, segments", [
    ("small_cnn", True, [["stem"], ["block1"], ["block2"], ["block3"]]),
    ("small_cnn", 1, [["stem", "block1", "block2", "block3"]]),
    ("small_cnn", 3, [["stem", "block1"], ["block2"], ["block3"]]),
    ("resnet18", 2, [["stem", "layer1", "layer2"], ["layer3", "layer4"]]),
    ("shufflenet_v2_x0_5", 5, [["stem"], ["stage2"], ["stage3"], ["stage4"], ["conv5"]]),
    ("small_cnn", False, []),
])
def test_segments_split_the_blocks_evenly_longer_runs_first(name, checkpointing, segments):
    assert ckpt.checkpoint_segments(name, checkpointing) == segments


@pytest.mark.parametrize("value, match", [
    (5, r"checkpointing=5 is not allowed: False, True or 1 to 4: small_cnn has 4 blocks \(stem, block1, block2, "
        r"block3\), and a segment holds at least one"),
    (0, r"checkpointing=0 is not allowed: False, True or 1 to 4"),
    (-2, r"checkpointing=-2 is not allowed: False, True or 1 to 4"),
    ("all", r"checkpointing='all' is not allowed: False, True or 1 to 4"),
])
def test_segment_counts_outside_the_models_blocks_are_rejected(value, match):
    model = models.build("small_cnn", 10, pretrained=False)[0]
    with pytest.raises(ConfigError, match=match):
        ckpt.apply_checkpointing(model, value)


def test_a_model_labkit_cannot_split_is_rejected():
    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

        def forward(self, x):
            return self.layers(x)

    with pytest.raises(ConfigError, match=r"checkpointing=True is not allowed: False for a TwoLayers: labkit splits "
                                          r"only the models of labkit.models.build \(small_cnn, resnet18.*\) into "
                                          r"blocks. For a model of your own, call torch.utils.checkpoint.checkpoint"):
        ckpt.apply_checkpointing(TwoLayers(), True)
    with pytest.raises(ConfigError, match=r"checkpointing=2 is not allowed: False for a Sequential"):
        ckpt.checkpoint_segments(nn.Sequential(nn.Linear(2, 2)), 2)


def test_fit_with_checkpointing_trains_identically_and_stores_fewer_activations(tiny_cfg):
    plain = labkit.fit(tiny_cfg)
    checkpointed = labkit.fit(tiny_cfg.replace(checkpointing=True))
    assert checkpointed.losses == pytest.approx(plain.losses, rel=1e-6)
    assert checkpointed.accuracy == plain.accuracy
    for key, value in plain.model.state_dict().items():  # weights and BatchNorm statistics alike
        torch.testing.assert_close(checkpointed.model.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    # Measured on small_cnn (tiny config): activations 0.55x, the peak 0.96x: the peak moves into the
    # backward pass, where the stem is recomputed while its activations' gradients are alive too.
    assert checkpointed.memory["activations"] < 0.6 * plain.memory["activations"]
    assert checkpointed.peak_memory_bytes < plain.peak_memory_bytes
    assert 1.25 < checkpointed.flops_per_step / plain.flops_per_step < 1.45  # the forward is computed twice
    for key in ("parameters", "gradients", "optimizer_state"):
        assert checkpointed.memory[key] == plain.memory[key]


def test_checkpointing_runs_with_gradient_accumulation(tiny_cfg):
    res = labkit.fit(tiny_cfg.replace(checkpointing=2, grad_accum=2, evaluate=False))
    assert res.ok and res.memory["activations"] > 0 and all(math.isfinite(v) for v in res.losses)

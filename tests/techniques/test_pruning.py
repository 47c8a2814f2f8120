"""labkit.techniques.pruning: magnitude masks equal torch's, structured pruning gives a smaller model that
computes what the original computes on the channels it keeps."""

import copy

import pytest
import torch
from torch import nn

from labkit import measure, models
from labkit.errors import ConfigError
from labkit.techniques import pruning


def seeded(name: str = "small_cnn") -> nn.Module:
    torch.manual_seed(0)
    return models.build(name, num_classes=10, pretrained=False)[0].eval()


@pytest.mark.parametrize("amount", [0.0, 0.3, 0.75])
def test_layer_scope_prunes_each_layer_by_its_own_magnitudes(amount):
    model = distinct_magnitudes(seeded())
    reference = copy.deepcopy(model)
    pruning.l1_unstructured(model, amount, scope="layer")
    for name, module in pruning.prunable_layers(model):
        original = reference.get_submodule(name).weight.detach()
        k = round(amount * original.numel())
        expected = torch.ones_like(original, dtype=torch.bool)
        if k:
            expected = original.abs() > original.abs().flatten().kthvalue(k).values
        assert torch.equal(module.weight != 0, expected), name
        assert not hasattr(module, "weight_orig")  # permanent by default
    assert pruning.sparsity(model).overall == pytest.approx(amount, abs=0.01)


def distinct_magnitudes(model: nn.Module) -> nn.Module:
    """Give every prunable weight a different magnitude, so that no two tie at a threshold."""
    layers = pruning.prunable_layers(model)
    order = torch.randperm(sum(m.weight.numel() for _, m in layers), generator=torch.Generator().manual_seed(0))
    values, start = (order.float() + 1) / len(order), 0
    with torch.no_grad():
        for _, m in layers:
            n = m.weight.numel()
            signs = torch.where(torch.rand(n) < 0.5, -1.0, 1.0)
            m.weight.copy_((values[start:start + n] * signs).reshape(m.weight.shape) * 0.1)
            start += n
    return model


def test_global_scope_takes_one_threshold_over_all_layers():
    model = distinct_magnitudes(seeded())
    weights = {name: m.weight.detach().clone() for name, m in pruning.prunable_layers(model)}
    pruning.l1_unstructured(model, 0.6, scope="global")
    everything = torch.cat([w.abs().flatten() for w in weights.values()])
    threshold = everything.kthvalue(round(0.6 * everything.numel())).values
    for name, module in pruning.prunable_layers(model):
        assert torch.equal(module.weight != 0, weights[name].abs() > threshold), name
    per_layer = pruning.sparsity(model).per_layer
    assert len(set(per_layer.values())) > 1  # layers lose different shares
    assert pruning.sparsity(model).overall == pytest.approx(0.6, abs=1e-4)


def test_masks_stay_until_made_permanent_and_make_the_checkpoint_larger():
    model = seeded()
    dense_bytes = measure.model_size_bytes(model)
    pruning.l1_unstructured(model, 0.5, permanent=False)
    assert hasattr(model.stem[0], "weight_orig") and hasattr(model.stem[0], "weight_mask")
    assert measure.model_size_bytes(model) > 1.8 * dense_bytes
    pruning.make_permanent(model)
    assert not hasattr(model.stem[0], "weight_orig") and "weight" in dict(model.stem[0].named_parameters())
    assert abs(measure.model_size_bytes(model) - dense_bytes) < 0.01 * dense_bytes
    assert pruning.sparsity(model).overall == pytest.approx(0.5, abs=0.01)


def test_per_layer_amounts_leave_other_layers_alone():
    model = seeded()
    pruning.l1_unstructured(model, {"block3.1.0": 0.9})
    per_layer = pruning.sparsity(model).per_layer
    assert per_layer["block3.1.0"] == pytest.approx(0.9, abs=1e-3)
    assert all(v == 0 for k, v in per_layer.items() if k != "block3.1.0")


@pytest.mark.parametrize("amount", [-0.1, 1.0, 1.5, "half", None, float("nan")])
def test_an_amount_outside_0_1_is_refused_naming_it(amount):
    with pytest.raises(ConfigError, match=r"amount=.* is not allowed: a fraction in \[0, 1\)"):
        pruning.l1_unstructured(seeded(), amount)
    with pytest.raises(ConfigError, match=r"amount=.* is not allowed: a fraction in \[0, 1\)"):
        pruning.prune_channels(seeded(), amount, torch.randn(2, 3, 32, 32))


def test_bad_scope_layer_names_and_models_without_prunable_layers_are_refused():
    with pytest.raises(ConfigError, match=r"scope='all' is not allowed: one of \['layer', 'global'\]"):
        pruning.l1_unstructured(seeded(), 0.5, scope="all")
    with pytest.raises(ConfigError, match=r"amount key='conv9' is not allowed: a prunable layer"):
        pruning.l1_unstructured(seeded(), {"conv9": 0.5})
    with pytest.raises(ConfigError, match=r"scope='global'"):
        pruning.l1_unstructured(seeded(), {"stem.0": 0.5}, scope="global")
    with pytest.raises(ConfigError, match=r"model='Sequential' is not allowed: a model with Conv2d or Linear"):
        pruning.l1_unstructured(nn.Sequential(nn.ReLU()), 0.5)
    no_chain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
    with pytest.raises(ConfigError, match=r"no such conv, so no channel can be removed"):
        pruning.prune_channels(no_chain, 0.5, torch.randn(2, 3, 8, 8))
    with pytest.raises(ConfigError, match=r"amount key='head.2' is not allowed: a conv with prunable channels"):
        pruning.prune_channels(seeded(), {"head.2": 0.5}, torch.randn(2, 3, 32, 32))


def test_2to4_keeps_the_two_largest_of_every_four():
    weight = torch.tensor([[1.0, -4.0, 3.0, 2.0, 0.5, 0.1, -0.2, 0.3]])
    assert pruning.semi_structured_mask(weight).tolist() == [[False, True, True, False, True, False, False, True]]
    model = seeded()
    layers = pruning.apply_2to4(model)
    assert "stem.0" not in layers  # 3 x 3 x 3 = 27 inputs per output: not groups of 4
    for name in layers:
        weight = model.get_submodule(name).weight.reshape(model.get_submodule(name).weight.shape[0], -1, 4)
        assert ((weight != 0).sum(dim=-1) <= 2).all(), name
    with pytest.raises(ConfigError, match=r"multiple of 4"):
        pruning.semi_structured_mask(torch.randn(2, 3))
    with pytest.raises(ConfigError, match=r"device='cpu' is not allowed: a CUDA GPU of compute capability 8.0"):
        pruning.to_semi_structured(nn.Linear(8, 8))


def test_sparse_bytes_follow_each_layouts_arithmetic():
    weight = torch.randn(16, 8, 3, 3)
    weight[weight.abs() < 1.0] = 0
    nnz = int((weight != 0).sum())
    assert pruning.sparse_bytes(weight, "dense") == 4 * weight.numel()
    assert pruning.sparse_bytes(weight, "coo") == nnz * (4 + 4 * 8)
    assert pruning.sparse_bytes(weight, "csr") == nnz * (4 + 8) + (16 + 1) * 8
    assert pruning.sparse_bytes(weight, "coo", saved=True) > pruning.sparse_bytes(weight, "coo")
    with pytest.raises(ConfigError, match=r"layout='bsr' is not allowed"):
        pruning.sparse_bytes(weight, "bsr")


def test_channel_chains_skip_residual_additions_and_concatenations():
    assert [c.name for c in pruning.channel_chains(seeded())] == [
        "stem.0", "block1.0.0", "block1.1.0", "block2.0.0", "block2.1.0", "block3.0.0", "block3.1.0"]
    resnet = pruning.channel_chains(seeded("resnet18"))
    assert [c.name for c in resnet][:2] == ["layer1.0.conv1", "layer1.1.conv1"] and len(resnet) == 8
    assert all(c.name.endswith("conv1") for c in resnet)  # conv2 feeds the residual addition
    shuffle = pruning.channel_chains(seeded("shufflenet_v2_x0_5"))
    assert {c.followers[1] for c in shuffle if "branch2" in c.name} == {c.name[:-1] + "3" for c in shuffle
                                                                       if "branch2" in c.name}  # the depthwise conv
    assert shuffle[-1].name == "conv5.0" and shuffle[-1].consumer == "fc"  # through the mean over pixels


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "shufflenet_v2_x0_5"])
def test_prune_channels_makes_a_smaller_model_with_the_same_output_shape(name):
    model = seeded(name)
    x = torch.randn(4, 3, 32, 32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    slim = pruning.prune_channels(model, 0.5, x[:2])
    assert slim(x).shape == model(x).shape
    assert measure.count_parameters(slim)[0] < 0.8 * measure.count_parameters(model)[0]
    assert measure.model_size_bytes(slim) < measure.model_size_bytes(model)
    after = model.state_dict()  # the original model is left as it was
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_removing_channels_that_contribute_nothing_changes_no_output():
    """Zero the BatchNorm of the channels that will go: the pruned model must compute what the original computes.

    The rest of the network then sees exactly zeros from those channels.
    """
    model = seeded()
    with torch.no_grad():
        for chain in pruning.channel_chains(model):
            conv = model.get_submodule(chain.name)
            gone = torch.ones(conv.out_channels, dtype=torch.bool)
            gone[pruning.channels_to_keep(conv, 0.5)] = False
            bn = model.get_submodule(chain.followers[0])
            bn.weight[gone], bn.bias[gone] = 0, 0
    x = torch.randn(8, 3, 32, 32)
    slim = pruning.prune_channels(model, 0.5, x[:2])
    assert torch.allclose(slim(x), model(x), atol=1e-5)
    assert measure.count_parameters(slim)[0] < measure.count_parameters(model)[0] / 3.5


def test_channels_go_by_filter_norm_and_one_always_stays():
    conv = nn.Conv2d(1, 4, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([3.0, -0.1, 2.0, 0.5]).reshape(4, 1, 1, 1))
    assert pruning.channels_to_keep(conv, 0.5).tolist() == [0, 2]
    assert pruning.channels_to_keep(conv, 0.99).tolist() == [0]


def test_a_pruned_model_keeps_training_mode_batchnorm_stats_and_trains():
    model = seeded().train()
    slim = pruning.prune_channels(model, 0.25, torch.randn(2, 3, 32, 32))
    assert slim.training
    assert int(slim.stem[1].num_batches_tracked) == int(model.stem[1].num_batches_tracked)
    keep = pruning.channels_to_keep(model.stem[0], 0.25)
    assert torch.equal(slim.stem[1].running_var, model.stem[1].running_var[keep])
    loss = slim(torch.randn(4, 3, 32, 32)).sum()
    loss.backward()
    assert all(p.grad is not None for p in slim.parameters())


def test_recalibrating_batchnorm_averages_the_batches_and_restores_the_momentum():
    model = seeded().eval()
    batches = [torch.randn(8, 3, 32, 32) * 2 + 1 for _ in range(3)]
    pruning.recalibrate_batchnorm(model, batches)
    assert not model.training and model.stem[1].momentum == 0.1
    assert int(model.stem[1].num_batches_tracked) == 3
    with torch.no_grad():
        out = torch.cat([model.stem[0](b) for b in batches])
    per_batch_means = torch.stack([model.stem[0](b).mean(dim=(0, 2, 3)) for b in batches]).detach()
    assert torch.allclose(model.stem[1].running_mean, per_batch_means.mean(0), atol=1e-5)
    assert torch.allclose(model.stem[1].running_mean, out.mean(dim=(0, 2, 3)), atol=1e-5)
    with pytest.raises(ConfigError, match=r"batches='an empty iterable' is not allowed"):
        pruning.recalibrate_batchnorm(model, [])

"""labkit.techniques.lora: the LoRA layer, add_lora's choices and errors, merging, QLoRA's 4-bit base."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from labkit import measure, models
from labkit.errors import ConfigError, UnsupportedError
from labkit.techniques import lora


def tiny_vit():
    torch.manual_seed(0)
    return models.build("tiny_vit", 10, pretrained=False)[0]


def test_layer_starts_equal_to_its_base_and_has_the_papers_shapes():
    base = nn.Linear(128, 384)
    layer = lora.LoRALinear(copy.deepcopy(base), rank=8, alpha=16)
    x = torch.randn(4, 128)
    assert torch.equal(layer(x), base(x))  # B starts at zero
    assert layer.lora_A.shape == (8, 128) and layer.lora_B.shape == (384, 8) and layer.scaling == 2.0
    assert not layer.base.weight.requires_grad and not layer.base.bias.requires_grad
    assert layer.lora_A.requires_grad and layer.lora_B.requires_grad
    bound = 1 / math.sqrt(128)  # kaiming_uniform(a=sqrt(5)) on a (rank, in) matrix: U(-1/sqrt(in), 1/sqrt(in))
    assert layer.lora_A.abs().max() <= bound and layer.lora_A.std() > bound / 3


def test_forward_is_w_x_plus_scaled_b_a_x_and_gradients_reach_only_the_adapters():
    layer = lora.LoRALinear(nn.Linear(16, 24), rank=4, alpha=8)
    nn.init.normal_(layer.lora_B)
    x = torch.randn(3, 5, 16)
    expected = F.linear(x, layer.base.weight, layer.base.bias) + 2.0 * x @ layer.lora_A.T @ layer.lora_B.T
    out = layer(x)
    assert torch.allclose(out, expected, atol=1e-5)
    out.sum().backward()
    assert layer.base.weight.grad is None and layer.lora_A.grad is not None and layer.lora_B.grad is not None


def test_dropout_acts_on_the_lora_path_only():
    layer = lora.LoRALinear(nn.Linear(16, 16), rank=2, alpha=2, dropout=0.5).train()
    x = torch.randn(64, 16)
    assert torch.equal(layer(x), layer.base(x))  # B = 0: dropout on the LoRA path changes nothing
    nn.init.normal_(layer.lora_B)
    assert not torch.allclose(layer(x), layer(x))  # now it does, in training mode
    layer.eval()
    assert torch.equal(layer(x), layer(x))


def test_merge_keeps_outputs_and_unmerge_restores_the_weight():
    layer = lora.LoRALinear(nn.Linear(32, 48), rank=4, alpha=16)
    nn.init.normal_(layer.lora_B, std=0.1)
    weight = layer.base.weight.detach().clone()
    x = torch.randn(8, 32)
    before = layer(x).detach()
    layer.merge()
    assert layer.merged and torch.allclose(layer(x), before, atol=1e-5)
    assert torch.allclose(layer.base.weight, weight + layer.delta_weight(), atol=1e-6)
    layer.merge()  # twice is once
    assert torch.allclose(layer(x), before, atol=1e-5)
    layer.unmerge()
    assert not layer.merged and torch.allclose(layer.base.weight, weight, atol=1e-6)


@pytest.mark.parametrize(("rank", "alpha", "dropout", "match"), [
    (0, 16, 0.0, "rank=0 is not allowed: a positive integer"),
    (2.5, 16, 0.0, "rank=2.5"),
    (129, 16, 0.0, r"rank=129 is not allowed: at most min\(in, out\) = 128 for a Linear 128 -> 384"),
    (8, 0, 0.0, "alpha=0 is not allowed: a number > 0"),
    (8, 16, 1.0, r"dropout=1.0 is not allowed: a number in \[0, 1\)"),
])
def test_layer_refuses_bad_settings_by_name(rank, alpha, dropout, match):
    with pytest.raises(ConfigError, match=match):
        lora.LoRALinear(nn.Linear(128, 384), rank, alpha, dropout)


def test_add_lora_adapts_the_named_layers_and_trains_adapters_and_head_only():
    model = lora.add_lora(tiny_vit(), rank=8, alpha=16, targets=["qkv"])
    assert list(lora.lora_layers(model)) == [f"block{i}.attn.qkv" for i in range(1, 5)]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all("lora_" in n or n.startswith("head.") for n in trainable)
    assert sum("lora_" in n for n in trainable) == 8 and {"head.0.weight", "head.2.weight"} <= set(trainable)
    total, count = measure.count_parameters(model)
    assert count == 4 * lora.adapter_numel(128, 384, 8) + 1_546 and total == 545_930 + 16_384


def test_targets_match_whole_name_parts_and_all_linear_leaves_the_head():
    model = tiny_vit()
    assert lora.matching_linears(model, ["mlp.0"]) == [f"block{i}.mlp.0" for i in range(1, 5)]
    every = lora.matching_linears(model, "all-linear")
    assert len(every) == 16 and "head.2" not in every
    with pytest.raises(ConfigError, match=r"targets='v' .*matches no module.*block1\.attn\.qkv"):
        lora.add_lora(model, 8, 16, ["v"])  # "v" is not a whole part of "attn.qkv"


def test_add_lora_errors_name_the_value_and_the_linear_layers():
    with pytest.raises(ConfigError, match=r"targets='attn' .*block1\.attn \(Attention\), .*not Linear layers"):
        lora.add_lora(tiny_vit(), 8, 16, ["attn"])
    with pytest.raises(ConfigError,
                       match=r"rank=200 is not allowed: at most min\(in, out\).*block1\.attn\.qkv \(128 -> 384\)"):
        lora.add_lora(tiny_vit(), 200, 16, ["qkv"])
    with pytest.raises(ConfigError, match="alpha=-1"):
        lora.add_lora(tiny_vit(), 8, -1, ["qkv"])
    with pytest.raises(ConfigError, match="a non-empty list"):
        lora.add_lora(tiny_vit(), 8, 16, [])
    twice = lora.add_lora(tiny_vit(), 8, 16, ["qkv"])
    with pytest.raises(ConfigError, match="a model without LoRA layers"):
        lora.add_lora(twice, 8, 16, ["qkv"])
    with pytest.raises(ConfigError, match="'all-linear' alone"):
        lora.matching_linears(tiny_vit(), ["all-linear", "qkv"])


def test_add_lora_works_on_any_module_and_freezes_all_but_the_adapters():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    lora.add_lora(model, rank=2, alpha=4, targets=["0"])
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["0.lora_A", "0.lora_B"]


def test_merge_and_unload_gives_a_plain_model_with_the_same_outputs():
    model = lora.add_lora(tiny_vit(), 4, 16, "all-linear").eval()
    for layer in lora.lora_layers(model).values():
        nn.init.normal_(layer.lora_B, std=0.02)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        plain = lora.merge_and_unload(copy.deepcopy(model))
        assert not lora.lora_layers(plain) and type(plain.block1.attn.qkv) is nn.Linear
        assert torch.allclose(plain(x), before, atol=1e-4)


def test_lora_state_dict_holds_adapters_and_head_only():
    model = lora.add_lora(tiny_vit(), 8, 16, ["qkv"])
    state = lora.lora_state_dict(model)
    assert all("lora_" in k or k.startswith("head.") for k in state) and len(state) == 8 + 4


def test_a_4bit_base_trains_its_adapters_and_refuses_to_merge():
    bnb = pytest.importorskip("bitsandbytes")
    base = nn.Linear(64, 96)
    quantized = bnb.nn.Linear4bit(64, 96, compute_dtype=torch.float32, quant_type="nf4")
    quantized.load_state_dict(base.state_dict())
    quantized = quantized.to("cpu")  # .to quantizes the weight
    layer = lora.LoRALinear(quantized, rank=4, alpha=8, dtype=torch.bfloat16)
    assert layer.lora_A.dtype == torch.bfloat16
    nn.init.normal_(layer.lora_B, std=0.1)
    x = torch.randn(4, 64, requires_grad=True)
    layer(x).float().sum().backward()
    assert layer.lora_A.grad is not None and x.grad is not None and layer.lora_A.grad.abs().sum() > 0
    assert measure.count_parameters(layer)[0] == 64 * 96 + 96 + 4 * (64 + 96)  # 4-bit weights count as weights
    with pytest.raises(UnsupportedError, match="merge=.*cannot run here: the base weight is stored as torch.uint8"):
        layer.merge()

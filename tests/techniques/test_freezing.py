"""labkit.techniques.freezing: levels map onto every model's stages; frozen stages get no gradient, no
optimizer state, and keep their BatchNorm statistics."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit
from labkit import measure, models
from labkit.errors import ConfigError
from labkit.techniques import freezing


def build(name="small_cnn", seed=0):
    torch.manual_seed(seed)
    return models.build(name, num_classes=10, pretrained=False)[0]


def batchnorms(module):
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def stage(model, name):
    return dict(models.named_stages(model))[name]


def train_steps(model, steps=3, seed=1, lr=1e-2):
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 3, 32, 32, generator=generator), torch.randint(0, 10, (8,), generator=generator)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer


@pytest.mark.parametrize("name, expected", [
    ("small_cnn", {"light": ["stem"], "medium": ["stem", "block1"], "heavy": ["stem", "block1", "block2"],
                   "head_only": ["stem", "block1", "block2", "block3"]}),
    ("resnet18", {"light": ["stem", "layer1"], "medium": ["stem", "layer1", "layer2"],
                  "heavy": ["stem", "layer1", "layer2", "layer3"],
                  "head_only": ["stem", "layer1", "layer2", "layer3", "layer4"]}),
    ("shufflenet_v2_x0_5", {"light": ["stem", "stage2"], "medium": ["stem", "stage2", "stage3"],
                            "heavy": ["stem", "stage2", "stage3", "stage4"],
                            "head_only": ["stem", "stage2", "stage3", "stage4", "conv5"]}),
])
def test_levels_map_onto_each_models_stages(name, expected):
    model = build(name)
    for level, stages in expected.items():
        assert freezing.frozen_stages(name, level) == stages == freezing.frozen_stages(model, level)
    assert freezing.frozen_stages(name, "none") == freezing.frozen_stages(name, None) == []
    assert freezing.LEVELS == labkit.config.FREEZE_LEVELS == ("none", "light", "medium", "heavy", "head_only")


def test_a_list_of_stages_comes_back_in_forward_order():
    assert freezing.frozen_stages("resnet18", ["layer2", "stem"]) == ["stem", "layer2"]


@pytest.mark.parametrize("level, match", [
    ("full", r"freeze='full' is not allowed: None, one of \['none', 'light', 'medium', 'heavy', 'head_only'\] or a "
             r"list of stage names from \['stem', 'block1', 'block2', 'block3', 'head'\]"),
    (["stem", "layer9"], r"freeze=\['stem', 'layer9'\] is not allowed: a level .* or a non-empty list of stage names "
                         r"from \[.*\]; not stages: \['layer9'\]"),
    ([], r"freeze=\[\] is not allowed: a level"),
    (3, r"freeze=3 is not allowed: None, one of"),
])
def test_unknown_levels_and_stages_are_named(level, match):
    with pytest.raises(ConfigError, match=match):
        freezing.frozen_stages("small_cnn", level)
    with pytest.raises(ConfigError, match=match):
        freezing.freeze(build(), level)


def test_freezing_every_parameter_is_refused_and_changes_nothing():
    model = build()
    everything = [name for name, _ in models.named_stages(model)]
    with pytest.raises(ConfigError, match=r"freeze=\['stem', 'block1', 'block2', 'block3', 'head'\] is not allowed: a "
                                          r"level or stages that leave at least one parameter to train \(this freezes "
                                          r"every parameter of small_cnn: nothing would learn\). 'head_only' freezes "
                                          r"everything but the head"):
        freezing.freeze(model, everything)
    assert all(p.requires_grad for p in model.parameters())  # nothing was half done
    freezing.freeze(model, "head_only")
    with pytest.raises(ConfigError, match=r"freeze=\['head'\] is not allowed: a level or stages that leave"):
        freezing.freeze(model, ["head"])  # the rest was frozen before


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "shufflenet_v2_x0_5"])
def test_frozen_parameters_get_no_gradient_and_no_optimizer_state(name):
    model = freezing.freeze(build(name), "heavy")
    frozen = set(freezing.frozen_stages(name, "heavy"))
    assert freezing.frozen_stage_names(model) == freezing.frozen_stages(name, "heavy")
    optimizer = train_steps(model, steps=1)
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    for stage_name, module in models.named_stages(model):
        for p in module.parameters():
            assert p.requires_grad is (stage_name not in frozen)
            assert (p.grad is None) is (stage_name in frozen)
            assert (p in optimizer.state) is (stage_name not in frozen)


def test_frozen_batchnorm_stays_in_eval_mode_and_its_statistics_do_not_move():
    model = freezing.freeze(build(), "medium")
    frozen, trainable = batchnorms(stage(model, "stem")) + batchnorms(stage(model, "block1")), \
        batchnorms(stage(model, "block2"))
    before = [{k: v.clone() for k, v in bn.state_dict().items()} for bn in frozen + trainable]
    model.train()
    assert model.training and all(bn.training for bn in trainable)
    assert all(freezing.is_frozen_batchnorm(bn) for bn in frozen)
    assert not any(map(freezing.is_frozen_batchnorm, trainable))
    train_steps(model, steps=4)
    after = [bn.state_dict() for bn in frozen + trainable]
    moved = [any(not torch.equal(a[k], b[k]) for k in a) for a, b in zip(before, after, strict=True)]
    assert moved == [False] * len(frozen) + [True] * len(trainable)
    model.eval()
    model.train(True)
    x = torch.randn(4, frozen[0].num_features, 8, 8)
    assert torch.equal(frozen[0](x), frozen[0].eval()(x))  # after model.train(): normalised by running statistics
    assert "train" not in frozen[0].__dict__ and type(frozen[0]) is torch.nn.BatchNorm2d  # nothing patched
    unfrozen = freezing.unfreeze(model)
    assert unfrozen and not any(map(freezing.is_frozen_batchnorm, model.modules()))
    assert all(not bn._forward_pre_hooks and bn.training for bn in batchnorms(model))


def test_without_batchnorm_eval_only_the_parameters_freeze():
    model = freezing.freeze(build(), "medium", batchnorm_eval=False)
    frozen = batchnorms(stage(model, "stem"))
    before = frozen[0].running_mean.clone()
    train_steps(model, steps=2)
    assert frozen[0].training and not freezing.is_frozen_batchnorm(frozen[0])
    assert not torch.equal(frozen[0].running_mean, before)  # what requires_grad_(False) alone leaves moving
    assert all(not p.requires_grad for p in stage(model, "stem").parameters())


def test_the_freeze_survives_deepcopy_pickling_state_dicts_and_moves():
    model = freezing.freeze(build(), "heavy")
    plain = build()
    assert list(model.state_dict()) == list(plain.state_dict())  # freezing adds no key
    for copy_ in (copy.deepcopy(model), torch.load(_saved(model), weights_only=False),
                  copy.deepcopy(model).to(torch.float64).to("cpu")):
        copy_.train()
        frozen = [m for m in copy_.modules() if freezing.is_frozen_batchnorm(m)]
        assert len(frozen) == len(batchnorms(stage(model, "stem"))) + 2 * 2  # stem + block1, block2 (2 each)
        assert freezing.frozen_stage_names(copy_) == ["stem", "block1", "block2"]
    model.load_state_dict(plain.state_dict())  # new weights, same freeze
    model.train()
    assert freezing.frozen_stage_names(model) == ["stem", "block1", "block2"]
    assert sum(map(freezing.is_frozen_batchnorm, model.modules())) == len(frozen)
    plain.load_state_dict(model.state_dict())  # a frozen model's weights load into a plain one
    assert all(p.requires_grad for p in plain.parameters())


def _saved(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return buffer


def test_unfreeze_thaws_stages_and_their_batchnorm_follows_the_model():
    model = freezing.freeze(build(), "head_only")
    assert freezing.unfreeze(model, ["block3"]) == ["block3"]
    model.train()
    assert all(p.requires_grad for p in stage(model, "block3").parameters())
    assert all(bn.training and not freezing.is_frozen_batchnorm(bn) for bn in batchnorms(stage(model, "block3")))
    assert all(map(freezing.is_frozen_batchnorm, batchnorms(stage(model, "block2"))))
    model.eval()
    assert freezing.unfreeze(model) == ["stem", "block1", "block2", "block3", "head"]
    assert all(not m.training for m in model.modules())  # thawed layers follow the model's eval mode
    model.train()
    assert all(m.training for m in model.modules()) and freezing.frozen_stage_names(model) == []


def test_gradual_unfreezing_thaws_one_stage_from_the_top_every_few_steps():
    model = freezing.freeze(build(), "head_only")
    thawed = {step: freezing.gradual_unfreeze(model, step, every=3) for step in range(14)}
    assert {step: names for step, names in thawed.items() if names} == {
        3: ["block3"], 6: ["block2"], 9: ["block1"], 12: ["stem"]}
    assert freezing.frozen_stage_names(model) == []
    late = freezing.freeze(build(), "head_only")
    assert freezing.gradual_unfreeze(late, 7, every=3) == ["block2", "block3"]  # catches up at once
    with pytest.raises(ConfigError, match=r"every=0 is not allowed: a positive integer"):
        freezing.gradual_unfreeze(late, 1, every=0)
    with pytest.raises(ConfigError, match=r"step=-1 is not allowed: an integer >= 0"):
        freezing.gradual_unfreeze(late, -1, every=2)


def test_a_thawed_parameter_gets_optimizer_state_only_once_it_trains():
    model = freezing.freeze(build(), "head_only")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # every parameter, from the start
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    assert len(optimizer.state) == len(list(stage(model, "head").parameters()))
    freezing.gradual_unfreeze(model, 1, every=1)  # block3 thaws
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    assert len(optimizer.state) == (len(list(stage(model, "head").parameters()))
                                    + len(list(stage(model, "block3").parameters())))


def test_discriminative_groups_decay_the_lr_from_the_head_down():
    model = freezing.freeze(build(), "light")
    groups = freezing.discriminative_param_groups(model, lr=1e-3, decay=0.5)
    assert [(g["stage"], g["lr"]) for g in groups] == [
        ("block1", 1e-3 / 8), ("block2", 1e-3 / 4), ("block3", 1e-3 / 2), ("head", 1e-3)]
    every = freezing.discriminative_param_groups(model, lr=1e-3, decay=0.5, trainable_only=False)
    assert [g["stage"] for g in every][0] == "stem" and every[0]["lr"] == pytest.approx(1e-3 / 16)
    assert sum(len(g["params"]) for g in every) == len(list(model.parameters()))
    optimizer = torch.optim.AdamW(groups)
    assert [g["lr"] for g in optimizer.param_groups] == [g["lr"] for g in groups]
    with pytest.raises(ConfigError, match=r"decay=1.5 is not allowed: a number in \(0, 1\]"):
        freezing.discriminative_param_groups(model, lr=1e-3, decay=1.5)
    with pytest.raises(ConfigError, match=r"lr=0 is not allowed: a finite number > 0"):
        freezing.discriminative_param_groups(model, lr=0)


def test_cached_features_are_the_frozen_bodys_output():
    model = freezing.freeze(build(), "head_only")
    model.train()  # as in training: the frozen body stays in eval mode
    batches = [torch.randn(5, 3, 32, 32), torch.randn(3, 3, 32, 32)]
    features = freezing.cache_features(model, batches)
    assert features.shape == (8, 128, 4, 4) and not features.requires_grad
    expected = torch.cat([_body(model, x) for x in batches])
    assert torch.allclose(features, expected)
    logits = models.forward_head(model, features)
    assert torch.allclose(logits, torch.cat([model(x) for x in batches]), atol=1e-6)
    with pytest.raises(ConfigError, match=r"model=\"trainable or train-mode stages \['block3'\]\" is not allowed: a "
                                          r"model whose whole body is frozen"):
        freezing.cache_features(freezing.freeze(build(), "heavy"), batches)


def _body(model, x):
    with torch.no_grad():
        for name in models.block_names(model):
            x = stage(model, name)(x)
    return x


def test_the_memory_tracker_handles_frozen_parameters():
    model = freezing.freeze(build(), "heavy")
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

    def step():
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    breakdown = measure.track_step_memory(step, model, optimizer)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert breakdown.note is None
    assert breakdown.peak_by_category["gradients"] == 4 * trainable
    assert breakdown.peak_by_category["parameters"] >= 4 * sum(p.numel() for p in model.parameters())


def test_sync_batchnorm_leaves_frozen_layers_frozen():
    from labkit.techniques import distributed

    model = freezing.freeze(build(), "medium")
    frozen = sum(map(freezing.is_frozen_batchnorm, model.modules()))
    synced, note = distributed.sync_batchnorm(model, torch.device("cuda"))  # converting needs no GPU
    assert note is None and sum(map(freezing.is_frozen_batchnorm, synced.modules())) == frozen
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in synced.modules())  # the trainable ones share


def test_head_only_on_a_tied_language_model_trains_the_output_layer_not_only_the_norm(monkeypatch, capsys):
    # SmolLM2 and Qwen2.5 tie the output layer to the embeddings: freezing the embeddings froze it too, and only
    # the final norm (576 parameters on SmolLM2) trained
    monkeypatch.setenv("LABKIT_SHRINK", "1")  # SmolLM2's architecture at CPU size: tied, GQA
    torch.manual_seed(0)
    model, _, _ = models.build_hub_model("smollm2_135m", pretrained=False)
    assert models.output_layer_tied(model)
    embed_before = model.model.embed_tokens.weight.detach().clone()
    freezing.freeze(model, "head_only")
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    assert head is not embed and head.requires_grad and not embed.requires_grad and torch.equal(head, embed)
    assert not model.config.tie_word_embeddings  # nothing ties them again
    _, trainable = measure.count_parameters(model)
    assert trainable == head.numel() + model.model.norm.weight.numel()
    assert "lm_head.weight was tied" in " ".join(capsys.readouterr().out.split())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(3, 100, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert not torch.equal(model.lm_head.weight, embed_before) and torch.equal(embed, embed_before)
    assert freezing.frozen_stage_names(model)[0] == "embed"


def test_an_untied_model_is_frozen_as_before():
    model = models.build_language_model("tiny_llama", vocab_size=16, pretrained=False)[0]
    head = model.lm_head.weight
    assert freezing.untie_from_frozen(model, ["embed", "layer0"]) == []
    freezing.freeze(model, "head_only")
    assert model.lm_head.weight is head and head.requires_grad

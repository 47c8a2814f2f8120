"""labkit.techniques.memory: gradient checkpointing, 8-bit optimizers, the memory calculator, the staged view."""

import copy
import math
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import labkit
from labkit import measure, models, train
from labkit.errors import ConfigError
from labkit.techniques import memory

# small_cnn's trainable tensors: 23, of which 17 (2,882 parameters) have fewer than 4,096 elements
SMALL_CNN_PARAMS = 295_490
SMALL_CNN_BELOW_MIN_8BIT = 2_882
# AdamW: 8 B per parameter + a 4-byte step counter per tensor (on the CPU)
SMALL_CNN_ADAMW_STATE = 8 * SMALL_CNN_PARAMS + 4 * 23
# 8-bit AdamW: fp32 moments below 4,096 elements; above, uint8 moments + an fp32 absmax per 256 values for
# each, + the two shared 1 KiB quantisation maps
SMALL_CNN_8BIT_STATE = (8 * SMALL_CNN_BELOW_MIN_8BIT + 2 * (SMALL_CNN_PARAMS - SMALL_CNN_BELOW_MIN_8BIT)
                        + 8 * sum(math.ceil(n / 256) for n in (6912, 9216, 18432, 36864, 73728, 147456)) + 2048)
BF16_EMULATED = "ignore:bf16 on this CPU is emulated"


def twins(name: str, checkpointing):
    """Two copies of one seeded model, the second checkpointed."""
    torch.manual_seed(0)
    plain = models.build(name, num_classes=10, pretrained=False)[0]
    return plain, memory.apply_checkpointing(copy.deepcopy(plain), checkpointing)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    model.train()
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    return loss.detach(), grads, buffers


# --- gradient checkpointing -----------------------------------------------------------------------


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
    memory.apply_checkpointing(checkpointed, False)
    assert "forward" not in vars(checkpointed) and checkpointed.labkit_checkpoint_segments == []
    clone = copy.deepcopy(memory.apply_checkpointing(checkpointed, 2))
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
    assert memory.checkpoint_segments(name, checkpointing) == segments


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
        memory.apply_checkpointing(model, value)


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
        memory.apply_checkpointing(TwoLayers(), True)
    with pytest.raises(ConfigError, match=r"checkpointing=2 is not allowed: False for a Sequential"):
        memory.checkpoint_segments(nn.Sequential(nn.Linear(2, 2)), 2)


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


def test_checkpoint_tradeoff_measures_each_segment_count_beside_the_cost_model(tiny_cfg):
    df = memory.checkpoint_tradeoff(tiny_cfg, segments=[0, 2, 4], progress=False)
    assert list(df["segments"]) == [0, 2, 4]
    assert list(df["segment_blocks"]) == ["off", "stem+block1 | block2+block3", "stem | block1 | block2 | block3"]
    assert df["error"].isna().all()
    rows = df.set_index("segments")
    assert rows.loc[0, "activation_ratio"] == rows.loc[0, "peak_ratio"] == rows.loc[0, "time_ratio"] == 1.0
    assert rows.loc[4, "activation_ratio"] < rows.loc[2, "activation_ratio"] < 1.0
    assert rows.loc[4, "peak_ratio"] < 1.0 and rows.loc[4, "flops_ratio"] > 1.25
    # Chen et al.'s cost model, from the bytes each block saves, lands near the measurement (0.75 vs 0.77,
    # 0.46 vs 0.55 here: the model leaves out the head's and the loss's small tensors' timing).
    assert rows.loc[0, "predicted_activation_ratio"] == 1.0
    for k in (2, 4):
        assert abs(rows.loc[k, "predicted_activation_ratio"] - rows.loc[k, "activation_ratio"]) < 0.15
    assert list(df["sqrt_rule"]) == [False, True, False] and set(df["sqrt_rule_segments"]) == {2}
    finding = memory.tradeoff_finding(df)
    assert finding.startswith("Checkpointing small_cnn in 4 segment(s) (stem | block1 | block2 | block3) gave the "
                              "lowest peak")
    assert "45% less" in finding or "% less" in finding
    assert "The sqrt(n) rule, which assumes n equal blocks that each store one tensor, suggests 2 segment(s) for 4 blocks" in finding
    with pytest.raises(ConfigError, match=r"segments=5 is not allowed: segment counts from 0 \(checkpointing off\) "
                                          r"to 4 \(small_cnn has 4 blocks: stem, block1, block2, block3\)"):
        memory.checkpoint_tradeoff(tiny_cfg, segments=[0, 5])
    with pytest.raises(ConfigError, match=r"frame='1 successful rows' is not allowed: a checkpoint_tradeoff frame "
                                          r"with the run without checkpointing"):
        memory.tradeoff_finding(df[df["segments"] == 2])


# --- 8-bit optimizers -----------------------------------------------------------------------------


def test_import_labkit_does_not_import_bitsandbytes():
    code = ("import sys, labkit; from labkit.techniques import memory; "
            "sys.exit(1 if 'bitsandbytes' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_8bit_state_is_smaller_above_min_8bit_size_and_32bit_below(tiny_cfg):
    tables = {}
    for name in ("adamw", "adamw8bit"):
        trainer = train.Trainer(tiny_cfg.replace(optimizer=name))
        images, labels = next(iter(trainer.loader))
        trainer.step(images, labels)
        table = memory.optimizer_state_table(trainer.optimizer, trainer.model)
        assert table["state_bytes"].sum() == measure.optimizer_state_bytes(trainer.optimizer)
        tables[name] = table
    adamw, eight = tables["adamw"], tables["adamw8bit"]
    assert adamw["state_bytes"].sum() == SMALL_CNN_ADAMW_STATE and eight["state_bytes"].sum() == SMALL_CNN_8BIT_STATE
    shared = eight[eight["numel"] == 0]
    assert list(shared["tensor"]) == ["(shared: quantisation maps)"] and list(shared["state_bytes"]) == [2048]
    eight = eight[eight["numel"] > 0].reset_index(drop=True)
    assert list(eight["tensor"]) == list(adamw["tensor"])
    small = eight["below_min_8bit_size"]
    assert int(small.sum()) == 17 and int(eight.loc[small, "numel"].sum()) == SMALL_CNN_BELOW_MIN_8BIT
    # below min_8bit_size: the same fp32 moments as AdamW (which also keeps a 4-byte step counter)
    assert set(eight.loc[small, "state_dtype"]) == {"float32"}
    assert list(eight.loc[small, "state_bytes"]) == list(adamw.loc[small, "state_bytes"] - 4)
    # above: uint8 moments, 2 bytes per parameter plus the block scales, a quarter of AdamW's
    large = eight[~small]
    assert set(large["state_dtype"]) == {"uint8"}
    for _, row in large.iterrows():
        assert row["state_bytes"] == 2 * row["numel"] + 8 * math.ceil(row["numel"] / 256)
    assert (large["state_bytes"].to_numpy() < adamw.loc[~small, "state_bytes"].to_numpy() / 3.9).all()


def test_fit_with_adamw8bit_measures_the_calculated_state(tiny_cfg):
    plain = labkit.fit(tiny_cfg)
    res = labkit.fit(tiny_cfg.replace(optimizer="adamw8bit"))
    assert res.ok and res.losses[0] == plain.losses[0] and res.losses[1:] != plain.losses[1:]
    assert res.memory["optimizer_state"] == SMALL_CNN_8BIT_STATE
    assert res.memory["optimizer_state"] == memory.model_training_memory(res.model, optimizer="adamw8bit")[
        "optimizer_state"]
    assert plain.memory["optimizer_state"] == SMALL_CNN_ADAMW_STATE
    assert res.memory["optimizer_state"] / plain.memory["optimizer_state"] == pytest.approx(0.262, abs=0.001)
    assert res.memory["parameters"] == plain.memory["parameters"]
    assert res.memory["gradients"] == plain.memory["gradients"]


def test_paged_optimizer_on_the_cpu_is_refused_not_quietly_unpaged(tiny_cfg):
    bnb = memory.bitsandbytes_module()
    weight = nn.Parameter(torch.zeros(memory.MIN_8BIT_SIZE))
    weight.grad = torch.ones_like(weight)
    with pytest.warns(UserWarning, match="Paged optimizers are not supported on CPU. Falling back"):
        bnb.optim.PagedAdamW8bit([weight]).step()  # what labkit's error spares the learner
    with pytest.raises(ConfigError, match=r"optimizer='paged_adamw8bit' is not allowed: 'adamw8bit' on device 'cpu'. "
                                          r"Paged optimizers keep their state in CUDA unified memory"):
        labkit.fit(tiny_cfg.replace(optimizer="paged_adamw8bit"))


def test_missing_bitsandbytes_names_the_optimizer_and_how_to_install_it(tiny_cfg, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` now raises ImportError
    with pytest.raises(ConfigError, match=r"optimizer='adamw8bit' is not allowed: 'adamw' or 'sgd' without the "
                                          r"bitsandbytes package, which is not installed .*Install \(or upgrade\) it "
                                          r"with `pip install 'bitsandbytes>=0.50'` \(or `pip install "
                                          r"'labkit-finetune\[memory\]'`\)"):
        train.build_optimizer(tiny_cfg.replace(optimizer="adamw8bit"), nn.Linear(4, 4))


@pytest.fixture
def fresh_probe():
    memory._runs_on.cache_clear()
    yield
    memory._runs_on.cache_clear()


def test_bitsandbytes_that_cannot_run_here_is_a_clear_error(monkeypatch, fresh_probe):
    class NoKernel:
        def __init__(self, params, lr):
            pass

        def step(self):
            raise RuntimeError("no kernel for the cpu")

    fake = types.SimpleNamespace(__version__="0.44.1", optim=types.SimpleNamespace(AdamW8bit=NoKernel))
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    with pytest.raises(ConfigError, match=r"optimizer='adamw8bit' is not allowed: 'adamw' or 'sgd' here: bitsandbytes "
                                          r"0.44.1 cannot run 8-bit optimizers on 'cpu' \(RuntimeError: no kernel for "
                                          r"the cpu\). Install \(or upgrade\) it with"):
        memory.build_8bit_optimizer(nn.Linear(4, 4).parameters(), "adamw8bit")


def test_build_8bit_optimizer_rejects_bad_arguments():
    params = list(nn.Linear(4, 4).parameters())
    with pytest.raises(ConfigError, match=r"optimizer='adam8' is not allowed: one of \['adamw8bit', 'paged_adamw8bit'\]"):
        memory.build_8bit_optimizer(params, "adam8")
    with pytest.raises(ConfigError, match=r"min_8bit_size=-1 is not allowed: an integer >= 0"):
        memory.build_8bit_optimizer(params, min_8bit_size=-1)
    with pytest.raises(ConfigError, match=r"params=\[\] is not allowed: at least one parameter"):
        memory.build_8bit_optimizer([])
    opt = memory.build_8bit_optimizer(params, min_8bit_size=0, lr=0.1, weight_decay=0.01)
    assert opt.args.min_8bit_size == 0 and opt.param_groups[0]["lr"] == 0.1


def test_paged_state_counts_on_the_gpu_it_is_paged_for():
    """bitsandbytes' paged state is a CPU tensor over CUDA unified memory (faked here: no GPU needed)."""
    weight = nn.Parameter(torch.zeros(10))
    opt = torch.optim.SGD([weight], lr=0.1)
    paged = torch.zeros(1000, dtype=torch.uint8)
    paged.is_paged, paged.page_deviceid = True, 0
    opt.state[weight] = {"state1": paged, "absmax1": torch.zeros(4)}
    assert measure.optimizer_state_bytes(opt, "cuda:0") == 1000
    assert measure.optimizer_state_bytes(opt, "cuda:0", paged_only=True) == 1000
    assert measure.optimizer_state_bytes(opt, "cpu") == 16
    assert measure.optimizer_state_bytes(opt) == 1016


def test_small_models_save_less_with_8bit_state():
    df = memory.eight_bit_savings(["small_cnn", "resnet18"]).set_index("model")
    assert df.loc["small_cnn", "params_below_min_8bit_size"] == SMALL_CNN_BELOW_MIN_8BIT
    assert df.loc["small_cnn", "share_below"] == pytest.approx(SMALL_CNN_BELOW_MIN_8BIT / SMALL_CNN_PARAMS)
    assert df.loc["small_cnn", "adamw8bit_state_bytes"] == SMALL_CNN_8BIT_STATE
    assert df.loc["small_cnn", "state_ratio"] == pytest.approx(0.262, abs=0.001)
    assert df.loc["resnet18", "state_ratio"] == pytest.approx(0.2544, abs=0.001)
    no_threshold = memory.eight_bit_savings(["small_cnn"], min_8bit_size=0)
    assert no_threshold.loc[0, "state_ratio"] < df.loc["small_cnn", "state_ratio"]


# --- the calculator -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, expected", [
    ({}, (4000, 4000, 8000, 0)),  # fp32 + AdamW: 16 bytes per parameter
    ({"precision": "fp16"}, (2000, 2000, 8000, 4000)),  # mixed with master weights: ZeRO's 2 + 2 + 12
    ({"precision": "bf16", "master_weights": False}, (2000, 2000, 4000, 0)),  # pure bf16: bf16 moments
    ({"optimizer": "sgd"}, (4000, 4000, 4000, 0)),
    ({"optimizer": "sgd", "momentum": False}, (4000, 4000, 0, 0)),
    ({"optimizer": "adamw8bit"}, (4000, 4000, 2000 + 8 * 4 + 2048, 0)),  # 4 blocks of 256, 2 KiB of maps
    ({"optimizer": "paged_adamw8bit", "tensor_sizes": [100, 900], "min_8bit_size": 500},
     (4000, 4000, 800 + 1800 + 8 * 4 + 2048, 0)),  # the 100-element tensor keeps fp32 moments
    ({"optimizer": "adamw8bit", "tensor_sizes": [10, 990], "min_8bit_size": 4096}, (4000, 4000, 8000, 0)),
    ({"trainable_params": 250}, (4000, 1000, 2000, 0)),
    ({"precision": "bf16", "trainable_params": 250}, (2000, 500, 2000, 1000)),
])
def test_training_memory_counts_bytes_per_parameter(kwargs, expected):
    out = memory.training_memory(1000, **kwargs)
    assert (out["weights"], out["gradients"], out["optimizer_state"], out["master_weights"]) == expected
    assert out["total"] == sum(expected)


def test_training_memory_for_7b_and_175b():
    assert memory.training_memory(7e9)["total"] == 112e9
    assert memory.training_memory(7e9, "bf16")["total"] == 112e9  # the same 16 bytes, split differently
    assert memory.training_memory(175e9)["optimizer_state"] == 1.4e12
    assert memory.training_memory(175e9, optimizer="adamw8bit")["optimizer_state"] == 355_468_752_048
    df = memory.scale_table()
    assert list(df["model"]) == ["7B"] * 4 + ["175B"] * 4
    assert list(df["bytes_per_param"].round(3)[:4]) == [16.0, 16.0, 10.031, 6.031]
    assert labkit.training_memory is memory.training_memory


@pytest.mark.parametrize("kwargs, match", [
    ({"num_params": 0}, r"num_params=0 is not allowed: a number of parameters > 0"),
    ({"precision": "auto"}, r"precision='auto' is not allowed: one of \['fp32', 'fp16', 'bf16'\] \(the dtype of the "
                            r"stored weights\). torch.autocast keeps fp32 weights"),
    ({"optimizer": "lion"}, r"optimizer='lion' is not allowed: one of \['adamw', 'sgd', 'adamw8bit', "
                            r"'paged_adamw8bit'\]"),
    ({"master_weights": True}, r"master_weights=True is not allowed: None or False with precision='fp32'. fp32 "
                               r"weights are their own master copy"),
    ({"master_weights": "yes"}, r"master_weights='yes' is not allowed: None \(the default for the precision\)"),
    ({"trainable_params": 2000}, r"trainable_params=2000 is not allowed: None or a number from 0 to num_params=1000"),
    ({"optimizer": "adamw8bit", "tensor_sizes": [10, 20]},
     r"tensor_sizes='2 sizes summing to 30' is not allowed: element counts .* summing to 1000"),
    ({"min_8bit_size": -1}, r"min_8bit_size=-1 is not allowed: an integer >= 0"),
    ({"momentum": False}, r"momentum=False is not allowed: True \(the default\) unless optimizer='sgd'. adamw has no "
                          r"momentum setting"),
])
def test_training_memory_rejects_bad_input(kwargs, match):
    kwargs = {"num_params": 1000, **kwargs}
    with pytest.raises(ConfigError, match=match):
        memory.training_memory(**kwargs)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "adamw8bit"])
def test_calculator_matches_the_measured_breakdown_to_the_byte(tiny_cfg, optimizer):
    df = memory.calculator_check(tiny_cfg.replace(optimizer=optimizer)).set_index("component")
    assert list(df.index) == ["weights", "gradients", "optimizer_state"]
    assert (df["difference_bytes"] == 0).all(), df
    assert df.loc["gradients", "measured_bytes"] == 4 * SMALL_CNN_PARAMS


def test_the_175b_optimizer_claim_is_checked_in_tb_and_tib():
    sentence = memory.optimizer_claim(175e9, (1.2, 0.3))
    assert sentence.startswith("For 175B parameters, AdamW's two fp32 moments take 1.75e+11 x 8 B = 1.4 TB (1.27 TiB); "
                               "8-bit AdamW's take 2 B per parameter plus one fp32 scale per 256 values for each "
                               "moment, 2.031 B: 0.355 TB (0.323 TiB), 3.94x less.")
    assert "The claim's 1.2 TB -> 0.3 TB match the TiB figures, rounded down and labelled TB: in TB it is 1.4 TB -> " \
           "0.355 TB. The 4x ratio is right." in sentence
    assert sentence.endswith("With the fp32 master weights (4 B per parameter, which ZeRO counts as optimizer "
                             "state) it is 2.1 TB -> 1.06 TB, only 1.99x less.")
    assert "matches when read as TB." in memory.optimizer_claim(175e9, (1.4, 0.36))
    with pytest.raises(ConfigError, match=r"claimed_tb=\(1.2,\) is not allowed: a pair of positive numbers"):
        memory.optimizer_claim(175e9, (1.2,))


# --- the staged view ------------------------------------------------------------------------------


@pytest.mark.filterwarnings(BF16_EMULATED)
def test_staged_runs_add_one_saver_at_a_time_then_all(tiny_cfg):
    staged = memory.staged_runs(tiny_cfg, precision="bf16", progress=False)
    frame = staged.frame.set_index("stage")
    assert list(staged.results) == list(frame.index) == list(memory.STAGES)
    assert frame["error"].isna().all()
    assert list(frame["precision"]) == ["fp32", "bf16", "fp32", "fp32", "bf16"]
    assert list(frame["checkpointing"]) == [False, False, True, False, True]
    assert list(frame["optimizer"]) == ["adamw", "adamw", "adamw", "adamw8bit", "adamw8bit"]
    base = frame.loc["baseline"]
    assert base["mem_optimizer_state_bytes"] == SMALL_CNN_ADAMW_STATE
    assert frame.loc["+8-bit optimizer", "mem_optimizer_state_bytes"] == SMALL_CNN_8BIT_STATE
    assert frame.loc["+AMP", "mem_activations_bytes"] < base["mem_activations_bytes"]
    assert frame.loc["+checkpointing", "mem_activations_bytes"] < base["mem_activations_bytes"]
    together = frame.loc["all together"]
    assert together["peak_memory_bytes"] < min(frame.loc[s, "peak_memory_bytes"] for s in memory.STAGES[:-1])
    assert base["state_bytes"] == base["mem_parameters_bytes"] + base["mem_gradients_bytes"] + SMALL_CNN_ADAMW_STATE
    lines = staged.finding().splitlines()
    assert len(lines) == 6 and lines[0].startswith("baseline: peak ") and lines[4].startswith("all together: peak ")
    assert "less" in lines[4]
    # the single savers ranked by the peak they saved, computed from the frame
    singles = staged.frame[staged.frame.stage.isin(["+AMP", "+checkpointing", "+8-bit optimizer"])]
    order = list(singles.sort_values("peak_memory_bytes").stage)
    assert lines[5].startswith(f"Single savers by peak saved, here: {order[0]} (")
    assert [lines[5].index(stage) for stage in order] == sorted(lines[5].index(stage) for stage in order)
    with pytest.raises(ConfigError, match=r"optimizer='adamw' is not allowed: one of \['adamw8bit', 'paged_adamw8bit'\]"):
        memory.staged_runs(tiny_cfg, optimizer="adamw")
    with pytest.raises(ConfigError, match=r"precision='fp32' is not allowed: 'fp16' or 'bf16'"):
        memory.staged_runs(tiny_cfg, precision="fp32")
    with pytest.raises(ConfigError, match=r"checkpointing=False is not allowed: True or a number of segments"):
        memory.staged_runs(tiny_cfg, checkpointing=False)

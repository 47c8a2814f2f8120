"""labkit.techniques.optimizers: each named optimizer, bitsandbytes' 8-bit AdamW, lr scaling and warm-up."""

import subprocess
import sys
import types

import pytest
import torch
from torch import nn

import labkit
from labkit import capacity, measure
from labkit.errors import ConfigError
from labkit.techniques import optimizers


@pytest.mark.parametrize("name, expected", [("adamw", "AdamW"), ("sgd", "SGD"), ("adamw8bit", "AdamW8bit")])
def test_build_optimizer_builds_each_named_optimizer(tiny_cfg, name, expected):
    model = torch.nn.Linear(64, 64)
    opt = optimizers.build_optimizer(model, name, lr=0.01)
    assert type(opt).__name__ == expected and opt.param_groups[0]["lr"] == 0.01


def test_build_optimizer_takes_plain_values_and_names_a_bad_one():
    model = torch.nn.Linear(8, 8)
    model.bias.requires_grad_(False)
    opt = optimizers.build_optimizer(model, "sgd", lr=0.1, weight_decay=0.01, momentum=0.5)
    assert opt.param_groups[0]["params"] == [model.weight]  # frozen parameters get no state
    assert (opt.param_groups[0]["momentum"], opt.param_groups[0]["weight_decay"]) == (0.5, 0.01)
    with pytest.raises(ConfigError, match=r"optimizer='lion' is not allowed: one of \['adamw', 'sgd', 'adamw8bit'"):
        optimizers.build_optimizer(model, "lion")


def test_import_labkit_does_not_import_bitsandbytes():
    code = ("import sys, labkit; from labkit.techniques import optimizers; from labkit.labs import memory_savers; "
            "sys.exit(1 if 'bitsandbytes' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_fit_with_adamw8bit_measures_the_calculated_state(small_cnn_bytes, tiny_cfg):
    plain = labkit.fit(tiny_cfg)
    res = labkit.fit(tiny_cfg.replace(optimizer="adamw8bit"))
    assert res.ok and res.losses[0] == plain.losses[0] and res.losses[1:] != plain.losses[1:]
    assert res.memory["optimizer_state"] == small_cnn_bytes.eight_bit_state
    assert res.memory["optimizer_state"] == capacity.model_training_memory(res.model, optimizer="adamw8bit")[
        "optimizer_state"]
    assert plain.memory["optimizer_state"] == small_cnn_bytes.adamw_state
    assert res.memory["optimizer_state"] / plain.memory["optimizer_state"] == pytest.approx(0.262, abs=0.001)
    assert res.memory["parameters"] == plain.memory["parameters"]
    assert res.memory["gradients"] == plain.memory["gradients"]


def test_paged_optimizer_on_the_cpu_is_refused_not_quietly_unpaged(tiny_cfg):
    bnb = optimizers.bitsandbytes_module()
    weight = nn.Parameter(torch.zeros(optimizers.MIN_8BIT_SIZE))
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
        optimizers.build_optimizer(nn.Linear(4, 4), "adamw8bit")


@pytest.fixture
def fresh_probe():
    optimizers._runs_on.cache_clear()
    yield
    optimizers._runs_on.cache_clear()


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
        optimizers.build_8bit_optimizer(nn.Linear(4, 4).parameters(), "adamw8bit")


def test_build_8bit_optimizer_rejects_bad_arguments():
    params = list(nn.Linear(4, 4).parameters())
    with pytest.raises(ConfigError,
                       match=r"optimizer='adam8' is not allowed: one of \['adamw8bit', 'paged_adamw8bit'\]"):
        optimizers.build_8bit_optimizer(params, "adam8")
    with pytest.raises(ConfigError, match=r"min_8bit_size=-1 is not allowed: an integer >= 0"):
        optimizers.build_8bit_optimizer(params, min_8bit_size=-1)
    with pytest.raises(ConfigError, match=r"params=\[\] is not allowed: at least one parameter"):
        optimizers.build_8bit_optimizer([])
    opt = optimizers.build_8bit_optimizer(params, min_8bit_size=0, lr=0.1, weight_decay=0.01)
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


def test_scale_lr_rules():
    assert optimizers.scale_lr(1e-3, 128, 32) == pytest.approx(4e-3)
    assert optimizers.scale_lr(1e-3, 128, 32, rule="sqrt") == pytest.approx(2e-3)
    assert optimizers.scale_lr(1e-3, 8, 32) == pytest.approx(2.5e-4)
    assert optimizers.scale_lr(1e-3, 128, 128) == 1e-3
    with pytest.raises(ConfigError, match=r"rule='cubic' is not allowed: 'linear' \(SGD, Goyal"):
        optimizers.scale_lr(1e-3, 128, 32, rule="cubic")
    with pytest.raises(ConfigError, match=r"base_batch_size=0 is not allowed: an integer >= 1"):
        optimizers.scale_lr(1e-3, 128, 0)


def test_warmup_lr_rises_linearly_then_leaves_the_lr_alone():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    used = []
    for step in range(6):
        optimizers.warmup_lr(optimizer, lr=1e-3, step=step, warmup_steps=4)
        used.append(optimizer.param_groups[0]["lr"])
    assert used == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    untouched = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    optimizers.warmup_lr(untouched, lr=1e-3, step=0, warmup_steps=0)  # no warm-up: nothing to set
    assert untouched.param_groups[0]["lr"] == 0.5

"""labkit.techniques.precision: resolving a precision, autocast, the GradScaler, run_in_fp32."""


import warnings

import pytest
import torch

import labkit
from labkit.techniques import precision
from labkit.techniques.precision import autocast, grad_scaler, resolve_precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("device, capability, expected", [
    (CUDA, (9, 0), "bf16"),   # H100/H200
    (CUDA, (8, 0), "bf16"),   # A100
    (CUDA, (7, 5), "fp16"),   # T4: tensor cores, no native bf16
    (CUDA, (6, 0), "fp32"),   # P100: no tensor cores
])
def test_auto_precision_by_capability(device, capability, expected):
    assert resolve_precision("auto", device, capability).name == expected


def test_auto_precision_on_a_cpu_follows_its_bf16_instructions():
    with labkit.machine.described("cpu_avx2"):  # bf16 by conversion: slower than fp32
        assert resolve_precision("auto", CPU).name == "fp32"
    with labkit.machine.described("cpu_bf16"):  # AVX512-BF16 or AMX: faster than fp32 (notebook 01)
        assert resolve_precision("auto", CPU).name == "bf16"


def test_bf16_without_native_support_warns():
    p = resolve_precision("bf16", CUDA, (7, 5))
    assert p.name == "bf16" and "emulated" in p.warning and "7.5" in p.warning and "fp16 with a GradScaler" in p.warning
    p100 = resolve_precision("bf16", CUDA, (6, 0))
    assert "no tensor cores either, so fp32" in p100.warning
    assert resolve_precision("bf16", CUDA, (8, 0)).warning is None
    # emulated: the run is cut to the profile's emulated_steps (a T4's bf16), a P100's fp16 is real arithmetic
    assert p.emulated and p100.emulated and not resolve_precision("bf16", CUDA, (8, 0)).emulated
    assert not resolve_precision("fp16", CUDA, (6, 0)).emulated


def test_fp16_without_tensor_cores_warns():
    assert "no tensor cores" in resolve_precision("fp16", CUDA, (6, 0)).warning
    assert resolve_precision("fp16", CUDA, (7, 5)).warning is None


def test_scaler_only_for_fp16_and_autocast_dtype():
    assert grad_scaler(resolve_precision("fp16", CPU), CPU).is_enabled()
    assert not grad_scaler(resolve_precision("bf16", CPU), CPU).is_enabled()
    with autocast(resolve_precision("bf16", CPU), CPU):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast(resolve_precision("fp32", CPU), CPU):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32


@pytest.mark.parametrize("name, flag", [("fp16", "cpu_fp16_native"), ("bf16", "cpu_bf16_native")])
def test_cpu_low_precision_without_instructions_warns(monkeypatch, name, flag):
    monkeypatch.setattr(precision, flag, lambda: False)
    p = resolve_precision(name, CPU)
    assert p.name == name  # runs as asked (emulated), not as fp32
    assert p.warning.startswith(f"{name} on this CPU is emulated") and "slower than fp32" in p.warning
    assert p.emulated
    monkeypatch.setattr(precision, flag, lambda: True)
    assert resolve_precision(name, CPU).warning is None and not resolve_precision(name, CPU).emulated
    monkeypatch.setattr(precision, flag, lambda: None)  # cannot tell (not Linux): no claim either way
    assert resolve_precision(name, CPU).warning is None and not resolve_precision(name, CPU).emulated


def test_fp16_on_cpu_warning_reaches_the_result_and_a_note(monkeypatch, tiny_cfg, capsys):
    monkeypatch.setattr(precision, "cpu_fp16_native", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = labkit.fit(tiny_cfg.replace(precision="fp16", batch_size=8, evaluate=False), progress=False)
    assert capsys.readouterr().out.startswith("labkit note: fp16 on this CPU is emulated")
    assert res.precision_used == "fp16" and any("emulated" in w for w in res.warnings)


def test_run_in_fp32_inside_autocast_matches_float32_gradients():
    def fn(a, b):
        return (a @ b).exp().sum(-1).log()

    torch.manual_seed(0)
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3)
    expected = fn(a, b)
    expected.sum().backward()
    grad = a.grad.clone()
    a.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fn(a, b).dtype == torch.bfloat16  # the matmul ran in bf16
        out = precision.run_in_fp32(fn, a, b)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    torch.testing.assert_close(a.grad, grad)


def test_run_in_fp32_passes_gradients_back_to_a_low_precision_input():
    # The usual case: the input is an autocast matmul's bf16 output, cast to float32 inside the Function.
    def fn(t):
        return t.exp().sum(-1).log()

    torch.manual_seed(0)
    x = (torch.randn(4, 16) / 4).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = x @ x.T
        assert inside.dtype == torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            expected = fn(inside.float())
        out = precision.run_in_fp32(fn, inside)
    (want,) = torch.autograd.grad(expected.sum(), x, retain_graph=True)  # the matmul is shared
    (got,) = torch.autograd.grad(out.sum(), x)
    assert got.abs().sum() > 0
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("env, expected", [
    ({"device": "cuda", "bf16": True}, "bf16"), ({"device": "cuda", "bf16": False}, "fp16"),
    ({"device": "cpu", "bf16": True, "fp16_native": False}, "bf16"),
    ({"device": "cpu", "bf16": False, "fp16_native": True}, "fp16"),
])
def test_low_precision_for(env, expected):
    assert precision.low_precision_for(env) == expected

import pytest
import torch

from labkit.techniques.precision import autocast, grad_scaler, resolve_precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("device, capability, expected", [
    (CUDA, (9, 0), "bf16"),   # H100/H200
    (CUDA, (8, 0), "bf16"),   # A100
    (CUDA, (7, 5), "fp16"),   # T4: tensor cores, no native bf16
    (CUDA, (6, 0), "fp32"),   # P100: no tensor cores
    (CPU, None, "fp32"),
])
def test_auto_precision_by_capability(device, capability, expected):
    assert resolve_precision("auto", device, capability).name == expected


def test_bf16_without_native_support_warns():
    p = resolve_precision("bf16", CUDA, (7, 5))
    assert p.name == "bf16" and "emulated" in p.warning and "7.5" in p.warning and "fp16 with a GradScaler" in p.warning
    p100 = resolve_precision("bf16", CUDA, (6, 0))
    assert "no tensor cores either, so fp32" in p100.warning
    assert resolve_precision("bf16", CUDA, (8, 0)).warning is None


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

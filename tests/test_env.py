import json

import pytest
import torch

import labkit
from labkit import env
from labkit.errors import ConfigError


def test_env_report_is_a_json_serialisable_dict():
    rep = labkit.env_report()
    assert isinstance(rep, dict)
    json.dumps(rep)
    for key in ("device", "gpu", "capability", "gpu_memory_bytes", "bf16", "tensor_cores", "tf32_matmul",
                "tf32_conv", "platform", "profile", "torch", "torchvision", "labkit"):
        assert key in rep
    assert rep["device"] == "cpu" and rep["gpu"] is None and rep["profile"] == "ci"
    assert rep["torch"] == torch.__version__ and rep["labkit"] == labkit.__version__
    assert "device" in str(rep) and "<table>" in rep._repr_html_()


@pytest.mark.parametrize("capability, bf16, tensor_cores", [
    ((6, 0), False, False),  # P100
    ((7, 0), False, True),   # V100
    ((7, 5), False, True),   # T4: bf16 only through emulation
    ((8, 0), True, True),    # A100
    ((9, 0), True, True),    # H100/H200
    (None, False, False),
])
def test_bf16_and_tensor_cores_by_capability(capability, bf16, tensor_cores):
    assert env.native_bf16(capability) is bf16
    assert env.has_tensor_cores(capability) is tensor_cores


def test_profiles_and_default(monkeypatch):
    assert labkit.profile().name == "ci"
    monkeypatch.delenv("LABKIT_PROFILE")
    assert labkit.profile().name == ("full" if torch.cuda.is_available() else "quick")
    sizes = [labkit.profile(n).train_size for n in ("ci", "quick", "full")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3


def test_unknown_profile(monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "turbo")
    with pytest.raises(ConfigError, match=r"LABKIT_PROFILE='turbo' is not allowed: one of \['ci', 'full', 'quick'\]"):
        labkit.profile()


def test_cuda_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device='cuda' is not allowed.*no CUDA GPU"):
        env.resolve_device("cuda")
    assert env.resolve_device("auto").type == "cpu"


@pytest.mark.parametrize("variables, expected", [
    ({"COLAB_RELEASE_TAG": "x"}, "colab"),
    ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, "kaggle"),
])
def test_platform_detection(monkeypatch, variables, expected):
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    assert env.detect_platform() == expected


def test_tf32_is_set_explicitly_and_recorded():
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    try:
        env.set_tf32(True)
        assert env.tf32_state() == {"matmul": True, "conv": True}
        env.set_tf32(False)
        assert env.tf32_state() == {"matmul": False, "conv": False}
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = before


@pytest.mark.parametrize("check, flags, expected", [
    ("cpu_bf16_native", "fpu avx2 avx512f", False), ("cpu_bf16_native", "fpu avx512f avx512_bf16", True),
    ("cpu_bf16_native", "fpu amx_bf16 amx_tile", True), ("cpu_fp16_native", "fpu avx512f avx512_bf16", False),
    ("cpu_fp16_native", "fpu avx512_fp16", True), ("cpu_fp16_native", "fpu amx_fp16 amx_tile", True),
])
def test_cpu_low_precision_is_native_only_with_its_instructions(tmp_path, check, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert getattr(env, check)(str(cpuinfo)) is expected
    assert getattr(env, check)(str(tmp_path / "missing")) is None


def test_cpu_report_says_whether_fp16_is_native():
    report = env.env_report("cpu")
    assert report["fp16_native"] is env.cpu_fp16_native()


def test_profiles_have_batch_sizes_and_sweep_epochs():
    assert [(p.batch_sizes, p.sweep_epochs) for p in (labkit.profile(n) for n in ("ci", "quick", "full"))] == [
        ((8, 16, 32, 64), 1), ((8, 16, 32, 64, 128, 256), 2), ((8, 16, 32, 64, 128, 256), 3)]
    assert labkit.env_report()["profile"] == "ci"

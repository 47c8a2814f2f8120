import json
import re
import warnings
from pathlib import Path

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


@pytest.fixture
def restore_tf32():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("enabled", [True, False])
def test_tf32_is_set_explicitly_and_both_apis_read_it(restore_tf32, enabled):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.set_tf32(enabled)
        assert env.tf32_state() == {"matmul": enabled, "conv": enabled}
        # torch.compile and other code read the legacy getters: they must not raise "mix of ... APIs"
        assert torch.backends.cuda.matmul.allow_tf32 is enabled
        assert torch.backends.cudnn.allow_tf32 is enabled
        assert torch.get_float32_matmul_precision() == ("high" if enabled else "highest")
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch 2.9+: the new switches agree
        assert torch.backends.cuda.matmul.fp32_precision == ("tf32" if enabled else "ieee")


def test_tf32_set_after_the_new_api_was_used_reads_consistently(restore_tf32):
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("torch < 2.9 has no fp32_precision switches")
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # other code used only the new API
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    assert env.tf32_state() == {"matmul": True, "conv": False}  # read from the new switches
    env.set_tf32(False)
    assert torch.get_float32_matmul_precision() == "highest" and env.tf32_state() == {"matmul": False, "conv": False}


def fake_gpu(monkeypatch, capability, archs, name="Tesla P100-PCIE-16GB"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: archs)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)


MODERN_BUILD = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


@pytest.mark.parametrize("capability, archs, usable", [
    ((6, 0), MODERN_BUILD, False),                       # Kaggle's P100 with a torch built from Volta on
    ((6, 0), ["sm_50", "sm_60", "sm_70"], True),
    ((7, 5), MODERN_BUILD, True),                        # a T4
    ((8, 9), ["sm_80", "sm_86"], True),                  # sm_86 kernels run on an 8.9 card (same major)
    ((8, 6), ["sm_70", "sm_90", "compute_90"], False),   # neither a binary nor PTX it can take
    ((8, 6), ["sm_70", "compute_80"], True),             # PTX for 8.0 is compiled for 8.6 at first use
    ((7, 5), [], True),                                  # a build that lists nothing: trusted
    ((9, 0), ["sm_80", "sm_90a"], True),                 # suffixed names (sm_90a, sm_120f) count too
    ((12, 0), ["sm_90", "sm_120f"], True),
    ((10, 0), ["sm_90", "sm_120"], False),
])
def test_gpu_architectures_are_checked_against_the_build(monkeypatch, capability, archs, usable):
    fake_gpu(monkeypatch, capability, archs)
    assert (env.cuda_arch_problem() is None) is usable
    assert env.cuda_usable() is usable


def test_a_rocm_build_is_not_checked_against_cuda_names(monkeypatch):
    fake_gpu(monkeypatch, (9, 0), ["gfx90a", "gfx942"], name="AMD Instinct MI300X")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert env.cuda_arch_problem() is None


def test_a_gpu_index_that_does_not_exist_is_a_clear_error(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), MODERN_BUILD)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"device='cuda:3' is not allowed: 'auto', 'cpu' or 'cuda:N' with N < 1"):
        env.resolve_device("cuda:3")


def test_a_gpu_this_torch_cannot_run_on_falls_back_to_the_cpu_saying_why(monkeypatch, capsys):
    fake_gpu(monkeypatch, (6, 0), MODERN_BUILD)
    monkeypatch.delenv("LABKIT_PROFILE", raising=False)
    assert env.resolve_device("auto") == torch.device("cpu")
    printed = " ".join(capsys.readouterr().out.split())
    assert printed.startswith("labkit note: running on the CPU: the GPU Tesla P100-PCIE-16GB (sm_60) has no kernels")
    assert "supports sm_70, sm_75" in printed and "'GPU T4 x2'" in printed
    assert env.profile().name == "quick"  # the CPU's profile, not the GPU's
    with pytest.raises(ConfigError, match=r"device='cuda' is not allowed: 'auto' or 'cpu': the GPU Tesla P100.*sm_60"):
        env.resolve_device("cuda")


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
        ((8, 16, 32, 64), 1), ((8, 16, 32, 64, 128, 256), 2), ((8, 16, 32, 64, 128, 256), 2)]
    assert labkit.env_report()["profile"] == "ci"


@pytest.mark.parametrize("version, ok", [("2.4.1+cu121", False), ("1.13.0", False), ("2.5.0", True),
                                         ("2.14.1+cu130", True), ("3.0.0a0", True)])
def test_the_torch_floor_is_what_labkit_uses(version, ok):
    if ok:
        env.check_torch(version)
    else:
        with pytest.raises(ImportError,
                           match=r"labkit needs torch 2\.5 or newer .* this is torch " + re.escape(version)):
            env.check_torch(version)


def test_pyproject_floor_matches_min_torch():
    tomllib = pytest.importorskip("tomllib")
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert f"torch>={env.MIN_TORCH[0]}.{env.MIN_TORCH[1]}" in deps


def test_full_shrunk_is_fulls_code_path_at_cpu_size(monkeypatch):
    # make test's full-shapes part: LABKIT_PROFILE=full LABKIT_SHRINK=1
    monkeypatch.setenv("LABKIT_PROFILE", "full")
    assert labkit.profile() is env.PROFILES["full"] and not labkit.profile().shrunk
    monkeypatch.setenv("LABKIT_SHRINK", "1")
    shrunk = labkit.profile()
    assert shrunk is env.FULL_SHRUNK and shrunk.name == "full" and shrunk.shrunk
    assert (shrunk.model, shrunk.image_size is not None) == ("resnet18", True)  # full's model, its upsampling
    assert shrunk.train_size == env.PROFILES["ci"].train_size and shrunk.max_steps < env.PROFILES["ci"].max_steps
    report = labkit.env_report()
    assert report["profile"] == "full" and report["shrunk"] is True
    assert env.profile_of(report) is env.FULL_SHRUNK and env.profile_of("full") is env.FULL_SHRUNK
    assert env.profile_of({"profile": "full", "shrunk": False}) is env.PROFILES["full"]
    # a cached result of the shrunk models never stands in for the real workload's
    assert env.hardware_key(report) != env.hardware_key({**report, "shrunk": None})
    monkeypatch.setenv("LABKIT_PROFILE", "ci")
    assert labkit.profile() is env.PROFILES["ci"]  # shrinking is `full`'s alone

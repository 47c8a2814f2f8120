"""The engine's platform decisions on the machines labkit promises (DESIGN.md's platform table), described.

Each test puts labkit in a `labkit.machine.described` block and checks what it chooses there and what it prints.
These supplement a run on a real GPU; they do not replace it.
"""

import pytest
import torch

import labkit
from labkit import config, env, launcher, machine
from labkit.errors import ConfigError
from labkit.labs import distributed as lab07
from labkit.labs.quantization import methods
from labkit.techniques import precision, quantization
from labkit.techniques.distributed import default_backend

# machine: (device "auto" goes to, precision "auto" picks, profile by default, bf16 emulated)
DECISIONS = {
    "t4": ("cuda", "fp16", "full", True),
    "2xt4": ("cuda", "fp16", "full", True),
    "p100": ("cuda", "fp32", "full", True),
    "p100_no_sm60": ("cpu", "fp32", "quick", True),  # no sm_60 kernels: the CPU, and the CPU's answers
    "a100": ("cuda", "bf16", "full", False),
    "h200": ("cuda", "bf16", "full", False),
    "cpu_bf16": ("cpu", "bf16", "quick", False),  # native bf16 (AVX512-BF16/AMX): 01 measures it faster than fp32
    "cpu_avx2": ("cpu", "fp32", "quick", True),
}


@pytest.mark.parametrize("name", sorted(DECISIONS))
def test_device_precision_and_profile_on_each_described_machine(name, monkeypatch):
    monkeypatch.delenv("LABKIT_PROFILE", raising=False)
    device, auto, profile_name, emulated = DECISIONS[name]
    with machine.described(name) as here:
        resolved = env.resolve_device("auto")
        assert resolved.type == device
        assert precision.resolve_precision("auto", resolved).name == auto
        assert labkit.profile().name == profile_name
        assert precision.resolve_precision("bf16", resolved).emulated is emulated
        report = labkit.env_report()
        assert report["device"] == device and report["machine"].startswith(f"described: {name}")
        if device == "cuda":
            assert report["gpu"] == here.gpu and report["gpu_count"] == here.gpu_count
            assert report["capability"] == f"{here.capability[0]}.{here.capability[1]}"
            assert report["bf16"] is (not emulated) and report["tensor_cores"] is (here.capability >= (7, 0))
        else:
            assert report["gpu"] is None and report["bf16"] is here.cpu_bf16
    assert "machine" not in labkit.env_report()  # outside the block: this machine again


def test_bf16_on_a_t4_is_emulated_and_says_what_to_use_instead():
    with machine.described("t4"):
        chosen = precision.resolve_precision("bf16", torch.device("cuda"))
    assert chosen.emulated and "capability 7.5 is emulated" in chosen.warning and "fp16" in chosen.warning
    with machine.described("p100"):
        fp16 = precision.resolve_precision("fp16", torch.device("cuda"))
    assert "no tensor cores" in fp16.warning


def test_a_p100_without_kernels_falls_back_to_the_cpu_saying_why(capsys):
    with machine.described("p100_no_sm60"):
        assert env.resolve_device("auto").type == "cpu"
        with pytest.raises(ConfigError, match=r"device='cuda' is not allowed: 'auto' or 'cpu': the GPU Tesla P100"):
            env.resolve_device("cuda")
    printed = " ".join(capsys.readouterr().out.split())
    assert "running on the CPU: the GPU Tesla P100-PCIE-16GB (sm_60) has no kernels" in printed
    assert "'GPU T4 x2'" in printed
    with machine.described("p100"):  # the same card with a torch that still ships sm_60
        assert env.resolve_device("auto").type == "cuda"


@pytest.mark.parametrize("name, device, nproc, backend, model", [
    ("t4", "cpu", 2, "gloo", "tiny_vit"),  # one GPU: the lesson on CPU processes over gloo
    ("a100", "cpu", 12, "gloo", "tiny_vit"),
    ("2xt4", "auto", 2, "nccl", "tiny_vit"),  # offline in tests: the small workload, on the two GPUs
    ("cpu_avx2", "auto", 2, "gloo", "tiny_vit"),
])
def test_notebook_07_processes_and_backend(name, device, nproc, backend, model):
    with machine.described(name):
        cfg = lab07.workload(labkit.profile("full"))
        assert cfg.device == device and cfg.model == model
        kind = env.resolve_device(cfg.device).type
        assert launcher.max_processes(kind) == nproc and default_backend(kind) == backend
        if kind == "cuda":
            with pytest.raises(ConfigError, match=r"nproc=3 is not allowed: an integer from 1 to 2: one process "
                                                  r"per device, and this machine has 2 GPU\(s\)"):
                launcher.launch(cfg, nproc=3)


def test_the_hang_probe_runs_on_cpu_processes_with_one_gpu():
    from labkit.troubleshoot import probe_config

    cfg = labkit.RunConfig(model="small_cnn", batch_size=32)
    with machine.described("t4"):
        probed, where = probe_config(cfg, 2)
        assert probed.device == "cpu" and probed.model == launcher.VIT and probed.batch_size == 32
        assert "on 2 CPU processes over gloo" in where and "1 GPU here" in where
    with machine.described("t4", cpu_cores=1):
        probed, where = probe_config(cfg, 2)
        assert probed is None and "1 GPU(s) and 1 CPU core(s)" in where
    with machine.described("2xt4"):
        probed, where = probe_config(cfg, 2)
        assert probed.device == "auto" and probed.model == "small_cnn" and where == ""


@pytest.mark.parametrize("name, int4", [("t4", False), ("p100", False), ("a100", True), ("h200", True)])
def test_quantize_methods_offered_on_each_gpu(name, int4):
    int4 = int4 and quantization.installed_version("torchao") is not None  # the quant extra
    with machine.described(name):
        offered = quantization.available("cuda")
        assert ("int4_weight_only" in offered) is int4
        assert "nf4_bnb" in offered and "fp16" in offered
        result = methods.methods_table()
        table = result.frame.set_index("method")
        assert bool(table.loc["int4_weight_only", "runs on this GPU"]) is int4
        assert "runs on this GPU" in result.show_columns()
        why = quantization.supported("int4_weight_only", "cuda")
        if quantization.installed_version("torchao") is None:
            assert not int4 or "torchao is not installed" in why
        elif not int4:
            assert "compute capability 8.0+" in why and "nf4_bnb" in why
    assert "runs on this GPU" not in methods.methods_table().frame  # this CPU


def test_full_falls_back_when_the_data_can_be_neither_read_nor_downloaded(monkeypatch, tmp_path, capsys):
    from labkit import downloads

    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LABKIT_OFFLINE", "0")  # online as far as labkit is told, but nothing answers
    downloads.host_answers.cache_clear()
    monkeypatch.setattr(downloads.socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(TimeoutError()))
    try:
        assert config.workload(labkit.profile("full")) == config.SMALL_WORKLOAD
        printed = " ".join(capsys.readouterr().out.split())
        assert "cifar10 is not on disk and its download host (www.cs.toronto.edu) did not answer within 3 s" in printed
        folder = tmp_path / "cifar-10-batches-py"
        folder.mkdir()
        for name in downloads.CIFAR10_FILES:
            (folder / name).write_bytes(b"x")
        assert config.workload(labkit.profile("full"))["dataset"] == "cifar10"  # on disk: no network needed
    finally:
        downloads.host_answers.cache_clear()


def test_a_described_machine_must_be_one_labkit_knows():
    with pytest.raises(ConfigError, match=r"machine='tpu' is not allowed: one of \['2xt4', 'a100'"):
        with machine.described("tpu"):
            pass
    assert not machine.is_described()


def test_this_machine_is_read_from_torch_and_the_cpu():
    here = machine.here()
    assert here.name == "here" and here.gpu_count == torch.cuda.device_count()
    assert here.cpu_bf16 == env.cpu_bf16_native("/proc/cpuinfo") and here.cpu_cores >= 1
    assert here.device == env.resolve_device("auto").type


def test_07_compares_losses_across_micro_batches_and_shards_only_without_batchnorm():
    assert not lab07.uses_batch_statistics(labkit.RunConfig(model="tiny_vit"))
    assert lab07.uses_batch_statistics(labkit.RunConfig(model="resnet18"))  # 07's workload at full on 2 GPUs


@pytest.mark.parametrize("name, device, half, adapters, run", [
    ("t4", "cuda", torch.float16, torch.float32, "fp16"),  # bf16 emulated; a GradScaler needs fp32 adapters
    ("a100", "cuda", torch.bfloat16, torch.bfloat16, "bf16"),
    ("cpu_avx2", "cpu", torch.bfloat16, torch.bfloat16, "bf16"),
])
def test_qlora_computes_in_the_devices_native_16_bit_type(name, device, half, adapters, run):
    from labkit.labs.lora import qlora

    with machine.described(name):
        assert qlora.qlora_dtypes(torch.device(device)) == (half, adapters, run)


def test_a_t4_has_the_memory_torch_reports_and_budgets_read_the_described_machine():
    # 16 GB on the box, 14.56-14.75 GiB in torch.cuda.get_device_properties(0).total_memory
    from labkit.capacity import lm_fits

    with machine.described("t4"):
        assert round(machine.gpu_budget_bytes() / machine.GIB, 2) == 14.56
        assert lm_fits.own_gpu_bytes() == machine.T4_TORCH_BYTES == lm_fits.T4_USABLE_BYTES
        table = lm_fits.fits_table()
        assert (table.fits_your_gpu == table.fits_t4).all()  # "your GPU" is the described T4
    with machine.described("h200"):
        assert (lm_fits.fits_table().fits_your_gpu == "yes").all()
    with machine.described("cpu_avx2"):
        assert machine.gpu_budget_bytes() is None and (lm_fits.fits_table().fits_your_gpu == "no GPU").all()
    assert machine.DESCRIBED["2xt4"].gpu_memory_bytes == machine.T4_TORCH_BYTES  # per GPU


def test_a_model_that_needs_15_gib_does_not_fit_a_t4():
    from labkit.capacity import lm_fits

    table = lm_fits.fits_table(gpu_bytes=15 * machine.GIB)
    between = table[(table.total_bytes > machine.T4_TORCH_BYTES) & (table.total_bytes <= 15 * machine.GIB)]
    assert (between.fits_t4 == "no").all() and (between.fits_your_gpu == "yes").all()


@pytest.mark.parametrize("name, problem", [("t4", None), ("a100", None), ("p100", "capability 7.0 or newer")])
def test_compile_is_refused_below_volta_where_triton_cannot_build(monkeypatch, name, problem):
    from labkit.techniques import compiling

    monkeypatch.setattr(compiling.importlib.util, "find_spec", lambda name: object())  # Triton "installed"
    with machine.described(name):
        why = compiling.compile_problem(torch.device("cuda"))
    assert why is None if problem is None else problem in why and "6.0" in why


@pytest.mark.parametrize("name, expected", [("p100", "fp16"), ("t4", "fp16"), ("a100", "bf16"),
                                            ("cpu_avx2", "bf16"), ("cpu_bf16", "bf16")])
def test_notebook_09_profiles_the_low_precision_this_machine_would_use(name, expected):
    from labkit.labs.recipe.profiler import profiler_precision

    with machine.described(name):
        assert profiler_precision(labkit.RunConfig(device="auto")) == expected  # never bf16 on a pre-Ampere GPU


def test_notebook_07_on_cpu_processes_at_full_avoids_batchnorm(monkeypatch, capsys):
    # `full`'s ResNet-18 on CPU processes: no SyncBatchNorm over gloo, so one process and two would differ
    monkeypatch.setattr(config, "workload", lambda prof=None: {"model": "resnet18", "dataset": "shapes10",
                                                               "image_size": 48, "batch_size": 32})
    with machine.described("cpu_avx2"):
        cfg = lab07.workload(labkit.profile("full"))
    assert cfg.model == launcher.VIT and cfg.dataset == "shapes10"
    assert "BatchNorm's statistics stay per rank" in " ".join(capsys.readouterr().out.split())


def test_described_gpus_have_the_kernels_the_installed_pypi_wheel_has():
    # torch 2.14.1 from PyPI is the CUDA 13.0 build: sm_75 to sm_120, no Volta, no PTX
    flags = getattr(torch._C, "_cuda_getArchFlags", lambda: "")()
    if not (torch.version.cuda or "").startswith("13.") or not flags:
        pytest.skip("not a CUDA 13 build of torch")
    assert tuple(flags.split()) == machine.NEW_ARCHS
    assert machine.arch_problem((7, 0), machine.NEW_ARCHS, "Tesla V100", "2.14.1") is not None  # Volta: none

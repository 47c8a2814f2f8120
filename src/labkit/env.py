"""What we run on: device, GPU, capability, bf16/tensor-core support, platform and profile.

A `Profile` shrinks the work, never skips a code path. Its ``emulated_steps`` caps a run whose precision the
device can only emulate (fp16/bf16 on a CPU without the instructions is 10-20x slower than fp32): its step time
and memory are measured as usual, over fewer steps, so that a notebook keeps its time budget; the run records
and says that it was cut. Its ``sweep_epochs`` runs are epoch-based, so that every batch size sees the same data
and a larger batch takes fewer, larger steps. Its workload (``model``, ``dataset``, ``image_size``,
``batch_size``; `labkit.config.baseline`): ``ci`` and ``quick`` fine-tune the small ``small_cnn`` on 32x32
``shapes10``, which runs offline in seconds; ``full`` fine-tunes an ImageNet-pretrained ResNet-18 on CIFAR-10
upsampled to ``image_size``, where a T4 is busy and the techniques' effects show.
"""

from __future__ import annotations

import logging
import os
import platform as _platform
import re
import sys
from dataclasses import asdict, dataclass, replace

import torch

from . import machine
from .errors import ConfigError
from .messages import note
from .project import __version__

# The oldest torch with what labkit uses: torch.OutOfMemoryError and torch.distributed._tools.mem_tracker
# (both 2.5). Checked: the unit tests that meet the versions and notebooks 00 and 05 pass on torch 2.5.1 (PT2E
# reported as not running there), scripts/hosted_images.toml's [floor]. pyproject.toml's floor is the same.
MIN_TORCH = (2, 5)
PROFILE_ENV = "LABKIT_PROFILE"
OFFLINE_ENV = "LABKIT_OFFLINE"
SHRINK_ENV = "LABKIT_SHRINK"


def check_torch(version: str) -> None:
    """Raise ImportError when torch ``version`` is older than `MIN_TORCH`, saying what to do.

    Example:
        >>> check_torch("2.4.1+cu121")
        Traceback (most recent call last):
        ImportError: labkit needs torch 2.5 or newer ...
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    if match and (int(match[1]), int(match[2])) < MIN_TORCH:
        raise ImportError(
            f"labkit needs torch {MIN_TORCH[0]}.{MIN_TORCH[1]} or newer (torch.OutOfMemoryError and the memory "
            f"tracker torch.distributed._tools.mem_tracker), and this is torch {version}. Upgrade torch "
            f"(`pip install -U torch torchvision`), or use a newer Colab/Kaggle image.")


check_torch(torch.__version__)


@dataclass(frozen=True)
class Profile:
    """How much work a notebook does. Shrinks the work, never skips a code path (see the module docstring)."""

    name: str  # ``ci``, ``quick`` or ``full``
    train_size: int  # samples in the training split of a dataset
    val_size: int  # samples in the validation split
    test_size: int  # samples in the test split
    max_steps: int  # the step budget of one fine-tune in the notebooks
    warmup_steps: int  # untimed plain steps before timing starts (the profiling steps come on top)
    repeats: int  # timed repetitions of latency and timing demos
    batch_sizes: tuple[int, ...]  # the batch sizes notebook 02 sweeps (`labkit.labs.batch_size.batch_sweep`)
    sweep_epochs: int  # epochs of each run in that sweep
    emulated_steps: int  # the most optimizer steps of a run whose precision the device can only emulate
    # the batch of the CPU inference-latency tables (notebook 06's every method, 08's merge): a float model emulated
    # in fp16/bf16 takes seconds per call on a CPU without those instructions, and each model is called ten times
    latency_batch: int = 64
    # the workload of the notebooks' main experiments (`labkit.config.baseline`):
    model: str = "small_cnn"
    dataset: str = "shapes10"
    image_size: int | None = None  # inputs upsampled to this size (None: the dataset's own)
    batch_size: int = 64
    # `full`'s code path with its models shrunk to CPU size (``$LABKIT_SHRINK``; `FULL_SHRUNK`): never a learner's
    shrunk: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


PROFILES = {
    # CI's 2 cores run every notebook twice (nbval, then the browser) within a 20-minute budget: half `quick`'s batch
    # and 128 test images (accuracy noise about 10 points, which the findings state) cut the notebooks' compute by
    # about a third against batch 64 and 256 images; every code path still runs.
    "ci": Profile("ci", train_size=512, val_size=128, test_size=128, max_steps=16, warmup_steps=1, repeats=5,
                  batch_sizes=(8, 16, 32, 64), sweep_epochs=1, emulated_steps=8, latency_batch=16, batch_size=32),
    "quick": Profile("quick", train_size=4096, val_size=512, test_size=1024, max_steps=160, warmup_steps=3,
                     repeats=20, batch_sizes=(8, 16, 32, 64, 128, 256), sweep_epochs=2, emulated_steps=40),
    # Sized for a T4 from FLOP counts and NVIDIA's published T4 throughput (benchmarks/size_full_workload.py):
    # a ResNet-18 step at 128x128 and batch 128 is about 0.4 TFLOP, 0.13 s in fp32 and 0.05 s in fp16.
    "full": Profile("full", train_size=10000, val_size=2000, test_size=5000, max_steps=300, warmup_steps=5,
                    repeats=50, batch_sizes=(8, 16, 32, 64, 128, 256), sweep_epochs=2, emulated_steps=150,
                    model="resnet18", dataset="cifar10", image_size=128, batch_size=128),
}
# `full`'s code path on a CPU, for `make test`'s full-shapes part (``LABKIT_PROFILE=full LABKIT_SHRINK=1``): every
# branch `full` takes (its models, its LoRA ranks and sweeps, QLoRA on a hub model) with the models shrunk but keeping
# their architecture (`labkit.models.hub.shrunk_shape`: a couple of decoder layers, tied embeddings, GQA, biases;
# `labkit.models.architectures.shrunk_resnet`: the BatchNorm ResNet-18 at half its width, on 40x40 inputs),
# random weights, generated data instead of CIFAR-10 (offline), `ci`'s training data and fewer steps: a run is its
# warm-up step, the two profiling steps and three timed ones (it checks code paths, not how well a model learns).
FULL_SHRUNK = Profile("full", train_size=512, val_size=64, test_size=64, max_steps=6, warmup_steps=1, repeats=3,
                      batch_sizes=(8, 16, 32, 64), sweep_epochs=1, emulated_steps=6, latency_batch=8,
                      model="resnet18", dataset="shapes10", image_size=40, batch_size=16, shrunk=True)


# `scripts/estimate_full.py`'s plan (``LABKIT_SHRINK=plan``): full's sizes and steps with the shrunk models, the
# generated data at full's image size in place of CIFAR-10; its ledger records each run and cuts it short.
FULL_PLAN = replace(PROFILES["full"], dataset="shapes10", shrunk=True)


def shrink_requested() -> bool:
    """True when ``$LABKIT_SHRINK`` is ``1``, ``true``, ``yes`` or ``plan``: `full`'s models are built CPU-sized."""
    return os.environ.get(SHRINK_ENV, "").strip().lower() in ("1", "true", "yes", "plan")


def _shrunk_full() -> Profile:
    return FULL_PLAN if os.environ.get(SHRINK_ENV, "").strip().lower() == "plan" else FULL_SHRUNK


def profile(name: str | None = None) -> Profile:
    """The active profile: ``name``, else ``$LABKIT_PROFILE``, else ``full`` on CUDA and ``quick`` on CPU.

    Example:
        >>> labkit.profile("ci").train_size
        512
    """
    field = "profile"
    if name is None:
        name = os.environ.get(PROFILE_ENV) or None
        field = PROFILE_ENV
    if name is None:
        name = "full" if cuda_usable() else "quick"
    if name not in PROFILES:
        raise ConfigError(field, name, f"one of {sorted(PROFILES)}")
    return _shrunk_full() if name == "full" and shrink_requested() else PROFILES[name]


def profile_of(run: dict | str | None) -> Profile | None:
    """The profile a run was made under, from its `env_report` or its profile's name (None when it names none).

    A name alone is read as the active profile when the names agree (``full`` under ``$LABKIT_SHRINK`` is
    `FULL_SHRUNK`; a result cache keeps the two apart, `hardware_key`).
    """
    report = run if isinstance(run, dict) else {"profile": run}
    name = report.get("profile")
    if name not in PROFILES:
        return None
    active = profile()
    if active.name == name and ("shrunk" not in report or bool(report["shrunk"]) == active.shrunk):
        return active
    return _shrunk_full() if name == "full" and report.get("shrunk") else PROFILES[name]


def detect_platform() -> str:
    """``colab``, ``kaggle`` or ``local``."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or os.path.isdir("/kaggle/working"):
        return "kaggle"
    return "local"


def is_online() -> bool:
    """False when ``$LABKIT_OFFLINE`` is ``1``, ``true`` or ``yes``: then labkit downloads nothing."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("1", "true", "yes")


def cuda_arch_problem(index: int = 0) -> str | None:
    """Why this torch cannot run kernels on GPU ``index`` though ``torch.cuda.is_available()``; None when it can.

    A torch build carries kernels for a list of architectures (``torch.cuda.get_arch_list()``, e.g. ``sm_75``);
    `labkit.machine.arch_problem` has the rule. A P100 (sm_60, Kaggle's GPU until 2026) with a torch built from
    sm_70 on is available, and fails at its first kernel. Inside `labkit.machine.described`, the described GPU's answer.

    Example:
        >>> cuda_arch_problem()   # None on a supported GPU
    """
    if index == 0 or machine.is_described():
        return machine.here().gpu_problem
    if torch.version.cuda is None:  # ROCm names its architectures gfx...: not ours to check
        return None
    return machine.arch_problem(tuple(torch.cuda.get_device_capability(index)), torch.cuda.get_arch_list(),
                                torch.cuda.get_device_name(index), torch.__version__)


def cuda_usable() -> bool:
    """A CUDA GPU is visible and this torch has kernels for it (`cuda_arch_problem`)."""
    return machine.here().gpu_usable


def resolve_device(device: str = "auto") -> torch.device:
    """Resolve a device name: ``auto`` -> CUDA when there is a GPU this torch can run on, else CPU.

    ``auto`` says why, once, when a GPU was there. ``cuda`` without a usable GPU is an error.
    """
    here = machine.here()
    if device == "auto":
        if not here.gpu_count:
            return torch.device("cpu")
        if here.gpu_problem is not None:
            note(f"running on the CPU: {here.gpu_problem}.")
            return torch.device("cpu")
        return torch.device("cuda")
    if device.startswith("cuda") and not here.gpu_count:
        raise ConfigError("device", device, "'auto' or 'cpu' (no CUDA GPU is visible to torch here)")
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        if index >= here.gpu_count:
            raise ConfigError("device", device, f"'auto', 'cpu' or 'cuda:N' with N < {here.gpu_count} "
                                                "(the GPUs torch sees here)")
        problem = cuda_arch_problem(index)
        if problem is not None:
            raise ConfigError("device", device, f"'auto' or 'cpu': {problem}")
        return torch.device(device)
    if device == "cpu":
        return torch.device(device)
    raise ConfigError("device", device, "'auto', 'cpu', 'cuda' or 'cuda:N'")


def native_bf16(capability: tuple[int, int] | None) -> bool:
    """bf16 runs natively from Ampere (8.0) on. A T4 (7.5) reports bf16 through emulation only."""
    return capability is not None and capability >= (8, 0)


def has_tensor_cores(capability: tuple[int, int] | None) -> bool:
    """Tensor cores arrived with Volta (7.0); a P100 (6.0) has none."""
    return capability is not None and capability >= (7, 0)


def cpu_bf16_native(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX); None when it cannot be told (not Linux).

    Args:
        cpuinfo: a ``/proc/cpuinfo`` to read (None: this machine's, or the `labkit.machine.described` one's).
    """
    if cpuinfo is None:
        return machine.here().cpu_bf16
    return machine.cpu_has({"avx512_bf16", "amx_bf16"}, cpuinfo)


def cpu_fp16_native(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has fp16 arithmetic (AVX512-FP16 or AMX-FP16); None when it cannot be told (not Linux).

    Args:
        cpuinfo: a ``/proc/cpuinfo`` to read (None: this machine's, or the `labkit.machine.described` one's).
    """
    if cpuinfo is None:
        return machine.here().cpu_fp16
    return machine.cpu_has({"avx512_fp16", "amx_fp16"}, cpuinfo)


def tf32_state() -> dict:
    """Whether float32 matmuls and convolutions may use TF32 (only matters on Ampere and later).

    Read through the ``allow_tf32`` getters, which `set_tf32` keeps valid. When other code has set only
    torch 2.9+'s ``fp32_precision`` switches, those getters raise, and the new switches are read instead.
    """
    try:
        return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "conv": bool(torch.backends.cudnn.allow_tf32)}
    except RuntimeError:  # "mix of the legacy and new APIs"
        matmul = torch.backends.cuda.matmul.fp32_precision
        conv = torch.backends.cudnn.conv.fp32_precision
        parent = torch.backends.cudnn.fp32_precision
        # "none" inherits: a cuDNN conv then follows cudnn's own setting, whose default is TF32.
        conv = parent if conv == "none" else conv
        return {"matmul": matmul == "tf32", "conv": conv in ("tf32", "none")}


def set_tf32(enabled: bool) -> None:
    """Set TF32 for matmuls and convolutions explicitly, so that torch's old and new switches agree.

    Through the ``allow_tf32`` switches, which every torch since 2.5 has: torch 2.9+ keeps its newer
    ``fp32_precision`` settings in step with them. Setting only the new ones instead leaves the old getters
    (``torch.backends.cudnn.allow_tf32``, ``torch.get_float32_matmul_precision()``, which ``torch.compile``
    reads) raising "mix of the legacy and new APIs".
    """
    torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
    torch.backends.cudnn.allow_tf32 = bool(enabled)


def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except ImportError:
        return None
    return getattr(module, "__version__", None)


class EnvReport(dict):
    """A plain dict (JSON-serialisable) that renders as a table in Jupyter and in a terminal."""

    def __str__(self) -> str:
        width = max(len(k) for k in self)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.items())

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td style='text-align:left'><b>{k}</b></td><td style='text-align:left'>{v}</td></tr>"
                       for k, v in self.items())
        return f"<table>{rows}</table>"


def env_report(device: str = "auto") -> EnvReport:
    """Describe the machine: device, GPU, capability, memory, bf16, tensor cores, TF32, platform, profile, versions.

    Example:
        >>> rep = labkit.env_report()
        >>> rep["device"], rep["bf16"]
        ('cpu', True)
    """
    dev = resolve_device(device)
    here = machine.here()
    report = EnvReport(device=dev.type, gpu=None, capability=None, gpu_memory_bytes=None)
    if machine.is_described():
        report["machine"] = f"described: {here.name}, {here.describe()}"
    if dev.type == "cuda":
        report.update(gpu=here.gpu, capability=f"{here.capability[0]}.{here.capability[1]}",
                      gpu_memory_bytes=here.gpu_memory_bytes, gpu_count=here.gpu_count)
        # torch.cuda.is_bf16_supported() says True on a T4 because it can emulate bf16; we do not count that.
        report["bf16"] = here.bf16_native
        report["bf16_emulated"] = here.bf16_emulated
        report["tensor_cores"] = here.tensor_cores
    else:
        report["gpu_count"] = 0
        # CPU autocast runs bf16 everywhere, but natively only with AVX512-BF16 or AMX instructions.
        report["bf16"] = here.cpu_bf16  # None: could not tell (no /proc/cpuinfo)
        report["bf16_emulated"] = here.cpu_bf16 is False
        report["fp16_native"] = here.cpu_fp16  # without it fp16 autocast converts around fp32 arithmetic
        report["tensor_cores"] = False
        report["cpu"] = _platform.processor() or _platform.machine()
        report["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        report["cpu_threads"] = torch.get_num_threads()
    tf32 = tf32_state()
    report["tf32_matmul"], report["tf32_conv"] = tf32["matmul"], tf32["conv"]
    report["platform"] = detect_platform()
    active = profile()
    report["profile"] = active.name
    if active.shrunk:  # `full`'s code path with CPU-sized models: its results are never the real workload's
        report["shrunk"] = True
    report["python"] = _platform.python_version()
    report["torch"] = torch.__version__
    report["torchvision"] = _version("torchvision")
    report["labkit"] = __version__
    return report


def hardware_key(report: dict) -> str:
    """What makes two measurements comparable: device, GPU, torch version, profile (shrunk or not)."""
    return "|".join(str(report.get(k)) for k in ("device", "gpu", "cpu", "torch", "profile", "shrunk"))


class _SkipUnusedKernelNotice(logging.Filter):
    """bitsandbytes logs, on import on CPUs without the optional ``kernels`` package, that it failed to load
    a faster CPU 4-bit matmul; it then runs its own PyTorch implementation, which is all labkit needs
    (8-bit optimizers use no 4-bit matmul; notebook 06 says that NF4 on a CPU runs the fallback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "gemm_4bit_forward" not in record.getMessage()


def import_bitsandbytes():
    """Import bitsandbytes without its misleading CPU-kernel notice; raises what the import raises."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_SkipUnusedKernelNotice())
    import bitsandbytes

    return bitsandbytes

"""The machine labkit runs on, as a small record, and the machines it promises to run well on, described.

Every platform decision of the engine (which precision ``auto`` picks, which profile and workload, how many
processes and which backend, which quantization methods are offered, how far a batch search may go) reads a
`Machine`: `here` describes the real one from torch and ``/proc/cpuinfo``. ``with described("t4"):`` makes
`here` answer with a described machine instead, so that the decisions for a Colab T4, Kaggle's two T4s, a P100
(refused by today's torch builds) or an H200 can be checked, and printed, on a CPU. Only decisions read it: a
tensor still goes to the real device.

Example:
    >>> with labkit.machine.described("t4"):
    ...     labkit.machine.here().device, labkit.machine.here().bf16_native
    ('cuda', False)
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass, replace

import torch

from .errors import ConfigError

GIB = 2**30


def arch_problem(capability: tuple[int, int], archs, gpu: str, torch_version: str) -> str | None:
    """Why a torch built for ``archs`` cannot run kernels on a GPU of ``capability``; None when it can.

    A GPU runs a kernel built for its own major version and an equal or lower minor one (sm_80 runs on an 8.6
    card), or PTX (``compute_XY``) of an equal or lower version, compiled when first used. A build that lists
    no architectures is trusted.

    Args:
        capability: the GPU's (major, minor). archs: ``torch.cuda.get_arch_list()``.
        gpu: the GPU's name. torch_version: ``torch.__version__`` (for the message).
    """
    archs = list(archs)
    if not archs:
        return None
    major, minor = capability
    for arch in archs:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)[a-z]?", arch)  # sm_90a, sm_120f: the suffix adds features
        if match is None:
            continue
        kind, arch_major, arch_minor = match[1], int(match[2]), int(match[3])
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return None
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return None
    return (f"the GPU {gpu} (sm_{major}{minor}) has no kernels in this torch {torch_version} build, which "
            f"supports {', '.join(archs)}; on Kaggle choose the 'GPU T4 x2' accelerator, elsewhere install a "
            f"torch build that lists sm_{major}{minor}")


@dataclass(frozen=True)
class Machine:
    """A machine as labkit's decisions see it.

    Attributes:
        name: a label (``here`` for the real one). gpu: the GPU's name, None without one.
        capability: its CUDA compute capability. gpu_memory_bytes: memory of one GPU. gpu_count: GPUs torch sees.
        arch_list: the CUDA architectures the installed torch has kernels for (empty: not told, trusted).
        cpu_bf16, cpu_fp16: the CPU has native bf16 / fp16 arithmetic (None: cannot tell). cpu_cores: usable cores.
        torch_version: the installed torch. rocm: a ROCm build (its GPUs are not checked against CUDA names).
    """

    name: str
    gpu: str | None = None
    capability: tuple[int, int] | None = None
    gpu_memory_bytes: int | None = None
    gpu_count: int = 0
    arch_list: tuple[str, ...] = ()
    cpu_bf16: bool | None = None
    cpu_fp16: bool | None = None
    cpu_cores: int = 2
    torch_version: str = torch.__version__
    rocm: bool = False

    @property
    def gpu_problem(self) -> str | None:
        """Why the GPU cannot be used although torch sees it (no kernels for it in this build); None otherwise."""
        if not self.gpu_count or self.rocm or self.capability is None:
            return None
        return arch_problem(self.capability, self.arch_list, self.gpu or "GPU", self.torch_version)

    @property
    def gpu_usable(self) -> bool:
        return self.gpu_count > 0 and self.gpu_problem is None

    @property
    def device(self) -> str:
        """``cuda`` when a GPU can run labkit's kernels, else ``cpu``: where ``device="auto"`` goes."""
        return "cuda" if self.gpu_usable else "cpu"

    @property
    def tensor_cores(self) -> bool:
        """Tensor cores arrived with Volta (7.0); a P100 (6.0) has none, nor has a CPU."""
        return self.device == "cuda" and self.capability >= (7, 0)

    @property
    def bf16_native(self) -> bool | None:
        """bf16 arithmetic in hardware: Ampere (8.0) and later GPUs, CPUs with AVX512-BF16 or AMX."""
        if self.device == "cuda":
            return self.capability >= (8, 0)
        return self.cpu_bf16

    @property
    def fp16_native(self) -> bool | None:
        """fp16 arithmetic in hardware: every CUDA GPU labkit runs on, CPUs with AVX512-FP16 or AMX-FP16."""
        return True if self.device == "cuda" else self.cpu_fp16

    @property
    def bf16_emulated(self) -> bool:
        """bf16 runs, by conversion, without the hardware: a T4 (``torch.cuda.is_bf16_supported()`` says True)."""
        return self.bf16_native is False

    def describe(self) -> str:
        """One line: the GPU(s) with capability and memory, or the CPU with its bf16 support."""
        if self.device == "cuda":
            count = f"{self.gpu_count} x " if self.gpu_count > 1 else ""
            memory = f", {self.gpu_memory_bytes / GIB:.0f} GiB" if self.gpu_memory_bytes else ""
            return f"{count}{self.gpu} (sm_{self.capability[0]}{self.capability[1]}{memory})"
        bf16 = {True: "native bf16", False: "bf16 emulated", None: "bf16 support unknown"}[self.cpu_bf16]
        unusable = f"; its GPU is not usable: {self.gpu_problem}" if self.gpu_problem else ""
        return f"a CPU with {self.cpu_cores} core(s), {bf16}{unusable}"


# The installed torch's kernels as today's PyPI wheels ship them (CUDA 13.0: no sm_60, no sm_70, no PTX; read from
# torch 2.14.1+cu130 and 2.11.0+cu130 here), and an older build (torch 2.5 cu121) that still had sm_60: a P100
# (Kaggle's GPU until 2026, when "GPU T4 x2" became its only one) runs only with the second.
NEW_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")  # PyPI's CUDA 13.0 wheels (torch 2.11, 2.14)
OLD_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "compute_90")

# A T4 as torch sees it: the 16 GB card's total_memory is 14.56-14.75 GiB once the driver and ECC take theirs (OOM
# messages in unslothai/unsloth#465; Unsloth's Kaggle T4 trace: gpu_total_gb 14.6). The lower figure, so that what
# fits a described T4 fits every real one.
T4_TORCH_BYTES = round(14.56 * GIB)

DESCRIBED = {
    m.name: m for m in (
        Machine("t4", "Tesla T4", (7, 5), T4_TORCH_BYTES, 1, NEW_ARCHS, cpu_bf16=False, cpu_fp16=False),
        Machine("2xt4", "Tesla T4", (7, 5), T4_TORCH_BYTES, 2, NEW_ARCHS, cpu_bf16=False, cpu_fp16=False,
                cpu_cores=4),
        Machine("p100", "Tesla P100-PCIE-16GB", (6, 0), 16 * GIB, 1, OLD_ARCHS, cpu_bf16=False, cpu_fp16=False),
        Machine("p100_no_sm60", "Tesla P100-PCIE-16GB", (6, 0), 16 * GIB, 1, NEW_ARCHS, cpu_bf16=False,
                cpu_fp16=False),
        Machine("a100", "NVIDIA A100-SXM4-40GB", (8, 0), 40 * GIB, 1, NEW_ARCHS, cpu_bf16=False, cpu_fp16=False,
                cpu_cores=12),
        Machine("h200", "NVIDIA H200", (9, 0), 139 * GIB, 1, NEW_ARCHS, cpu_bf16=True, cpu_fp16=True,
                cpu_cores=16),
        Machine("cpu_bf16", cpu_bf16=True, cpu_fp16=False),  # AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4)
        Machine("cpu_avx2", cpu_bf16=False, cpu_fp16=False),  # AVX2 only: bf16 and fp16 by conversion
    )
}

_described: list[Machine] = []  # the innermost `described` block's machine last


def _cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    try:
        with open(cpuinfo) as handle:
            return set(next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), []))
    except OSError:
        return None


def cpu_has(wanted: set[str], cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU has any of the instruction-set flags ``wanted``; None when it cannot be told (not Linux)."""
    flags = _cpu_flags(cpuinfo)
    return None if flags is None else bool(wanted & flags)


def cpu_cores() -> int:
    """The CPU cores this process may use (the container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def _cpu_record() -> tuple[bool | None, bool | None]:
    return cpu_has({"avx512_bf16", "amx_bf16"}), cpu_has({"avx512_fp16", "amx_fp16"})


def here() -> Machine:
    """This machine, read from torch (the first GPU) and the CPU's flags; or the `described` one in its block."""
    if _described:
        return _described[-1]
    bf16, fp16 = _cpu_record()
    values = {"cpu_bf16": bf16, "cpu_fp16": fp16, "cpu_cores": cpu_cores(), "rocm": torch.version.cuda is None}
    if torch.cuda.is_available():
        values.update(gpu=torch.cuda.get_device_name(0), capability=tuple(torch.cuda.get_device_capability(0)),
                      gpu_count=torch.cuda.device_count(), arch_list=tuple(torch.cuda.get_arch_list()))
        try:
            values["gpu_memory_bytes"] = int(torch.cuda.get_device_properties(0).total_memory)
        except (RuntimeError, AssertionError):  # a GPU without kernels here may not answer
            values["gpu_memory_bytes"] = None
    return Machine("here", **values)


def gpu_budget_bytes() -> int | None:
    """The memory a run may use on this machine's first GPU, None without one: a described machine's memory (as
    torch reports it), or on a real GPU what the driver says is free (``torch.cuda.mem_get_info``) plus what this
    process's allocator already holds and can reuse; another process's share, or the CUDA context's, is not ours.

    Example:
        >>> with described("t4"):
        ...     round(gpu_budget_bytes() / GIB, 2)
        14.56
    """
    if _described:
        return _described[-1].gpu_memory_bytes if _described[-1].gpu_count else None
    if not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info(0)
    return int(free + torch.cuda.memory_reserved(0))


@contextlib.contextmanager
def described(machine: str | Machine, **changes):
    """Inside the block, `here` answers with a described machine, so that decisions are made as there.

    Args:
        machine: a name of `DESCRIBED` (``t4``, ``2xt4``, ``p100``, ``p100_no_sm60``, ``a100``, ``h200``,
            ``cpu_bf16``, ``cpu_avx2``) or a `Machine`.
        changes: fields to change on it (e.g. ``gpu_count=4``).
    """
    if isinstance(machine, str):
        if machine not in DESCRIBED:
            raise ConfigError("machine", machine, f"one of {sorted(DESCRIBED)} or a labkit.machine.Machine")
        machine = DESCRIBED[machine]
    if not isinstance(machine, Machine):
        raise ConfigError("machine", machine, f"one of {sorted(DESCRIBED)} or a labkit.machine.Machine")
    _described.append(replace(machine, **changes))
    try:
        yield _described[-1]
    finally:
        _described.pop()


def is_described() -> bool:
    """True inside a `described` block: decisions follow a machine that is not this one."""
    return bool(_described)

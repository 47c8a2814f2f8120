"""The GPU a learner's fine-tune is planned for: a name (``t4``, ``kaggle-2xt4``, ``this``) or a size (``24GiB``).

A target is the memory one process may use (a T4 as torch sees it, 14.56 GiB; Kaggle's two T4s per GPU, each
process holding a whole copy under DDP), the number of GPUs, the datasheet name (for its peak FLOP/s) and the
precision a run there takes: fp16 autocast on a T4 (no native bf16), bf16 where a size is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import machine
from ..errors import ConfigError
from ..units import GIB

NAMED = ("t4", "kaggle-2xt4", "this")
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|GB|G|MiB|MB)\s*$", re.IGNORECASE)
UNITS = {"gib": GIB, "g": GIB, "gb": 1e9, "mib": 2**20, "mb": 1e6}


@dataclass(frozen=True)
class Target:
    """Where the run is planned: ``label`` (in words), ``memory_bytes`` one process may use, ``gpus``, ``gpu_name``
    (datasheet FLOP/s; None: unknown) and ``precision`` (autocast there)."""

    label: str
    memory_bytes: int
    gpus: int = 1
    gpu_name: str | None = None
    precision: str = "bf16"

    @property
    def on_gpu(self) -> bool:
        return self.gpu_name is not None


def parse_target(spec: str | int | Target | None = None) -> Target:
    """``spec`` as a `Target`: ``t4``, ``kaggle-2xt4``, ``this`` (this machine's first GPU, what is free on it), a
    size such as ``24GiB``, a number of bytes, or None (``this`` on a GPU, else ``t4``).

    Example:
        >>> parse_target("kaggle-2xt4").gpus
        2
    """
    if isinstance(spec, Target):
        return spec
    if spec is None:
        spec = "this" if machine.gpu_budget_bytes() is not None else "t4"
    if isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        return Target(f"{spec / GIB:.3g} GiB", spec)
    allowed = f"one of {list(NAMED)}, a size such as '24GiB', or a number of bytes"
    if not isinstance(spec, str):
        raise ConfigError("gpu", spec, allowed)
    name = spec.strip().lower()
    if name == "t4":
        return Target("a T4 (Colab; 14.56 GiB as torch sees it)", machine.T4_TORCH_BYTES, 1, "Tesla T4", "fp16")
    if name in ("kaggle-2xt4", "2xt4"):
        return Target("Kaggle's two T4s (14.56 GiB each as torch sees it)", machine.T4_TORCH_BYTES, 2, "Tesla T4",
                      "fp16")
    if name == "this":
        budget = machine.gpu_budget_bytes()
        if budget is None:
            raise ConfigError("gpu", spec, allowed.replace("'this', ", ""), "this machine has no GPU")
        here = machine.here()
        return Target(f"this {here.gpu} ({budget / GIB:.3g} GiB free)", budget, 1, here.gpu,
                      "bf16" if here.bf16_native else "fp16")
    if (match := SIZE.match(spec)) is not None:
        size = float(match.group(1)) * UNITS[match.group(2).lower()]
        if size > 0:
            return Target(f"{match.group(1)} {match.group(2)}", int(size))
    raise ConfigError("gpu", spec, allowed)

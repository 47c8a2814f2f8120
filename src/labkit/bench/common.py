"""What every bench part shares: a part's payload, the profile it runs at, where and how its file is written."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
from pathlib import Path

import torch

from ..env import PROFILE_ENV
from ..labresult import LabResult
from ..results import REFERENCE_DIR, write_reference

# What a GPU without a budget is searched against: a T4's usable memory, so that the search meets a real
# out-of-memory error (and backs off from it) even on a much larger GPU.
EMULATED_GPU_BYTES = 15 * 2**30
CPU_BUDGET_BYTES = 64 * 2**20  # notebook 02's pretend GPU
# The most steps of a suite run (5 warm-up, 2 profiling, 33 timed at `full`: a median and a p10-p90 spread), and the
# most timed rounds of a measurement that repeats one operation (AdamW's step alone)
SUITE_STEPS = 40
# The machine's report fields a measured file keeps beside write_reference's own (GPU, date, profile, versions).
PROVENANCE_FIELDS = ("device", "gpu", "capability", "gpu_memory_bytes", "gpu_count", "bf16", "cpu", "cpu_threads",
                     "platform", "torch", "torchvision", "labkit", "python")


@dataclasses.dataclass
class Part:
    """One reference file: runs (RunResults), or ready-made rows (a DataFrame, or an experiment's result: its frame,
    with its finding added to the extras), and extras.

    ``not_run`` says why a part measured nothing here (e.g. DDP on one GPU); such a part writes no file.
    """

    name: str
    runs: list = dataclasses.field(default_factory=list)
    rows: object = None
    extras: dict = dataclasses.field(default_factory=dict)
    not_run: str | None = None

    def __post_init__(self):
        if isinstance(self.rows, LabResult):
            self.extras.setdefault("finding", str(self.rows.finding()))
            self.rows = self.rows.frame


def records(frame) -> list[dict]:
    """A DataFrame (or an experiment's result: its frame) as JSON-ready records (numpy scalars become Python
    numbers, NaN becomes null)."""
    frame = frame.frame if isinstance(frame, LabResult) else frame
    return json.loads(frame.to_json(orient="records"))


@contextlib.contextmanager
def profile_env(profile_name: str):
    """Set ``LABKIT_PROFILE`` meanwhile (fit reads the profile from the environment); restore the caller's after."""
    previous = os.environ.get(PROFILE_ENV)
    os.environ[PROFILE_ENV] = profile_name
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PROFILE_ENV, None)
        else:
            os.environ[PROFILE_ENV] = previous


@contextlib.contextmanager
def memory_cap(device, cap_bytes: int):
    """Limit this process's share of the GPU to ``cap_bytes`` (no-op on a smaller GPU or a CPU)."""
    if device.type != "cuda":
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def machine_slug(env: dict) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``; ``"cpu"`` without a GPU: the file names' machine part."""
    return re.sub(r"[^a-z0-9]+", "-", (env.get("gpu") or "cpu").lower()).strip("-")


def reference_path(out_dir: Path | None, notebook: str, part: str, env: dict) -> Path:
    """``<out_dir>/<notebook>-<part>-<gpu-slug>-<date>.json`` (default folder: the shipped references)."""
    today = datetime.date.today().isoformat()
    return Path(out_dir or REFERENCE_DIR) / f"{notebook}-{part}-{machine_slug(env)}-{today}.json"


def provenance(env: dict) -> dict:
    """The machine a file was measured on: the report's fields, and the CUDA, cuDNN and NCCL builds torch uses."""
    found = {k: env.get(k) for k in PROVENANCE_FIELDS}
    found["cuda"] = torch.version.cuda
    found["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:  # a build without NCCL (CPU-only, Windows) has no version to give
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    except (AttributeError, RuntimeError):
        nccl = None
    found["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    found["date"] = datetime.date.today().isoformat()
    return found


def write_part(part: Part, notebook: str, out_dir: Path | None, env: dict) -> Path:
    """Write one part as a reference file labelled with the machine (`provenance` under ``extras["env"]``)."""
    path = reference_path(out_dir, notebook, part.name, env)
    extras = {**part.extras, "env": provenance(env)}
    return write_reference(part.runs, path, extras=extras, rows=part.rows, env=env)

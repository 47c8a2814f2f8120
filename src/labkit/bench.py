"""`labkit bench`: the notebooks' experiments at the ``full`` profile, saved as reference results
(``src/labkit/assets/reference/<notebook>-<part>-<gpu>-<date>.json``) for the notebooks to show
beside the live run. Meant for a real GPU; it runs anywhere (a CPU gives CPU figures, labelled so).

Each notebook loads its own parts, e.g. ``labkit.load_reference("01_mixed_precision-compare*")``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .capacity import batch_search
from .config import RunConfig, baseline
from .env import PROFILE_ENV, env_report, profile, resolve_device
from .errors import ConfigError
from .labs import batch_size, memory_savers, mixed_precision
from .labs.start_here import timing_demo
from .results import REFERENCE_DIR, run_configs, to_frame, write_reference
from .techniques.precision import low_precision_for
from .train import fit

# What a GPU without a budget is searched against: a T4's usable memory, so that the search meets a real
# out-of-memory error (and backs off from it) even on a much larger GPU.
EMULATED_GPU_BYTES = 15 * 2**30
CPU_BUDGET_BYTES = 64 * 2**20  # notebook 02's pretend GPU


@dataclasses.dataclass
class Part:
    """One reference file: runs (RunResults), or ready-made rows (a DataFrame), and extras."""

    name: str
    runs: list = dataclasses.field(default_factory=list)
    rows: object = None
    extras: dict = dataclasses.field(default_factory=dict)


def _records(frame) -> list[dict]:
    """A DataFrame as JSON-ready records (numpy scalars become Python numbers, NaN becomes null)."""
    return json.loads(frame.to_json(orient="records"))


def _bench_00(cfg: RunConfig) -> list[Part]:
    prof = profile()
    result = fit(cfg)
    pitfalls = timing_demo(cfg, repeats=prof.repeats)
    return [Part("baseline", [result], extras={"timing_pitfalls": dataclasses.asdict(pitfalls)})]


def _bench_01(cfg: RunConfig) -> list[Part]:
    prof = profile()
    low = low_precision_for(env_report(cfg.device))
    memory_cfg = cfg.replace(max_steps=prof.warmup_steps + 4, evaluate=False)
    memory = [memory_cfg.replace(precision=p, batch_size=b) for p in ("fp32", low) for b in prof.batch_sizes]
    layouts = [cfg.replace(precision=p, channels_last=c) for p in ("fp32", low) for c in (False, True)]
    trace = mixed_precision.scaler_trace(cfg, steps=prof.max_steps // 2, init_scale=2.0**20, growth_interval=4)
    return [
        Part("compare", list(mixed_precision.compare(cfg).values())),
        Part("memory", run_configs(memory)),
        Part("layouts", run_configs(layouts)),
        Part("scaler", rows=trace,
             extras={"underflow": _records(mixed_precision.gradient_underflow(cfg, (1.0, 1e-3)))}),
    ]


@contextlib.contextmanager
def _memory_cap(device, cap_bytes: int):
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


def _bench_02(cfg: RunConfig) -> list[Part]:
    prof = profile()
    warmup = prof.train_size // max(prof.batch_sizes) * prof.sweep_epochs // 4
    device = resolve_device(cfg.device)
    budget = None if device.type == "cuda" else CPU_BUDGET_BYTES
    with _memory_cap(device, EMULATED_GPU_BYTES):
        search = batch_search(cfg, budget_bytes=budget)
    search_extras = {"best": search.best, "budget_bytes": search.budget_bytes, "elapsed_s": search.elapsed_s,
                     "emulated_gpu_bytes": EMULATED_GPU_BYTES if budget is None else None,
                     "tried": _records(search.to_frame())}
    accum = run_configs([cfg.replace(grad_accum=k) for k in (1, 2, 4, 8)])
    return [
        Part("sweep", rows=batch_size.compare_lr_scaling(cfg, warmup_steps=max(1, warmup))),
        Part("accumulation", rows=to_frame(accum), extras={"gaps": _records(batch_size.accumulation_table(cfg, 4))}),
        Part("search", extras=search_extras),
        Part("prediction", rows=batch_size.prediction_table(cfg, fit_sizes=(16, 32), check_sizes=(64, 128, 256, 512))),
    ]


def _bench_03(cfg: RunConfig) -> list[Part]:
    optimizers = ["adamw", "adamw8bit"] + (["paged_adamw8bit"] if resolve_device(cfg.device).type == "cuda" else [])
    return [
        Part("tradeoff", rows=memory_savers.checkpoint_tradeoff(cfg)),
        Part("staged", rows=memory_savers.staged_runs(cfg).frame),
        Part("optimizers", run_configs([cfg.replace(optimizer=name) for name in optimizers]),
             extras={"calculator": _records(memory_savers.calculator_check(cfg.replace(optimizer="adamw8bit")))}),
    ]


EXPERIMENTS: dict[str, Callable[[RunConfig], list[Part]]] = {
    "00_start_here": _bench_00,
    "01_mixed_precision": _bench_01,
    "02_batch_size": _bench_02,
    "03_memory_savers": _bench_03,
}


def run_bench(out_dir: Path | None = None, profile_name: str = "full", experiments: Iterable[str] | None = None,
              cfg: RunConfig | None = None) -> list[Path]:
    """Run the notebooks' experiments at ``profile_name`` and write one reference JSON per part.

    Args:
        out_dir: where to write (default: ``src/labkit/assets/reference``).
        profile_name: the profile the runs use (the caller's ``LABKIT_PROFILE`` is restored afterwards).
        experiments: notebook names from `EXPERIMENTS` (default: all).
        cfg: the base run (default: notebook 00's baseline for the profile); tests pass a tiny one.

    Returns:
        The paths written, ``<notebook>-<part>-<gpu>-<date>.json``.

    Example:
        >>> run_bench(experiments=["01_mixed_precision"])
    """
    names = list(EXPERIMENTS) if experiments is None else list(experiments)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown or not names:
        raise ConfigError("experiments", unknown or names, f"names from {list(EXPERIMENTS)}")
    previous = os.environ.get(PROFILE_ENV)
    os.environ[PROFILE_ENV] = profile_name  # fit reads the profile from the environment
    paths = []
    try:
        base = cfg or baseline(profile())
        env = env_report(base.device)
        slug = re.sub(r"[^a-z0-9]+", "-", (env.get("gpu") or "cpu").lower()).strip("-")
        today = datetime.date.today().isoformat()
        for name in names:
            for part in EXPERIMENTS[name](base):
                path = (out_dir or REFERENCE_DIR) / f"{name}-{part.name}-{slug}-{today}.json"
                paths.append(write_reference(part.runs, path, extras=part.extras, rows=part.rows, env=env))
    finally:
        if previous is None:
            os.environ.pop(PROFILE_ENV, None)
        else:
            os.environ[PROFILE_ENV] = previous
    return paths

"""How long a run will take here, from the runs already finished on this machine (the results cache).

A panel shows it before Run is pressed, so that a learner who picks fp16 on a CPU that can only
emulate it knows the wait is a minute, not a second. Nothing is guessed from datasheets: the estimate
scales a cached run of the same model and precision on the same hardware by the samples to process.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields

from . import machine
from .config import RunConfig
from .env import env_report, hardware_key, profile, resolve_device
from .results import cache_key, results_dir
from .techniques.precision import resolve_precision
from .train import emulated_step_limit, total_steps

# The fields that change the cost of a sample: a cached run is a basis only when these match.
COST_FIELDS = ("model", "dataset", "image_size", "precision", "tf32", "channels_last", "checkpointing",
               "optimizer", "freeze", "lora_rank", "lora_targets", "grad_accum", "device")


_DEFAULTS = {f.name: f.default for f in fields(RunConfig)}  # what a run cached before a field existed had


def _cost_value(name: str, value):
    """A cost field as it decides the cost: LoRA or not (the rank hardly matters), targets as a tuple whether
    written as one name, a list (a cached run's JSON) or a tuple."""
    if name == "lora_rank":
        return value is not None
    if name == "lora_targets":
        return (value,) if isinstance(value, str) else tuple(value)
    return value


@dataclass(frozen=True)
class RunEstimate:
    """``seconds`` a run of ``cfg`` will take here (0 when it is cached), and ``basis``: what it scaled."""

    seconds: float
    cached: bool
    basis: str

    def __str__(self) -> str:
        if self.cached:
            return "Cached: Run shows it at once."
        return f"Estimated time: about {format_seconds(self.seconds)} ({self.basis})."


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min``: a wait in the unit a learner reads at a glance."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate_run(cfg: RunConfig, cached: bool = True) -> RunEstimate | None:
    """How long ``cfg`` will take on this machine, or None when no similar run has finished here yet.

    A cached run of ``cfg`` itself is instant (``cached=False``: estimate it anyway, for a run that
    changes the config before it starts, such as a panel's lr rule). Otherwise the closest cached run with the same
    `COST_FIELDS` on the same hardware gives seconds per training sample (its wall time over the samples
    it trained, warm-up and profiling steps included), scaled to the samples ``cfg`` will train (after
    the profile's cut for emulated precisions) and the test images it evaluates.

    Example:
        >>> print(estimate_run(cfg.replace(precision="fp16")))
        Estimated time: about 40 s (from a cached fp16 run at batch 64 on this machine).
    """
    env = env_report(cfg.device)
    if cached and (results_dir() / f"{cache_key(cfg, env)}.json").exists():
        return RunEstimate(0.0, True, "cached")
    basis = _closest_cached_run(cfg, hardware_key(env))
    if basis is None:
        return None
    train_samples = basis["steps"] * basis["config"]["batch_size"]
    per_sample_s = basis["train_time_s"] / train_samples
    prof = profile()
    train_size = cfg.train_size or prof.train_size
    steps = total_steps(cfg, train_size // cfg.batch_size)  # the loader drops a last, smaller batch
    device = resolve_device(cfg.device)
    capability = machine.here().capability if device.type == "cuda" else None
    if resolve_precision(cfg.precision, device, capability).emulated:  # the run will be cut as `fit` cuts it
        steps = min(steps, emulated_step_limit(prof))
    seconds = per_sample_s * steps * cfg.batch_size
    if cfg.evaluate:
        seconds += per_sample_s / 3 * prof.test_size  # a forward pass costs about a third of a step
    return RunEstimate(seconds, False, f"from a cached {basis['config']['precision']} run at batch "
                                       f"{basis['config']['batch_size']} on this machine")


def _closest_cached_run(cfg: RunConfig, hardware: str) -> dict | None:
    wanted = cfg.to_dict()
    best, best_distance = None, math.inf
    for path in results_dir().glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        config = record.get("config") or {}
        if record.get("error") or not record.get("train_time_s") or not record.get("steps"):
            continue
        if hardware_key(record.get("env") or {}) != hardware or any(
                _cost_value(k, config.get(k, _DEFAULTS[k])) != _cost_value(k, wanted[k]) for k in COST_FIELDS):
            continue
        distance = abs(math.log(config["batch_size"] / cfg.batch_size))  # the nearest batch size scales best
        if cfg.lora_rank is not None:  # then the nearest rank
            distance += abs(math.log(config["lora_rank"] / cfg.lora_rank))
        if distance < best_distance:
            best, best_distance = record, distance
    return best

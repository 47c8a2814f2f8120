"""Section 7 of notebook 10: per-decoder-layer checkpointing and torch.compile each run off and on, and AdamW's
kernels (for-loop, foreach, fused) timed on the optimizer step alone."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ... import measure
from ...choices import OPTIMIZER_IMPLS
from ...config import RunConfig
from ...display import number
from ...env import profile, resolve_device
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...models import build_language_model
from ...results import cached_fit
from ...techniques.optimizers import build_optimizer
from ...units import mib
from ...workloads import lm_speed_config, lm_speed_model
from .common import interleaved
from .ladder import NOTEBOOK_SHAPE, ladder_configs

speed_config = lm_speed_config  # the section's run: `labkit.workloads.lm_speed_config`


def _row(name: str, res) -> dict:
    return {"run": name, "step_time_s": res.step_time_s, "step_time_p10_s": res.step_time_p10_s,
            "step_time_p90_s": res.step_time_p90_s, "tokens_per_s": res.tokens_per_s,
            "activation_bytes": res.memory.get("activations"), "peak_memory_bytes": res.peak_memory_bytes,
            "compile_time_s": res.compile_time_s, "warnings": "; ".join(res.warnings)}


def _switch(cfg: RunConfig, field: str, progress: bool) -> pd.DataFrame:
    runs = {"off": cached_fit(cfg.replace(**{field: False}), progress=progress),
            "on": cached_fit(cfg.replace(**{field: True}), progress=progress)}
    return pd.DataFrame([_row(f"{field}={name}", res) for name, res in runs.items()])


def _time(row, base) -> measure.Comparison:
    return compare(Measured.row(row, "step_time_s"), Measured.row(base, "step_time_s"), words=("faster", "slower"))


@dataclass
class Checkpointing(LabResult):
    """The run without, then with, per-decoder-layer checkpointing: step time, tokens/s, activations, peak."""

    shown = ("run", "step_time_s", "tokens_per_s", "activation_bytes", "peak_memory_bytes")

    @worded
    def finding(self) -> str:
        off, on = self.frame.iloc[0], self.frame.iloc[1]
        return (f"Checkpointing every decoder layer: activations {mib(on['activation_bytes'], '.3g')} against "
                f"{mib(off['activation_bytes'], '.3g')} ({number(on['activation_bytes'] / off['activation_bytes'])}x),"
                f" step time {_time(on, off)}.")


def checkpointing_runs(cfg: RunConfig | None = None, progress: bool = False) -> Checkpointing:
    """``cfg`` (default `speed_config()`) run without, then with, per-decoder-layer checkpointing (cached)."""
    return Checkpointing(_switch(cfg or speed_config(), "checkpointing", progress))


@dataclass
class Compiled(LabResult):
    """The run eager, then compiled: step time, tokens/s, and the compiling step's time apart."""

    shown = ("run", "step_time_s", "tokens_per_s", "compile_time_s")

    @worded
    def finding(self) -> str:
        off, on = self.frame.iloc[0], self.frame.iloc[1]
        if on["compile_time_s"] is None or on["compile_time_s"] != on["compile_time_s"]:
            return f"Not compiled here, so nothing to compare: {on['warnings'] or 'no compile time was reported'}."
        time = _time(on, off)
        if time.direction == -1:
            payback = f"it pays for itself after {number(on['compile_time_s'] / -time.difference)} steps"
        else:
            payback = f"no step-time gain to pay it back here ({time.verdict})"
        return (f"Compiled: step time {time}; compiling took {number(on['compile_time_s'])} s once, "
                f"about {number(on['compile_time_s'] / off['step_time_s'])} eager steps' time ({payback}).")


def compile_runs(cfg: RunConfig | None = None, progress: bool = False) -> Compiled:
    """``cfg`` run eager, then compiled (cached; the first compiled step is timed apart as ``compile_time_s``).
    Default: the notebook's ladder's ``+fused AdamW`` rung, so section 9 reuses both runs."""
    cfg = cfg or ladder_configs(speed_config(**NOTEBOOK_SHAPE))["+fused AdamW"]
    return Compiled(_switch(cfg, "compile", progress))


@dataclass
class OptimizerKernels(LabResult):
    """AdamW's step time per kernel, with its ratio to the first."""

    shown = ("impl", "step_time_s", "time_ratio", "num_tensors", "num_params")

    @worded
    def finding(self) -> str:
        base = self.frame.iloc[0]
        parts = [f"{row['impl']} step time {_time(row, base)}" for _, row in self.frame.iloc[1:].iterrows()]
        return (f"AdamW's step on {number(int(base['num_params']))} parameters in {int(base['num_tensors'])} tensors: "
                f"{base['impl']} {number(1e3 * base['step_time_s'])} ms; " + "; ".join(parts) + ".")


def optimizer_kernels(model_name: str | None = None, impls=OPTIMIZER_IMPLS, repeats: int | None = None,
                      seed: int = 0) -> OptimizerKernels:
    """AdamW's ``optimizer.step()`` alone with each kernel on copies of one Llama's parameters with random
    gradients, after one untimed step each, timed interleaved (``repeats`` None: 2 x the profile's)."""
    model_name = model_name or lm_speed_model()
    repeats = 2 * profile().repeats if repeats is None else repeats
    torch.manual_seed(seed)
    device = resolve_device("auto")  # the GPU where there is one: the kernels differ most there
    reference = build_language_model(model_name, vocab_size=2048, pretrained=False)[0]
    optimizers = {}
    for impl in impls:
        model = build_language_model(model_name, vocab_size=2048, pretrained=False)[0]
        model.load_state_dict(reference.state_dict())
        model.to(device)
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(device)
        optimizers[impl] = build_optimizer(model, "adamw", lr=1e-4, impl=impl)
        optimizers[impl].step()  # creates exp_avg and exp_avg_sq: not what the timed steps measure
    times = interleaved({impl: optimizer.step for impl, optimizer in optimizers.items()}, repeats, device)
    params = list(reference.parameters())
    rows = [{"impl": impl, **times[impl], "num_tensors": len(params), "num_params": sum(p.numel() for p in params)}
            for impl in impls]
    frame = pd.DataFrame(rows)
    frame.insert(4, "time_ratio", frame["step_time_s"] / frame["step_time_s"].iloc[0])
    return OptimizerKernels(frame)

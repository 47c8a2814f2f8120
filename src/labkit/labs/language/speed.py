"""Section 7 of notebook 10, three switches of a language model's step: per-decoder-layer checkpointing (activations
against time, on a run), AdamW's kernels (for-loop, foreach, fused: the optimizer step alone, timed interleaved) and
torch.compile (a run compiled against the same run eager: step time, and what compiling cost once)."""

from __future__ import annotations

import pandas as pd
import torch

from ... import measure
from ...choices import OPTIMIZER_IMPLS
from ...config import RunConfig
from ...display import number
from ...env import profile, resolve_device
from ...messages import worded
from ...models import build_language_model
from ...results import cached_fit
from ...techniques.optimizers import build_optimizer
from ...units import mib
from ...workloads import lm_speed_config, lm_speed_model

_ORDER_WORDS = {None: "no timing spread measured", 0: "within the noise", 1: "slower", -1: "faster"}


def _model_name() -> str:
    return lm_speed_model()


speed_config = lm_speed_config  # the section's run: `labkit.workloads.lm_speed_config`


def _row(name: str, res) -> dict:
    return {"run": name, "step_time_s": res.step_time_s, "step_time_p10_s": res.step_time_p10_s,
            "step_time_p90_s": res.step_time_p90_s, "tokens_per_s": res.tokens_per_s,
            "activation_bytes": res.memory.get("activations"), "peak_memory_bytes": res.peak_memory_bytes,
            "compile_time_s": res.compile_time_s, "warnings": "; ".join(res.warnings)}


def _compare(cfg: RunConfig | None, field: str, progress: bool) -> pd.DataFrame:
    cfg = cfg or speed_config()
    runs = {"off": cached_fit(cfg.replace(**{field: False}), progress=progress),
            "on": cached_fit(cfg.replace(**{field: True}), progress=progress)}
    return pd.DataFrame([_row(f"{field}={name}", res) for name, res in runs.items()])


def checkpointing_runs(cfg: RunConfig | None = None, progress: bool = False) -> pd.DataFrame:
    """``cfg`` (default `speed_config()`) run without, then with, per-decoder-layer checkpointing (cached runs).

    Returns:
        A frame, one row per run: ``run``, ``step_time_s`` with ``step_time_p10_s`` / ``_p90_s``, ``tokens_per_s``,
        ``activation_bytes``, ``peak_memory_bytes``, ``compile_time_s``, ``warnings``.

    Example:
        >>> checkpointing_runs()[["run", "activation_bytes", "step_time_s"]]
    """
    return _compare(cfg, "checkpointing", progress)


def compile_runs(cfg: RunConfig | None = None, progress: bool = False) -> pd.DataFrame:
    """``cfg`` (default `speed_config()`, packed: compiling needs rows of one width) run eager, then compiled.

    The compiled run's first step compiles (tens of seconds cold on a CPU; Inductor's disk cache makes a second
    process quick); it is timed apart as ``compile_time_s``. Same columns as `checkpointing_runs`.
    """
    return _compare(cfg, "compile", progress)


def _versus(row, base) -> str:
    order = measure.separated((row["step_time_p10_s"], row["step_time_p90_s"]),
                              (base["step_time_p10_s"], base["step_time_p90_s"]))
    ratio = number(row["step_time_s"] / base["step_time_s"])
    return f"{ratio}x the step time ({_ORDER_WORDS[order]})" if order in (1, -1) else \
        f"step time {_ORDER_WORDS[order]} ({ratio}x)"


@worded
def checkpointing_finding(frame: pd.DataFrame) -> str:
    """Per-layer checkpointing's activations and step time against the plain run's."""
    off, on = frame.iloc[0], frame.iloc[1]
    return (f"Checkpointing every decoder layer: activations {mib(on['activation_bytes'], '.3g')} against "
            f"{mib(off['activation_bytes'], '.3g')} ({number(on['activation_bytes'] / off['activation_bytes'])}x), "
            f"{_versus(on, off)}.")


@worded
def compile_finding(frame: pd.DataFrame) -> str:
    """The compiled run's step time against the eager one's, and what compiling cost once."""
    off, on = frame.iloc[0], frame.iloc[1]
    if on["compile_time_s"] is None or on["compile_time_s"] != on["compile_time_s"]:
        return f"Not compiled here, so nothing to compare: {on['warnings'] or 'no compile time was reported'}."
    order = measure.separated((on["step_time_p10_s"], on["step_time_p90_s"]),
                              (off["step_time_p10_s"], off["step_time_p90_s"]))
    if order == -1:
        steps = on["compile_time_s"] / (off["step_time_s"] - on["step_time_s"])
        payback = f"it pays for itself after {number(steps)} steps"
    else:
        payback = "no step-time gain beyond the noise to pay it back here"
    return (f"Compiled: {_versus(on, off)}; compiling took {number(on['compile_time_s'])} s once, "
            f"about {number(on['compile_time_s'] / off['step_time_s'])} eager steps' time ({payback}).")


def optimizer_kernels(model_name: str | None = None, impls=OPTIMIZER_IMPLS, repeats: int | None = None,
                      seed: int = 0) -> pd.DataFrame:
    """AdamW's ``optimizer.step()`` alone with each kernel, on a Llama's parameters with random gradients.

    Each kernel gets its own copy of the same parameters; the steps are timed interleaved (one of each kernel per
    round), after one untimed step each (it creates the state).

    Args:
        model_name: the Llama whose parameters to step (None: the profile's, as in `speed_config`).
        impls: kernels, from `OPTIMIZER_IMPLS`; the first is the reference. repeats: timed rounds (None: 2 x the
            profile's repeats). seed: weights and gradients.

    Returns:
        A frame: ``impl``, ``step_time_s`` (median) with ``step_time_p10_s`` / ``_p90_s``, ``time_ratio`` against
        the first, ``num_tensors`` and ``num_params``.

    Example:
        >>> optimizer_kernels()[["impl", "step_time_s", "time_ratio"]]
    """
    model_name = model_name or _model_name()
    repeats = 2 * profile().repeats if repeats is None else repeats
    torch.manual_seed(seed)
    device = resolve_device("auto")  # the GPU where there is one: the kernels differ most there
    reference = build_language_model(model_name, vocab_size=2048, pretrained=False)[0]
    optimizers, timers = {}, {}
    for impl in impls:
        model = build_language_model(model_name, vocab_size=2048, pretrained=False)[0]
        model.load_state_dict(reference.state_dict())
        model.to(device)
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(device)
        optimizers[impl] = build_optimizer(model, "adamw", lr=1e-4, impl=impl)
        optimizers[impl].step()  # creates exp_avg and exp_avg_sq: not what the timed steps measure
        timers[impl] = measure.StepTimer(device)  # CUDA events, read after a synchronise
    for _ in range(repeats):
        for impl, optimizer in optimizers.items():
            timers[impl].start()
            optimizer.step()
            timers[impl].stop()
    params = list(reference.parameters())
    rows = []
    for impl in impls:
        median, p10, p90 = measure.spread(timers[impl].times_s())
        rows.append({"impl": impl, "step_time_s": median, "step_time_p10_s": p10, "step_time_p90_s": p90,
                     "num_tensors": len(params), "num_params": sum(p.numel() for p in params)})
    frame = pd.DataFrame(rows)
    frame.insert(4, "time_ratio", frame["step_time_s"] / frame["step_time_s"].iloc[0])
    return frame


@worded
def optimizer_finding(frame: pd.DataFrame) -> str:
    """Each AdamW kernel's step time against the first, called different only outside the p10-p90 spreads."""
    base, parts = frame.iloc[0], []
    for _, row in frame.iloc[1:].iterrows():
        parts.append(f"{row['impl']} {_versus(row, base)}")
    return (f"AdamW's step on {number(int(base['num_params']))} parameters in {int(base['num_tensors'])} tensors: "
            f"{base['impl']} {number(1e3 * base['step_time_s'])} ms; " + "; ".join(parts) + ".")

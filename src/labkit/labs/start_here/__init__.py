"""Notebook 00 (start here): how labkit measures, and one verdict line per finding from a run's live numbers.

- `timing_demo`: one training step timed cold, then warm with and without synchronising, the two warm
  readings taken alternately so that both see the same load; `timing` says which outcome happened.
- `flops_against_peaks`, `peaks_finding`: a run's achieved FLOP/s next to published datasheet peaks.
- `headline`, `memory`, `compare`: what a run measured, in a few short lines.

A difference is called real only outside the noise the run measured: the warm steps' 10th-90th percentile
spread for times, `labkit.measure.accuracy_noise` (the test set's sampling noise) for accuracies. The
explanation of each outcome is in the notebook.
"""

from __future__ import annotations

import functools

import pandas as pd

from ...config import RunConfig
from ...display import quantity
from ...env import profile, profile_of
from ...measure import PEAK_FLOPS, TimingPitfalls, accuracy_noise, timing_pitfalls
from ...messages import worded
from ...result import MEMORY_CATEGORIES, RunResult
from ...train import Trainer
from ...units import mib

# The GPUs a learner of this lab meets (free: a T4 on Colab, two on Kaggle; rented: an A100 or an H100), at the
# dtypes their datasheets quote for training: fp32 (CUDA cores) and fp16/bf16 (tensor cores).
PEAK_GPUS = (("T4", "fp32"), ("T4", "fp16"), ("A100", "fp32"), ("A100", "bf16"), ("H100", "bf16"))
PEAK_SOURCE = "published: NVIDIA datasheet peaks"


def timing_demo(cfg: RunConfig, warmup: int = 3, repeats: int = 10) -> TimingPitfalls:
    """Time one training step of ``cfg`` cold, warm and synchronised, and warm without synchronising.

    Args:
        cfg: the run whose training step is timed.
        warmup: untimed steps after the first one.
        repeats: timed steps of each kind.

    Example:
        >>> tp = timing_demo(cfg); tp.cold_vs_warm, tp.unsynced_vs_synced
    """
    trainer = Trainer(cfg)
    images, labels = next(iter(trainer.loader))
    return timing_pitfalls(lambda: trainer.step(images, labels), trainer.device, warmup, repeats)


def _spread_of(tp: TimingPitfalls, kind: str) -> tuple[float, float]:
    """A reading's 10th-90th percentile spread; a bare `TimingPitfalls` has none, so its median stands for it."""
    median = tp.warm_median_s if kind == "warm" else tp.unsynced_median_s
    low, high = getattr(tp, f"{kind}_p10_s", median), getattr(tp, f"{kind}_p90_s", median)
    return (median, median) if low != low or high != high else (low, high)  # NaN: not measured


@worded
def timing(tp: TimingPitfalls) -> str:
    """Two verdict lines on the timing demo: did the first call pay one-off costs, did synchronising matter.

    Args:
        tp: `timing_demo`'s result.
    """
    warm_low, warm_high = _spread_of(tp, "warm")
    plain_low, plain_high = _spread_of(tp, "unsynced")
    ms = functools.partial(quantity, "step_time_s")
    first = f"First call {ms(tp.first_call_s)}, {tp.cold_vs_warm:.1f}x the warm median of {ms(tp.warm_median_s)}"
    if tp.first_call_s > warm_high:
        first += f" (warm steps {ms(warm_low)}-{ms(warm_high)})" if warm_low < warm_high else ""
        first += ": it paid one-off costs."
    else:
        first += ": within the warm steps' spread, so this process was already warm."
    plain = f"Not synchronised: {ms(tp.unsynced_median_s)}, {tp.unsynced_vs_synced:.2f}x the synchronised median"
    if tp.device != "cuda":
        plain += (": the same within the noise, as on any CPU." if plain_low <= warm_high and plain_high >= warm_low
                  else ": apart by the machine's load alone (a CPU has nothing to wait for).")
    elif plain_high < warm_low:
        plain += ": too small, the clock stopped before the GPU had finished."
    else:
        plain += ": not smaller, so launching the kernels (the CPU side) was the bottleneck here."
    return first + "\n" + plain


@worded
def headline(res: RunResult) -> str:
    """The four headline numbers (time, memory, accuracy, size) plus throughput and FLOP/s, a line each.

    Args:
        res: a `labkit.fit` result.
    """
    untimed = res.steps - res.timed_steps
    text = [
        f"Step time: median {res.step_time_s * 1e3:.2f} ms (10-90%: {res.step_time_p10_s * 1e3:.2f}-"
        f"{res.step_time_p90_s * 1e3:.2f} ms) over {res.timed_steps} timed steps; {untimed} warm-up and "
        f"profiling steps were not timed. Throughput: {_throughput(res)}.",
        f"Peak memory: {mib(res.peak_memory_bytes)} "
        + ("(max_memory_allocated over the timed steps)." if res.reserved_memory_bytes is not None
           else "(live tensors counted exactly by labkit's tracker: the CPU has no caching allocator)."),
        f"Test accuracy: {res.accuracy:.1%} (chance is 10%)." if res.accuracy is not None else "Not evaluated.",
        f"Model size: {mib(res.model_size_bytes)} serialised, {res.num_params:,} parameters "
        f"({res.num_trainable_params:,} trainable).",
    ]
    if res.achieved_flops:
        flops = f"Achieved {res.achieved_flops / 1e9:.1f} GFLOP/s ({res.flops_per_step / 1e9:.2f} GFLOP per step)"
        dtype = "tf32" if res.precision_used == "fp32" and res.tf32 else res.precision_used
        if res.mfu is not None:
            flops += f", {res.mfu:.1%} of this GPU's {dtype} datasheet peak."
        else:
            flops += f"; no datasheet peak is known for this device at {dtype}, so no utilisation is computed."
        text.append(flops)
    return "\n".join(text)


def _throughput(res: RunResult) -> str:
    """Samples/s, or for a language model tokens/s: real (not padding) tokens/s when its batches hold padding."""
    if res.tokens_per_s is None:
        return f"{res.throughput:.0f} samples/s"
    if res.pad_fraction and res.real_tokens_per_s is not None:
        return (f"{res.real_tokens_per_s:,.0f} real tokens/s ({res.tokens_per_s:,.0f} tokens/s counting the "
                f"{res.pad_fraction:.0%} padding)")
    return f"{res.tokens_per_s:,.0f} tokens/s"


@worded
def memory(res: RunResult) -> str:
    """Verdict lines on a run's memory: allocated vs reserved, the largest category, and the peaks' sum.

    Args:
        res: a `labkit.fit` result.
    """
    if res.reserved_memory_bytes is not None:
        gap = res.reserved_memory_bytes - res.peak_memory_bytes
        lines = [f"Allocated peak {mib(res.peak_memory_bytes)}, reserved {mib(res.reserved_memory_bytes)}: "
                 f"the cache held {mib(gap)} that no tensor used."]
    else:
        lines = [f"Peak {mib(res.peak_memory_bytes)} of live tensors (a CPU has no cache, so nothing is reserved)."]
    if not res.memory:
        return "\n".join(lines + ([res.memory_note] if res.memory_note else []))
    largest = max(MEMORY_CATEGORIES, key=lambda c: res.memory.get(c, 0))
    total = sum(res.memory.get(c, 0) for c in MEMORY_CATEGORIES)
    tracked = sum(res.memory_at_peak.values()) if res.memory_at_peak else None
    line = f"The largest category is {largest.replace('_', ' ')} ({mib(res.memory[largest])})"
    if tracked is not None and total > tracked:
        line += f"; the categories' own peaks add up to {mib(total)}, more than the {mib(tracked)} held at the peak"
    lines.append(line + ".")
    if res.reserved_memory_bytes is not None and tracked is not None and res.peak_memory_bytes > tracked:
        lines.append(f"The allocator's peak is {mib(res.peak_memory_bytes - tracked)} above the tracked tensors.")
    return "\n".join(lines)


def _test_size(res: RunResult) -> int:
    run_profile = profile_of(res.env) if res.env else None
    return (run_profile or profile()).test_size


@worded
def compare(name_a: str, a: RunResult, name_b: str, b: RunResult, metric: str = "accuracy") -> str:
    """One verdict line comparing ``metric`` between two runs, e.g. pretrained vs from scratch.

    Args:
        name_a, a, name_b, b: the runs and what to call them.
        metric: a `RunResult` field; an accuracy difference is real only above the test set's noise.
    """
    va, vb = getattr(a, metric), getattr(b, metric)
    if metric != "accuracy":
        return f"{name_a}: {va:.4g} vs {name_b}: {vb:.4g} ({va / vb:.2f}x)."
    noise = accuracy_noise((va + vb) / 2, _test_size(a))
    verdict = ("within the test set's noise" if abs(va - vb) <= noise
               else f"{name_a if va > vb else name_b} is better, beyond the test set's noise")
    return (f"{name_a}: {va:.1%} vs {name_b}: {vb:.1%} after the same {a.steps} steps "
            f"({(va - vb) * 100:+.1f} percentage points, noise {noise * 100:.1f}): {verdict}.")


def flops_against_peaks(res: RunResult, measured: pd.DataFrame | None = None,
                        gpus=PEAK_GPUS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's achieved FLOP/s, and beside it published datasheet peaks and this run measured on real GPUs.

    Args:
        res: a `labkit.fit` result.
        measured: reference results of this run from ``labkit.load_reference`` (may be empty).
        gpus: (GPU, dtype) pairs of `labkit.measure.PEAK_FLOPS` to draw; their ``source`` says "published".

    Returns:
        ``(live, peaks)`` frames with ``setup`` and ``achieved_flops``, for
        ``plots.bar(live, x="setup", y="achieved_flops", reference=peaks, logy=True)``.
    """
    device = res.env.get("gpu") or res.env.get("device") or "this device"
    live = pd.DataFrame([{"setup": f"your run ({device}, {res.precision_used})", "achieved_flops": res.achieved_flops,
                          "source": "live"}])
    rows = [{"setup": f"{gpu} {dtype} peak", "achieved_flops": PEAK_FLOPS[gpu][dtype], "source": PEAK_SOURCE}
            for gpu, dtype in gpus]
    if measured is not None and len(measured):
        rows = [{"setup": f"{row.gpu or row.device} run ({row.precision_used})", "achieved_flops": row.achieved_flops,
                 "source": row.source} for row in measured.itertuples()] + rows
    return live, pd.DataFrame(rows)


@worded
def peaks_finding(live: pd.DataFrame, peaks: pd.DataFrame) -> str:
    """The run's achieved FLOP/s as a fraction of each datasheet peak, in one line.

    Args:
        live, peaks: `flops_against_peaks`'s frames.
    """
    achieved = live["achieved_flops"].iloc[0]
    if not achieved:
        return "This run has no FLOP count (evaluate-only or a failed step), so there is nothing to compare."
    parts = [f"{achieved / row.achieved_flops:.2%} of the {row.setup}" for row in peaks.itertuples()
             if row.source == PEAK_SOURCE]
    return f"Your run achieved {achieved / 1e12:.3g} TFLOP/s: " + ", ".join(parts) + "."


def _three_digits(value: float) -> float:
    """A measured number as a question shows it (three significant digits), so the learner can redo the sum."""
    return float(f"{value:.3g}")


def warmup_numbers(tp: TimingPitfalls, steps: int = 10) -> dict:
    """Your own numbers for exercise ``00.warmup_error``: the timing demo's first call and warm median.

    Args:
        tp: `timing_demo`'s result.
        steps: the steps of the benchmark the exercise imagines.

    Example:
        >>> print(exercises.question("00.warmup_error", warmup_numbers(tp)))
    """
    return {"first_call_s": _three_digits(tp.first_call_s), "warm_median_s": _three_digits(tp.warm_median_s),
            "steps": steps}


def activation_share(res: RunResult) -> float:
    """The activations' peak as a fraction of the step's peak memory (the figure section 2 asks to predict).

    Args:
        res: a `labkit.fit` result with a memory breakdown.
    """
    return res.memory["activations"] / res.peak_memory_bytes

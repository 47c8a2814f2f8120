"""Notebook 00 (start here): how labkit measures, and the sentences computed from a run's live results.

- `timing_demo`: one training step timed cold, warm and synchronised, and warm without synchronising.
- `flops_against_peaks`, `peaks_finding`: a run's achieved FLOP/s next to published datasheet peaks.
- `timing`, `headline`, `memory`, `compare`: what a run measured, in words. Notebooks print these instead
  of typing figures into prose, so that on CPU and on GPU they stay true.
"""

from __future__ import annotations

import pandas as pd

from ...config import RunConfig
from ...measure import PEAK_FLOPS, TimingPitfalls, timing_pitfalls
from ...messages import worded
from ...result import MEMORY_CATEGORIES, RunResult
from ...train import Trainer
from ...units import mib

# The GPUs a learner of this lab meets (free Colab/Kaggle: T4, P100 PCIe; a rented one: A100), at the dtypes
# their datasheets quote for training: fp32 (CUDA cores) and fp16 (tensor cores where there are any).
PEAK_GPUS = (("T4", "fp32"), ("T4", "fp16"), ("P100 PCIE", "fp32"), ("A100", "fp32"), ("A100", "bf16"))
PEAK_SOURCE = "published: NVIDIA datasheet peaks"
WARM_ALREADY = 1.2  # a first call under 1.2x the warm median paid no one-off cost worth the name


def timing_demo(cfg: RunConfig, warmup: int = 3, repeats: int = 10) -> TimingPitfalls:
    """Time one training step of ``cfg`` cold, warm and synchronised, and warm without synchronising.

    Example:
        >>> tp = timing_demo(cfg); tp.cold_vs_warm, tp.unsynced_vs_synced
    """
    trainer = Trainer(cfg)
    images, labels = next(iter(trainer.loader))
    return timing_pitfalls(lambda: trainer.step(images, labels), trainer.device, warmup, repeats)


@worded
def timing(tp: TimingPitfalls) -> str:
    """What the timing demo showed: cold vs warm, and unsynchronised vs synchronised."""
    first = (f"First call: {tp.first_call_s * 1e3:.2f} ms, {tp.cold_vs_warm:.1f}x the warm median of "
             f"{tp.warm_median_s * 1e3:.2f} ms over {tp.repeats} calls.")
    if tp.cold_vs_warm >= WARM_ALREADY:
        first += (" The first call pays one-off costs (allocating memory, choosing kernels"
                  + (", creating cuBLAS/cuDNN handles" if tp.device == "cuda" else "")
                  + "); timing it would overstate the step time.")
    else:
        first += (" Here it was hardly slower: this process had already run the same model's operations (an earlier "
                  "cell), so memory and kernels were warm. In a fresh process, and on a GPU, the first call pays "
                  "one-off costs (allocation, kernel choice); warm up anyway.")
    lines = [first]
    ratio = tp.unsynced_vs_synced
    if tp.device == "cuda":
        if ratio < 0.8:
            lines.append(
                f"Without synchronising, the host clock read {tp.unsynced_median_s * 1e3:.2f} ms, only {ratio:.2f}x "
                "the real time: it timed how fast Python queued the kernels, not the GPU's work.")
        else:
            lines.append(
                f"Without synchronising, the host clock read {tp.unsynced_median_s * 1e3:.2f} ms ({ratio:.2f}x the "
                "synchronised time): here the CPU side was the bottleneck, so little work was left on the GPU "
                "when the clock stopped. With larger batches or models the gap opens; synchronise anyway.")
    else:
        lines.append(
            f"On the CPU there is nothing to synchronise: an operation has finished when it returns, so both "
            f"readings time the same work and differ only by noise (unsynchronised {tp.unsynced_median_s * 1e3:.2f} ms, "
            f"{ratio:.2f}x). On a GPU, kernels run asynchronously and an unsynchronised clock can read far too little.")
    return "\n".join(lines)


@worded
def headline(res: RunResult) -> str:
    """The four headline numbers (time, memory, accuracy, size) plus throughput and FLOP/s, in words."""
    untimed = res.steps - res.timed_steps
    text = [
        f"Step time: median {res.step_time_s * 1e3:.2f} ms (10-90%: {res.step_time_p10_s * 1e3:.2f}-"
        f"{res.step_time_p90_s * 1e3:.2f} ms) over {res.timed_steps} timed steps; {untimed} warm-up and "
        f"profiling steps were not timed. Throughput: {res.throughput:.0f} samples/s.",
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


@worded
def memory(res: RunResult) -> str:
    """Allocated vs reserved, and the breakdown by category."""
    lines = []
    if res.reserved_memory_bytes is not None:
        gap = res.reserved_memory_bytes - res.peak_memory_bytes
        lines.append(
            f"Allocated peak {mib(res.peak_memory_bytes)}, reserved {mib(res.reserved_memory_bytes)}: the caching "
            f"allocator held {mib(gap)} that no tensor was using. nvidia-smi shows the reserved figure (plus the "
            "CUDA context); comparisons must use the allocated one.")
    else:
        lines.append(
            f"Peak {mib(res.peak_memory_bytes)} of live tensors. The CPU has no caching allocator, so there is no "
            "'reserved' figure here; on a GPU labkit reports both.")
    if res.memory:
        parts = ", ".join(f"{c.replace('_', ' ')} {mib(res.memory.get(c, 0))}" for c in MEMORY_CATEGORIES)
        lines.append(f"Each category's own peak during a step: {parts}.")
        largest = max(MEMORY_CATEGORIES, key=lambda c: res.memory.get(c, 0))
        total = sum(res.memory.get(c, 0) for c in MEMORY_CATEGORIES)
        tracked = sum(res.memory_at_peak.values()) if res.memory_at_peak else None
        sentence = (f"The largest is {largest.replace('_', ' ')}. The categories peak at different moments "
                    "(activations at the end of the forward pass, gradients and the backward pass's temporary "
                    "buffers later, while activations are being freed)")
        if tracked is not None and total > tracked:
            sentence += (f", so their peaks add up to {mib(total)}, more than the {mib(tracked)} held at "
                         "the moment of the total peak.")
        else:
            sentence += "."
        lines.append(sentence)
        if res.reserved_memory_bytes is not None and tracked is not None and res.peak_memory_bytes > tracked:
            lines.append(f"The allocator's peak is {mib(res.peak_memory_bytes - tracked)} above the tracked "
                         "tensors: cuBLAS/cuDNN workspaces and the allocator's rounding of each block.")
    elif res.memory_note:
        lines.append(res.memory_note)
    return "\n".join(lines)


@worded
def compare(name_a: str, a: RunResult, name_b: str, b: RunResult, metric: str = "accuracy") -> str:
    """One sentence comparing ``metric`` between two runs, e.g. pretrained vs from scratch."""
    va, vb = getattr(a, metric), getattr(b, metric)
    if metric == "accuracy":
        return (f"{name_a}: {va:.1%} vs {name_b}: {vb:.1%} after the same {a.steps} steps "
                f"({(va - vb) * 100:+.1f} percentage points).")
    return f"{name_a}: {va:.4g} vs {name_b}: {vb:.4g} ({va / vb:.2f}x)."


def flops_against_peaks(res: RunResult, measured: pd.DataFrame | None = None,
                        gpus=PEAK_GPUS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's achieved FLOP/s, and what to draw next to it: datasheet peaks, and the same run measured
    on real GPUs where such reference results are shipped.

    The peaks are published figures (`labkit.measure.PEAK_FLOPS`, from NVIDIA's datasheets), never
    measurements: they are what the hardware could do with perfectly sized kernels.

    Args:
        measured: reference results of this run from ``labkit.load_reference`` (may be empty).

    Returns:
        ``(live, peaks)``: one-row and one-row-per-GPU frames with ``setup`` and ``achieved_flops`` (the
        peaks' ``source`` says they are published), ready for ``plots.bar(live, x="setup",
        y="achieved_flops", reference=peaks, logy=True)``.

    Example:
        >>> live, peaks = flops_against_peaks(res)
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
    """How far the run's achieved FLOP/s is from each datasheet peak, as a fraction of it."""
    achieved = live["achieved_flops"].iloc[0]
    if not achieved:
        return "This run has no FLOP count (evaluate-only or a failed step), so there is nothing to compare."
    parts = [f"{achieved / row.achieved_flops:.2%} of the {row.setup}" for row in peaks.itertuples()
             if row.source == PEAK_SOURCE]
    return (f"Your run achieved {achieved / 1e12:.3g} TFLOP/s: " + ", ".join(parts)
            + ". A model this small leaves any GPU mostly idle; the gap is the room later notebooks work in.")


def _three_digits(value: float) -> float:
    """A measured number as a question shows it (three significant digits), so the learner can redo the sum."""
    return float(f"{value:.3g}")


def warmup_numbers(tp: TimingPitfalls, steps: int = 10) -> dict:
    """Your own numbers for exercise ``00.warmup_error``: the timing demo's first call and warm median.

    Example:
        >>> print(exercises.question("00.warmup_error", warmup_numbers(tp)))
    """
    return {"first_call_s": _three_digits(tp.first_call_s), "warm_median_s": _three_digits(tp.warm_median_s),
            "steps": steps}


def activation_share(res: RunResult) -> float:
    """The activations' peak as a fraction of the step's peak memory (the figure section 2 asks to predict)."""
    return res.memory["activations"] / res.peak_memory_bytes

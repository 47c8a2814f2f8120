"""Notebook 00 (start here): how labkit measures, and the sentences computed from a run's live results.

- `timing_demo`: one training step timed cold, warm and synchronised, and warm without synchronising.
- `timing`, `headline`, `memory`, `compare`: what a run measured, in words. Notebooks print these instead
  of typing figures into prose, so that on CPU and on GPU they stay true.
"""

from __future__ import annotations

from ..config import RunConfig
from ..measure import TimingPitfalls, timing_pitfalls
from ..result import MEMORY_CATEGORIES, RunResult
from ..train import Trainer
from ..units import mib


def timing_demo(cfg: RunConfig, warmup: int = 3, repeats: int = 10) -> TimingPitfalls:
    """Time one training step of ``cfg`` cold, warm and synchronised, and warm without synchronising.

    Example:
        >>> tp = timing_demo(cfg); tp.cold_vs_warm, tp.unsynced_vs_synced
    """
    trainer = Trainer(cfg)
    images, labels = next(iter(trainer.loader))
    return timing_pitfalls(lambda: trainer.step(images, labels), trainer.device, warmup, repeats)


def timing(tp: TimingPitfalls) -> str:
    """What the timing demo showed: cold vs warm, and unsynchronised vs synchronised."""
    lines = [
        f"First call: {tp.first_call_s * 1e3:.2f} ms, {tp.cold_vs_warm:.1f}x the warm median of "
        f"{tp.warm_median_s * 1e3:.2f} ms over {tp.repeats} calls. The first call pays one-off costs "
        "(allocating memory, choosing kernels" + (", creating cuBLAS/cuDNN handles" if tp.device == "cuda" else "")
        + "); timing it would overstate the step time.",
    ]
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


def compare(name_a: str, a: RunResult, name_b: str, b: RunResult, metric: str = "accuracy") -> str:
    """One sentence comparing ``metric`` between two runs, e.g. pretrained vs from scratch."""
    va, vb = getattr(a, metric), getattr(b, metric)
    if metric == "accuracy":
        return (f"{name_a}: {va:.1%} vs {name_b}: {vb:.1%} after the same {a.steps} steps "
                f"({(va - vb) * 100:+.1f} percentage points).")
    return f"{name_a}: {va:.4g} vs {name_b}: {vb:.4g} ({va / vb:.2f}x)."

"""Notebook 00's experiments (the timing demo, pretrained against from scratch, FLOP/s against datasheet peaks) and
the lines that word a run's numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import pandas as pd

from ...config import RunConfig
from ...display import quantity
from ...env import profile, profile_of
from ...labresult import LabResult
from ...measure import PEAK_FLOPS, Measured, TimingPitfalls, compare, timing_pitfalls
from ...messages import worded
from ...result import MEMORY_CATEGORIES, RunResult
from ...results import to_frame
from ...train import Trainer, fit
from ...units import mib

# The GPUs a learner of this lab meets (free: a T4 on Colab, two on Kaggle; rented: an A100 or an H100), at the
# dtypes their datasheets quote for training: fp32 (CUDA cores) and fp16/bf16 (tensor cores).
PEAK_GPUS = (("T4", "fp32"), ("T4", "fp16"), ("A100", "fp32"), ("A100", "bf16"), ("H100", "bf16"))
PEAK_SOURCE = "published: NVIDIA datasheet peaks"
ms = partial(quantity, "step_time_s")
# What each outcome means: the first call against the warm steps, an unsynchronised clock against a synchronised one.
WARM, LAUNCH, LOAD = ("this process was already warm", "launching the kernels (the CPU side) was the bottleneck",
                      "the machine's load alone")
FIRST_CALL = {1: "it paid one-off costs", 0: WARM, -1: WARM}
UNSYNCED = {"cuda": {-1: "the clock stopped before the GPU had finished", 0: LAUNCH, 1: LAUNCH},
            "cpu": {-1: LOAD, 0: "as on any CPU, there is nothing to wait for", 1: LOAD}}


def _said(head: str, c, meanings: dict) -> str:
    return f"{head} ({c.verdict})" + (f": {meanings[c.direction]}." if c.real is not None else ".")


@dataclass
class TimingDemo(LabResult):
    """One training step timed cold, warm and synchronised, and warm without synchronising (`pitfalls`)."""

    shown = ("method", "time_s")
    pitfalls: TimingPitfalls | None = None

    @worded
    def finding(self) -> str:
        tp = self.pitfalls
        warm = Measured(tp.warm_median_s, tp.warm_p10_s, tp.warm_p90_s)
        # One first call has no spread of its own: it is given the warm steps' relative spread.
        first = Measured(tp.first_call_s, *(tp.first_call_s * v / warm.value for v in (warm.low, warm.high)))
        unsynced = Measured(tp.unsynced_median_s, tp.unsynced_p10_s, tp.unsynced_p90_s)
        cold, plain = compare(first, warm, ("faster", "slower")), compare(unsynced, warm, ("shorter", "longer"))
        return (_said(f"First call {ms(first.value)}, {cold.ratio:.1f}x the warm median of {ms(warm.value)}", cold,
                      FIRST_CALL) + "\n"
                + _said(f"Not synchronised: {ms(unsynced.value)}, {plain.ratio:.2f}x the synchronised median", plain,
                        UNSYNCED["cuda" if tp.device == "cuda" else "cpu"]))

    def warmup_numbers(self, steps: int = 10) -> dict:
        """Your own numbers for exercise ``00.warmup_error`` (three significant digits)."""
        return {"first_call_s": float(f"{self.pitfalls.first_call_s:.3g}"),
                "warm_median_s": float(f"{self.pitfalls.warm_median_s:.3g}"), "steps": steps}


def timing_demo(cfg: RunConfig, warmup: int = 3, repeats: int = 10) -> TimingDemo:
    """One training step of ``cfg`` timed cold, warm and synchronised, and warm without synchronising."""
    trainer = Trainer(cfg)
    images, labels = next(iter(trainer.loader))
    tp = timing_pitfalls(lambda: trainer.step(images, labels), trainer.device, warmup, repeats)
    return TimingDemo(tp.to_frame(), pitfalls=tp)


@dataclass
class FromScratch(LabResult):
    """The same fine-tune from pretrained and from random weights (`runs`: name -> `RunResult`)."""

    shown = ("run", "weights", "steps", "accuracy", "step_time_s")
    runs: dict = field(default_factory=dict)

    @worded
    def finding(self) -> str:
        (name_a, a), (name_b, b) = self.runs.items()
        run_profile = profile_of(a.env) if a.env else None
        test_size = (run_profile or profile()).test_size
        c = compare(Measured.accuracy(a.accuracy, test_size), Measured.accuracy(b.accuracy, test_size))
        verdict = f"{name_a if c.direction > 0 else name_b} is better beyond the test set's noise" if c else c.verdict
        return (f"{name_a}: {a.accuracy:.1%} vs {name_b}: {b.accuracy:.1%} after the same {a.steps} steps "
                f"({(a.accuracy - b.accuracy) * 100:+.1f} percentage points): {verdict}.")


def from_scratch(cfg: RunConfig, pretrained: RunResult) -> FromScratch:
    """``cfg`` fine-tuned from random weights, beside its ``pretrained`` run."""
    runs = {"pretrained": pretrained, "from scratch": fit(cfg.replace(pretrained=False))}
    return FromScratch(to_frame(runs.values()).assign(run=list(runs)), runs=runs)


@dataclass
class Peaks(LabResult):
    """A run's achieved FLOP/s (source ``live``) beside published datasheet peaks and reference runs."""

    shown = ("setup", "achieved_flops", "source")

    @property
    def live(self) -> pd.DataFrame:
        return self.frame[self.frame.source == "live"]

    @property
    def reference(self) -> pd.DataFrame:
        return self.frame[self.frame.source != "live"]

    @worded
    def finding(self) -> str:
        achieved = self.live["achieved_flops"].iloc[0]
        if not achieved:
            return "This run has no FLOP count (evaluate-only or a failed step), so there is nothing to compare."
        parts = [f"{achieved / row.achieved_flops:.2%} of the {row.setup}" for row in self.frame.itertuples()
                 if row.source == PEAK_SOURCE]
        return f"Your run achieved {achieved / 1e12:.3g} TFLOP/s: " + ", ".join(parts) + "."


def flops_against_peaks(res: RunResult, measured: pd.DataFrame | None = None, gpus=PEAK_GPUS) -> Peaks:
    """``res``'s achieved FLOP/s beside the datasheet peaks of ``gpus`` and ``measured`` reference runs of it."""
    device = res.env.get("gpu") or res.env.get("device") or "this device"
    rows = [{"setup": f"your run ({device}, {res.precision_used})", "achieved_flops": res.achieved_flops,
             "source": "live"}]
    if measured is not None and len(measured):
        rows += [{"setup": f"{row.gpu or row.device} run ({row.precision_used})", "achieved_flops": row.achieved_flops,
                  "source": row.source} for row in measured.itertuples()]
    rows += [{"setup": f"{gpu} {dtype} peak", "achieved_flops": PEAK_FLOPS[gpu][dtype], "source": PEAK_SOURCE}
             for gpu, dtype in gpus]
    return Peaks(pd.DataFrame(rows))


@worded
def headline(res: RunResult) -> str:
    """A run's headline numbers (time, memory, accuracy, size), throughput and FLOP/s, a line each."""
    text = [
        f"Step time: median {res.step_time_s * 1e3:.2f} ms (10-90%: {res.step_time_p10_s * 1e3:.2f}-"
        f"{res.step_time_p90_s * 1e3:.2f} ms) over {res.timed_steps} timed steps; {res.steps - res.timed_steps} "
        f"warm-up and profiling steps were not timed. Throughput: {_throughput(res)}.",
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
    if res.tokens_per_s is None:
        return f"{res.throughput:.0f} samples/s"
    if res.pad_fraction and res.real_tokens_per_s is not None:
        return (f"{res.real_tokens_per_s:,.0f} real tokens/s ({res.tokens_per_s:,.0f} tokens/s counting the "
                f"{res.pad_fraction:.0%} padding)")
    return f"{res.tokens_per_s:,.0f} tokens/s"


@worded
def memory(res: RunResult) -> str:
    """A run's memory: allocated against reserved, the largest category, and the categories' peaks summed."""
    if res.reserved_memory_bytes is not None:
        lines = [f"Allocated peak {mib(res.peak_memory_bytes)}, reserved {mib(res.reserved_memory_bytes)}: the cache "
                 f"held {mib(res.reserved_memory_bytes - res.peak_memory_bytes)} that no tensor used."]
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


def activation_share(res: RunResult) -> float:
    """The activations' peak as a fraction of the step's peak memory."""
    return res.memory["activations"] / res.peak_memory_bytes

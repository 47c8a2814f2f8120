"""Notebook 01, sections 3, 4, 7 and "Going further": the same fine-tune in four precision setups, the memory
saving by batch size, and channels_last."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ... import results
from ...env import has_tensor_cores, native_bf16, profile, profile_of
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import PEAK_FLOPS, Comparison, Measured
from ...measure import compare as measured_against
from ...messages import worded
from ...units import MIB, change_between

SETUPS = {
    "fp32": {"precision": "fp32", "tf32": False},
    "fp32 + TF32": {"precision": "fp32", "tf32": True},
    "fp16 + GradScaler": {"precision": "fp16", "tf32": False},
    "bf16": {"precision": "bf16", "tf32": False},
}
LOW_SETUPS = ("fp16 + GradScaler", "bf16")
SPEEDUP_SOURCE = "published: NVIDIA T4 datasheet, tensor-core fp16 peak / fp32 peak"
STEP_TIMES = ("step_time_s", "step_time_p10_s", "step_time_p90_s")


def setup_label(precision: str, tf32: bool = False) -> str:
    """The name of a precision setup in the notebook's tables: ``fp16`` is ``fp16 + GradScaler``."""
    for label, fields in SETUPS.items():
        if fields == {"precision": precision, "tf32": bool(tf32)}:
            return label
    return f"{precision} + TF32" if tf32 else precision


def table(runs) -> pd.DataFrame:
    """A results frame with a ``setup`` column, from RunResults (a list or a dict) or a results frame."""
    runs = list(runs.values()) if isinstance(runs, dict) else runs
    frame = runs.copy() if isinstance(runs, pd.DataFrame) else results.to_frame(runs)
    used = frame["precision"]
    if "precision_used" in frame:  # what a run resolved to ("auto"); a failed run resolved nothing
        ran = frame["precision_used"].notna() & (frame["error"].isna() if "error" in frame else True)
        used = frame["precision_used"].where(ran, frame["precision"])
    frame["setup"] = [setup_label(p, t) for p, t in zip(used, frame["tf32"], strict=True)]
    return frame


def speedup(row, base) -> Comparison:
    """``base``'s step time over ``row``'s: ``row``'s speed-up, and whether ``row`` is faster beyond the noise."""
    return measured_against(Measured.row(base, "step_time_s"), Measured.row(row, "step_time_s"), ("slower", "faster"))


def speed_phrase(row, base, reference: str = "fp32") -> str:
    """``"1.52x fp32's speed (faster)"``."""
    c = speedup(row, base)
    return f"{c.ratio:.2f}x {reference}'s speed ({c.verdict})"


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["error"].isna()] if "error" in frame else frame


@dataclass
class SetupRuns(LabResult):
    """Runs of one fine-tune in several precision setups, one row per ``setup``."""

    def rows(self) -> dict:
        """The successful runs by setup label."""
        return {row["setup"]: row for _, row in _ok(self.frame).iterrows()}

    def ran(self, *labels: str) -> dict:
        """The successful runs, where every one of ``labels`` ran (else a `ConfigError` naming them)."""
        rows = self.rows()
        missing = [label for label in labels if label not in rows]
        if missing:
            raise ConfigError("df", f"setups {sorted(rows)}", f"a frame where {', '.join(missing)} ran successfully "
                                                             "(a failed run has no numbers to compare)")
        return rows

    def speedup(self, low: str) -> Comparison:
        """``low``'s speed-up on fp32: ``.ratio``, and ``.band`` the ratios the two runs' spreads allow."""
        rows = self.ran("fp32", setup_label(low))
        return speedup(rows[setup_label(low)], rows["fp32"])


@dataclass
class Precisions(SetupRuns):
    """`compare`'s runs (`runs`: setup -> `RunResult`) on the device `env` describes."""

    shown = ("setup", *STEP_TIMES, "peak_memory_bytes", "mem_activations_bytes", "accuracy")
    env: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)

    @worded
    def finding(self) -> str:
        rows = self.rows()
        base = rows.get("fp32")
        if base is None:
            return "No successful fp32 run to compare against."
        lines = [self._line(label, rows[label], base) for label in LOW_SETUPS if label in rows]
        if "fp32 + TF32" in rows:  # TF32: Ampere (capability 8.0) and later GPUs only, as native bf16
            cuda, capability = self.env.get("device") == "cuda", self.env.get("capability")
            where = f"this GPU (capability {capability})" if cuda else "a CPU"
            tf32 = cuda and capability and native_bf16(tuple(int(v) for v in str(capability).split(".")))
            lines.append(f"TF32: {speed_phrase(rows['fp32 + TF32'], base)}"
                         + ("." if tf32 else f": {where} has no TF32, both runs did the same work."))
        return "\n".join(lines)

    @staticmethod
    def _line(label: str, row, base) -> str:
        line = (f"{label}: {speed_phrase(row, base)}, peak memory "
                f"{change_between(row['peak_memory_bytes'], base['peak_memory_bytes'])}")
        if row.get("accuracy") is None or base.get("accuracy") is None:
            return line + "."
        line += f", accuracy {row['accuracy']:.1%} vs {base['accuracy']:.1%}"
        planned = row.get("planned_steps")
        if planned is not None and not pd.isna(planned):
            return line + f" (after {int(row['steps'])} of {int(planned)} steps: emulated)."
        run_profile = profile_of(base.get("profile")) if isinstance(base.get("profile"), str) else None
        size = (run_profile or profile()).test_size
        c = measured_against(Measured.accuracy(row["accuracy"], size), Measured.accuracy(base["accuracy"], size))
        return line + f" ({c.verdict})."

    def peak_fraction(self, low: str) -> float:
        """``low``'s peak memory as a fraction of fp32's."""
        rows = self.ran("fp32", setup_label(low))
        return rows[setup_label(low)]["peak_memory_bytes"] / rows["fp32"]["peak_memory_bytes"]

    def speedups(self, published: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Each setup's speed-up on fp32 (``live``), and published ones with the T4's peak ratio (``reference``)."""
        base = self.ran("fp32")["fp32"]["step_time_s"]
        live = pd.DataFrame([{"setup": label, "speedup_vs_fp32": base / row["step_time_s"], "source": "live"}
                             for label, row in self.rows().items()])
        t4 = PEAK_FLOPS["T4"]
        reference = [{"setup": "T4 peak ratio", "speedup_vs_fp32": t4["fp16"] / t4["fp32"], "source": SPEEDUP_SOURCE}]
        if published is not None and len(published):
            reference = published[["setup", "speedup_vs_fp32", "source"]].to_dict("records") + reference
        return live, pd.DataFrame(reference)

    @worded
    def advice(self) -> str:
        """Which precision to use here, from the device's capabilities and (on a CPU) the measured speeds."""
        choice, why = _hardware_choice(self.env)
        rows = self.rows()
        low = setup_label("bf16" if choice == "bf16" else "fp16")
        if self.env.get("device") != "cuda" and "fp32" in rows and low in rows and (
                speedup(rows[low], rows["fp32"]).direction != 1):
            choice, why = "fp32", f"{low} was not faster here"
        measured = [f"{label} {speedup(rows[label], rows['fp32']).ratio:.2f}x" for label in LOW_SETUPS
                    if label in rows and "fp32" in rows]
        return f"Here: {choice} ({why})." + (f" Measured: {', '.join(measured)} fp32's speed." if measured else "")

    def own_saving_numbers(self, low: str) -> dict:
        """Your own numbers for exercise ``01.own_saving`` (MiB, three digits)."""
        rows = self.ran("fp32", setup_label(low))
        fp32, lower = rows["fp32"], rows[setup_label(low)]
        return {"fp32_peak_mib": _mib(fp32["peak_memory_bytes"]), "fp32_activations_mib":
                _mib(fp32["mem_activations_bytes"]), "low_activations_mib": _mib(lower["mem_activations_bytes"]),
                "low": low}

    @worded
    def own_saving(self, low: str) -> str:
        """The measured saving beside the one exercise ``01.own_saving`` computes from the activations alone."""
        numbers = self.own_saving_numbers(low)
        computed = (numbers["fp32_activations_mib"] - numbers["low_activations_mib"]) / numbers["fp32_peak_mib"]
        measured = 1 - self.peak_fraction(low)
        rest = ("the rest is the other categories" if abs(measured - computed) > 0.005
                else "the activations account for all of it")
        return (f"From the activations alone: {computed:.1%} of the fp32 peak; measured: {low} saved "
                f"{measured:.1%} of it: {rest}.")


def _mib(value: float) -> float:
    return float(f"{value / MIB:.3g}")


def compare(cfg, env: dict | None = None, setups: dict | None = None, refresh: bool = False,
            progress: bool = True) -> Precisions:
    """The same fine-tune in fp32, fp32 + TF32, fp16 + GradScaler and bf16 (or ``setups``: label -> fields), cached;
    a setup the device refuses is a run with its ``error``."""
    setups = setups or SETUPS
    runs = results.run_configs([cfg.replace(**fields) for fields in setups.values()], refresh=refresh,
                               progress=progress)
    runs = dict(zip(setups, runs, strict=True))
    return Precisions(table(runs), env=env or {}, runs=runs)


def _hardware_choice(env: dict) -> tuple[str, str]:
    """The precision this device's capabilities point to, and why."""
    if env.get("device") != "cuda":
        if env.get("bf16"):
            return "bf16", "this CPU has bf16 instructions"
        return "fp32", "this CPU has no bf16 instructions" if env.get("bf16") is False else "bf16 support unknown"
    capability = str(env.get("capability"))
    major, minor = (int(v) for v in capability.split("."))
    if not has_tensor_cores((major, minor)):
        return "fp16 for memory, measure before counting on speed", f"capability {capability}: no tensor cores"
    if not native_bf16((major, minor)):
        return "fp16 + GradScaler", f"capability {capability}: fp16 tensor cores, no native bf16"
    return "bf16", f"capability {capability}: native bf16 on tensor cores"


@dataclass
class MemorySavings(LabResult):
    """A sweep over ``precision=["fp32", low]`` and batch sizes, a few steps each."""

    shown = ("batch_size", "precision", "peak_memory_bytes", "mem_activations_bytes")
    low: str = "bf16"

    @worded
    def finding(self) -> str:
        savings, fixed_changed = [], False
        for batch_size, group in _ok(self.frame).groupby("batch_size"):
            by = {row["precision"]: row for _, row in group.iterrows()}
            if "fp32" in by and self.low in by:
                full, half = by["fp32"], by[self.low]
                savings.append((batch_size, full["peak_memory_bytes"] - half["peak_memory_bytes"],
                                change_between(half["peak_memory_bytes"], full["peak_memory_bytes"])))
                fixed_changed |= any(abs(full[f"mem_{c}_bytes"] - half[f"mem_{c}_bytes"]) >= 1024
                                     for c in ("parameters", "gradients", "optimizer_state"))
        if not savings:
            return f"No batch size with both fp32 and {self.low} runs."
        shown = [savings[0], savings[-1]] if len(savings) > 1 else savings
        parts = " and ".join(f"{saved / MIB:.1f} MiB ({words}) at batch {b}" for b, saved, words in shown)
        fixed = "the fixed part changed too" if fixed_changed else "parameters, gradients and optimizer state unchanged"
        trend = "" if len(savings) < 2 else (": the saving grows with the batch" if savings[-1][1] > savings[0][1]
                                             else ": the saving does not grow with the batch")
        return f"{self.low} saved {parts}; {fixed}{trend}."


def memory_savings(cfg, low: str, batch_sizes=None) -> MemorySavings:
    """Peak memory in fp32 and ``low`` at each of ``batch_sizes`` (default: the profile's), a few steps each."""
    prof = profile()
    short = cfg.replace(max_steps=prof.warmup_steps + 4, evaluate=False)
    sweep = results.sweep(short, precision=["fp32", low], batch_size=list(batch_sizes or prof.batch_sizes))
    return MemorySavings(sweep, low=low)


@dataclass
class Layouts(LabResult):
    """A sweep over ``precision`` and ``channels_last``."""

    shown = ("precision", "channels_last", *STEP_TIMES)

    @worded
    def finding(self) -> str:
        parts = []
        for name, group in _ok(self.frame).groupby("precision", sort=False):
            by = {bool(row["channels_last"]): row for _, row in group.iterrows()}
            if True in by and False in by:
                c = speedup(by[True], by[False])
                parts.append(f"{name} {c.ratio:.2f}x ({c.verdict})")
        return f"channels_last, speed against the default layout: {'; '.join(parts)}." if parts else (
            "No pair of layouts to compare.")


def layouts(cfg, low: str) -> Layouts:
    """``cfg`` in fp32 and ``low``, each with the default memory layout and with channels_last."""
    return Layouts(results.sweep(cfg, precision=["fp32", low], channels_last=[False, True]))

"""Notebook 01 (mixed precision): its experiments and the findings worded from their live numbers.

- `formats`: fp32, fp16 and bf16 side by side; `gradient_underflow`: what fp16 zeroes, with and without
  loss scaling; `scaler_trace`: the GradScaler's scale and skipped steps; `autocast_dtypes`: autocast's
  op lists, probed.
- `compare`, `table`: the same fine-tune in fp32, fp32 + TF32, fp16 + GradScaler and bf16; `summary`,
  `tf32_finding`, `memory_savings`, `channels_last_finding`, `scaler_finding` and `advice` say what
  they measured.

The mechanism (autocast, the GradScaler, `run_in_fp32`) is in `labkit.techniques.precision`.
"""

from __future__ import annotations

import math

import pandas as pd
import torch
import torch.nn.functional as F

from ... import data, results, train
from ...env import has_tensor_cores, native_bf16, profile
from ...errors import ConfigError
from ...measure import PEAK_FLOPS
from ...messages import note, worded
from ...techniques.precision import DTYPES, Precision, autocast
from ...units import MIB, change_between

FP16_SMALLEST_SUBNORMAL = 2.0**-24  # ~6e-8: anything smaller in magnitude rounds to 0 in fp16
FP16_SMALLEST_NORMAL = 2.0**-14  # ~6e-5: below it fp16 loses precision (subnormals)
FP16_MAX = 65504.0


def formats() -> pd.DataFrame:
    """fp32, fp16 and bf16 side by side, from ``torch.finfo``: bits, range and precision.

    fp16 has 10 mantissa bits but only 5 exponent bits (max 65504, smallest subnormal ~6e-8):
    precise, narrow. bf16 keeps fp32's 8 exponent bits (same range) with 7 mantissa bits: coarse, wide.

    Example:
        >>> formats().set_index("format").loc["fp16", "max"]
        65504.0
    """
    rows = []
    for name, dtype in {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.items():
        info = torch.finfo(dtype)
        mantissa = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
        rows.append({"format": name, "bits": info.bits, "exponent bits": info.bits - 1 - mantissa,
                     "mantissa bits": mantissa, "max": info.max, "smallest normal": info.tiny,
                     "smallest subnormal": info.smallest_normal * info.eps, "eps (precision near 1)": info.eps})
    return pd.DataFrame(rows)


def _first_batch(trainer):
    images, labels = next(iter(trainer.loader))
    x = data.to_model_input(images, trainer.train_split, trainer.device, trainer.cfg.channels_last,
                             trainer.cfg.image_size)
    return x, labels.to(trainer.device)


def _gradients(model, x, y, precision: Precision, device, loss_multiplier: float, scale: float) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with autocast(precision, device):
        loss = F.cross_entropy(model(x), y) * loss_multiplier
    (loss * scale).backward()
    return [p.grad.detach().float() / scale for p in model.parameters() if p.grad is not None]


def gradient_underflow(cfg, loss_multipliers=(1.0,), scale: float = 2.0**16) -> pd.DataFrame:
    """Count the gradients fp16 loses to underflow, without and with loss scaling.

    One batch, one backward pass each: float32 (the reference), fp16 autocast without scaling, and
    fp16 with the loss multiplied by ``scale`` before backward and the gradients divided by it after
    (what a GradScaler does; 2**16 is its initial scale). A gradient element is *zeroed* when it is
    non-zero in float32 but exactly zero in the fp16 run: it fell below fp16's smallest subnormal
    (~6e-8) somewhere in the backward pass.

    Args:
        cfg: the run whose model and first batch are used (its precision is ignored).
        loss_multipliers: multiply the loss by each, e.g. 1e-3 to stand for the small losses late in
            training or a loss averaged over many tokens: smaller losses, smaller gradients, more underflow.
        scale: the loss scale of the scaled run.

    Returns:
        A DataFrame, one row per (loss multiplier, run): ``zeroed_gradients``, ``zeroed_fraction``,
        ``max_rel_error`` (largest |g - g_fp32| / max|g_fp32| over the parameter tensors) and
        ``fp32_below_fp16_subnormal`` (float32 gradient elements already below fp16's range).

    Example:
        >>> gradient_underflow(cfg, loss_multipliers=(1.0, 1e-3))[["run", "zeroed_gradients"]]
    """
    if isinstance(loss_multipliers, (int, float)):
        loss_multipliers = (loss_multipliers,)
    trainer = train.Trainer(cfg.replace(precision="fp32", evaluate=False))
    model, device = trainer.model, trainer.device
    x, y = _first_batch(trainer)
    fp16 = Precision("fp16", "fp16")
    rows = []
    for multiplier in loss_multipliers:
        runs = {
            "fp32": _gradients(model, x, y, Precision("fp32", "fp32"), device, multiplier, 1.0),
            "fp16, no scaling": _gradients(model, x, y, fp16, device, multiplier, 1.0),
            f"fp16, loss scaled by {scale:g}": _gradients(model, x, y, fp16, device, multiplier, scale),
        }
        reference = runs["fp32"]
        total = sum(g.numel() for g in reference)
        below = sum(int(((g != 0) & (g.abs() < FP16_SMALLEST_SUBNORMAL)).sum()) for g in reference)
        for run, grads in runs.items():
            pairs = list(zip(reference, grads, strict=True))
            zeroed = sum(int(((r != 0) & (g == 0)).sum()) for r, g in pairs)
            error = max(float((g - r).abs().max() / r.abs().max()) for r, g in pairs if r.abs().max() > 0)
            rows.append({"loss_multiplier": multiplier, "run": run, "zeroed_gradients": zeroed,
                         "zeroed_fraction": zeroed / total, "max_rel_error": error, "num_gradients": total,
                         "fp32_below_fp16_subnormal": below})
    model.zero_grad(set_to_none=True)
    return pd.DataFrame(rows)


def scaler_trace(cfg, steps: int | None = None, init_scale: float = 2.0**16, growth_interval: int = 2000,
                 refresh: bool = False):
    """Train in fp16 with a GradScaler and record its scale and the skipped steps, step by step.

    The scaler multiplies the loss by ``scale`` before backward. When a gradient comes out inf/NaN
    (the scaled values overflowed fp16's maximum, 65504), it skips that optimizer step and halves
    the scale; after ``growth_interval`` clean steps in a row it doubles the scale.

    Returns:
        A DataFrame, one row per optimizer step: ``step``, ``scale`` (used in that step), ``skipped``,
        ``loss``.

    Example:
        >>> tr = scaler_trace(cfg, steps=30); tr.skipped.sum()

    Measured once per config and settings, then read from the cache (``refresh=True`` trains again).
    """
    trace = results.cached_frame("mp-scaler-trace", [cfg], lambda: _trace_scaler(cfg, steps, init_scale,
                                                                                   growth_interval),
                                 refresh=refresh, steps=steps, init_scale=init_scale, growth_interval=growth_interval)
    planned = steps or cfg.max_steps
    if planned and len(trace) < planned:  # said on every call, the cached one too
        note(f"fp16 is emulated here, so the scaler trace covers {len(trace)} of {planned} steps "
             f"(the {profile().name} profile's limit for emulated runs)")
    return trace


def _trace_scaler(cfg, steps: int | None, init_scale: float, growth_interval: int) -> pd.DataFrame:
    trainer = train.Trainer(cfg.replace(precision="fp16", evaluate=False))
    trainer.scaler = torch.amp.GradScaler(trainer.device.type, init_scale=init_scale,
                                          growth_interval=growth_interval)
    steps = steps or cfg.max_steps or len(trainer.loader)
    limit = train.emulated_step_limit(trainer.profile)
    if trainer.precision.emulated and steps > limit:
        steps = limit
    rows = []
    for step, (images, labels) in enumerate(trainer.batches(steps), start=1):
        scale = trainer.scaler.get_scale()  # reading it synchronises: fine here, nothing is timed
        loss = float(trainer.step(images, labels))
        rows.append({"step": step, "scale": scale, "skipped": trainer.scaler.get_scale() < scale, "loss": loss})
    return pd.DataFrame(rows)


AUTOCAST_PROBES = {
    # name: (what it stands for, function of a float32 input x of shape (8, 16))
    "linear (matmul)": lambda x: torch.nn.functional.linear(x, torch.ones(16, 16, device=x.device)),
    "conv2d": lambda x: torch.nn.functional.conv2d(x.view(8, 1, 4, 4), torch.ones(2, 1, 3, 3, device=x.device)),
    "relu": torch.relu,
    "add": lambda x: x + 1,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (16,)),
    "exp": torch.exp,
    "sum": torch.sum,
    "cross_entropy (loss)": lambda x: torch.nn.functional.cross_entropy(x, torch.zeros(8, dtype=torch.long,
                                                                                       device=x.device)),
    "mse_loss (loss)": lambda x: torch.nn.functional.mse_loss(x, torch.zeros_like(x)),
}


def autocast_dtypes(device: torch.device | str = "cpu", dtype: str = "bf16"):
    """What autocast does to each common op on ``device``: computed by the installed PyTorch, not looked up.

    Autocast keeps three lists: ops it always runs in the low precision (matmuls, convolutions), ops
    it always runs in float32 (reductions, softmax, norms, losses: precision-sensitive), and the
    rest, which run in whatever dtype their inputs have (relu after a bf16 conv stays bf16). The lists
    differ between CPU and CUDA and between PyTorch versions, so each op is probed twice under
    autocast: with a float32 input and with a ``dtype`` input.

    Args:
        device: where to run the probes.
        dtype: ``fp16`` or ``bf16``.

    Returns:
        A DataFrame: ``op``, ``from float32`` and ``from low precision`` (the output dtype for each
        input), ``autocast policy`` (``low precision``, ``float32`` or ``follows its input``).

    Example:
        >>> autocast_dtypes("cpu", "bf16").set_index("op").loc["softmax", "autocast policy"]
        'float32'
    """
    device = torch.device(device)
    low = DTYPES[dtype]
    x = torch.randn(8, 16, device=device)
    rows = []
    with torch.autocast(device.type, dtype=low):
        for op, fn in AUTOCAST_PROBES.items():
            from_fp32, from_low = fn(x).dtype, fn(x.to(low)).dtype
            if from_fp32 == low:
                policy = "low precision"
            elif from_low == torch.float32:
                policy = "float32"
            else:
                policy = "follows its input"
            rows.append({"op": op, "from float32": str(from_fp32).replace("torch.", ""),
                         "from low precision": str(from_low).replace("torch.", ""), "autocast policy": policy})
    return pd.DataFrame(rows)


SETUPS = {
    "fp32": {"precision": "fp32", "tf32": False},
    "fp32 + TF32": {"precision": "fp32", "tf32": True},
    "fp16 + GradScaler": {"precision": "fp16", "tf32": False},
    "bf16": {"precision": "bf16", "tf32": False},
}


def setup_label(precision: str, tf32: bool) -> str:
    """The name a run's precision setup has in the notebook's tables and charts."""
    for label, fields in SETUPS.items():
        if fields == {"precision": precision, "tf32": bool(tf32)}:
            return label
    return f"{precision} + TF32" if tf32 else precision


def table(runs) -> pd.DataFrame:
    """A results frame (one row per run) with a ``setup`` column, from RunResults or a results frame.

    Works for live runs and for reference results (``labkit.load_reference``), so both carry the
    same labels in a chart.

    Example:
        >>> df = table(compare(cfg)); df[["setup", "step_time_s", "peak_memory_bytes"]]
    """
    if isinstance(runs, dict):
        runs = list(runs.values())
    frame = runs.copy() if isinstance(runs, pd.DataFrame) else results.to_frame(runs)
    used = frame["precision"]
    if "precision_used" in frame:  # what a run resolved to ("auto"); a failed run resolved nothing
        ran = frame["precision_used"].notna() & (frame["error"].isna() if "error" in frame else True)
        used = frame["precision_used"].where(ran, frame["precision"])
    frame["setup"] = [setup_label(p, t) for p, t in zip(used, frame["tf32"], strict=True)]
    return frame


def compare(cfg, setups: dict | None = None, refresh: bool = False, progress: bool = True) -> dict:
    """Run the same fine-tune once per precision setup (fp32, fp32 + TF32, fp16 + GradScaler, bf16).

    Runs are cached like `labkit.sweep`'s, so a rerun is instant.

    Returns:
        A dict label -> `RunResult`, in the order of ``setups`` (default `SETUPS`).

    Example:
        >>> runs = compare(cfg); table(runs)
    """
    setups = setups or SETUPS
    # A setup the device cannot run at all (bf16 GEMMs on some pre-Ampere GPUs) becomes a result with its
    # error, shown in the table, instead of stopping the comparison.
    runs = results.run_configs([cfg.replace(**fields) for fields in setups.values()], refresh=refresh, progress=progress)
    return dict(zip(setups, runs, strict=True))


NOISE = 0.05  # speed ratios within 5 % of 1 are called "the same": this is the run-to-run noise of a quiet machine


def _ratio_phrase(ratio: float, reference: str = "fp32") -> str:
    if ratio >= 1 + NOISE:
        return f"{ratio:.2f}x the speed of {reference} (faster)"
    if ratio <= 1 - NOISE:
        return f"{ratio:.2f}x the speed of {reference} (slower)"
    return f"{ratio:.2f}x the speed of {reference} (the same, within noise)"


def has_tf32(env: dict) -> bool:
    """TF32 exists on Ampere (capability 8.0) and later GPUs only."""
    capability = env.get("capability")
    return env.get("device") == "cuda" and bool(capability) and native_bf16(
        tuple(int(v) for v in str(capability).split(".")))


def _by_setup(df) -> dict:
    """The successful runs of a results frame, by setup label."""
    frame = df if "setup" in df else table(df)
    return {row["setup"]: row for _, row in frame.iterrows() if not isinstance(row.get("error"), str)}


@worded
def summary(df, env: dict | None = None) -> str:
    """What the precision comparison measured, in sentences computed from the frame (see `table`).

    Speed is compared as ratios to the plain fp32 run; memory as allocated peaks and activations. With
    ``env`` (`labkit.env_report`), a TF32 run on a device without TF32 is called the same work as fp32.
    """
    rows = _by_setup(df)
    base = rows.get("fp32")
    if base is None:
        return "No successful fp32 run to compare against."
    lines = []
    for label, row in rows.items():
        if label == "fp32":
            continue
        speed = base["step_time_s"] / row["step_time_s"]
        if label == "fp32 + TF32" and env is not None and not has_tf32(env):
            lines.append(f"{label}: the same work as fp32 on this device, which has no TF32 (Ampere+ GPUs only); "
                         f"its {speed:.2f}x speed ratio is run-to-run noise.")
            continue
        acc = ""
        if row.get("accuracy") is not None and base.get("accuracy") is not None:
            acc = f"; accuracy {row['accuracy']:.1%} vs {base['accuracy']:.1%}"
            planned = row.get("planned_steps")
            if planned is not None and not pd.isna(planned):
                acc += f" (after {int(row['steps'])} of {int(planned)} steps: emulated here, so cut short)"
        lines.append(f"{label}: {_ratio_phrase(speed)} ({row['step_time_s'] * 1e3:.1f} vs "
                     f"{base['step_time_s'] * 1e3:.1f} ms per step); peak memory {row['peak_memory_bytes'] / MIB:.1f} "
                     f"vs {base['peak_memory_bytes'] / MIB:.1f} MiB ({change_between(row['peak_memory_bytes'], base['peak_memory_bytes'])})"
                     f"{acc}.")
    return "\n".join(lines)


@worded
def tf32_finding(df, env: dict) -> str:
    """What TF32 did here, and why (it only exists on Ampere and later GPUs)."""
    rows = _by_setup(df)
    if "fp32" not in rows or "fp32 + TF32" not in rows:
        return "Run both fp32 setups (TF32 off and on) to see what TF32 does."
    ratio = rows["fp32"]["step_time_s"] / rows["fp32 + TF32"]["step_time_s"]
    if env.get("device") != "cuda":
        return (f"TF32 is a tensor-core format of Ampere and later GPUs; on this CPU both fp32 runs did the same "
                f"work, so their ratio ({ratio:.2f}x) is measurement noise.")
    capability = env.get("capability")
    if not has_tf32(env):
        return (f"This GPU (capability {capability}) predates Ampere and has no TF32: both fp32 runs did the same "
                f"work ({ratio:.2f}x, noise).")
    return (f"TF32 made fp32 {ratio:.2f}x as fast here. A float32 baseline with TF32 silently on is a TF32 baseline: "
            "mixed-precision speed-ups measured against it look smaller than against true fp32.")


@worded
def advice(env: dict, df=None) -> str:
    """Which precision to use on this machine, from its capabilities and (if given) what this run measured.

    Example:
        >>> print(advice(labkit.env_report(), table(runs)))
    """
    lines = []
    if env.get("device") == "cuda":
        gpu, capability = env.get("gpu"), env.get("capability")
        major, minor = (int(v) for v in str(capability).split("."))
        if not has_tensor_cores((major, minor)):
            lines.append(f"{gpu} (capability {capability}) has no tensor cores: fp16 halves activation memory, and "
                         "its fp16 arithmetic may be faster on paper (a P100 runs fp16 at twice the fp32 rate), but "
                         "autocast's casts and small kernels often eat that, so AMP may be no faster or even slower; "
                         "bf16 is emulated or unsupported. Use fp16 for memory, and measure before counting on speed.")
        elif not native_bf16((major, minor)):
            lines.append(f"{gpu} (capability {capability}) has fp16 tensor cores but no native bf16: use fp16 with a "
                         "GradScaler (precision='auto' picks it); bf16 runs, emulated and slowly.")
        else:
            lines.append(f"{gpu} (capability {capability}) runs bf16 natively on tensor cores: use bf16 "
                         "(precision='auto' picks it). It has fp32's range, so it needs no GradScaler.")
    else:
        bf16 = {True: "has AVX512-BF16/AMX instructions", False: "has no bf16 instructions (bf16 is emulated)",
                None: "could not be checked for bf16 instructions"}[env.get("bf16")]
        fp16 = {True: "has fp16 arithmetic (AVX512-FP16/AMX-FP16)",
                False: "has no fp16 arithmetic (fp16 is emulated)", None: "could not be checked for fp16"}[
            env.get("fp16_native")]
        lines.append(f"This CPU {bf16} and {fp16}. On a CPU, low precision pays only with those instructions; "
                     "memory shrinks either way.")
    if df is not None:
        rows = _by_setup(df)
        if "fp32" in rows:
            measured = [f"{label} ran at {rows['fp32']['step_time_s'] / row['step_time_s']:.2f}x"
                        for label, row in rows.items() if label in ("fp16 + GradScaler", "bf16")]
            if measured:
                lines.append("Measured here: " + " and ".join(measured) + " the speed of fp32.")
    return "\n".join(lines)


@worded
def memory_savings(df, low: str) -> str:
    """How much ``low`` precision saved against fp32 at each batch size, and which part shrank.

    ``df`` is a sweep over ``precision=["fp32", low]`` and several ``batch_size`` values.
    """
    ok = df[df["error"].isna()] if "error" in df else df
    lines, savings = [], []
    for batch_size, group in ok.groupby("batch_size"):
        by = {row["precision"]: row for _, row in group.iterrows()}
        if "fp32" not in by or low not in by:
            continue
        full, half = by["fp32"], by[low]
        saved = full["peak_memory_bytes"] - half["peak_memory_bytes"]
        act = full["mem_activations_bytes"] - half["mem_activations_bytes"]
        fixed = sum(full[f"mem_{c}_bytes"] - half[f"mem_{c}_bytes"]
                    for c in ("parameters", "gradients", "optimizer_state"))
        savings.append((batch_size, saved))
        fixed_text = "unchanged" if abs(fixed) < 1024 else f"{fixed / MIB:.2f} MiB smaller"
        lines.append(f"batch {batch_size}: peak {full['peak_memory_bytes'] / MIB:.1f} -> "
                     f"{half['peak_memory_bytes'] / MIB:.1f} MiB ({change_between(half['peak_memory_bytes'], full['peak_memory_bytes'])}); "
                     f"activations {act / MIB:.1f} MiB smaller; parameters + gradients + optimizer state {fixed_text}.")
    if len(savings) >= 2:
        (b0, s0), (b1, s1) = savings[0], savings[-1]
        trend = "grows" if s1 > s0 else "does not grow"
        lines.append(f"The saving {trend} with the batch: {s0 / MIB:.1f} MiB at batch {b0}, {s1 / MIB:.1f} MiB at "
                     f"batch {b1}: only the parts that scale with the batch (activations, backward buffers) shrink.")
    return "\n".join(lines)


@worded
def channels_last_finding(df) -> str:
    """Speed of channels_last relative to the default layout, per precision, from a sweep frame."""
    ok = df[df["error"].isna()] if "error" in df else df
    lines = []
    for precision_name, group in ok.groupby("precision", sort=False):
        by = {bool(row["channels_last"]): row for _, row in group.iterrows()}
        if True in by and False in by:
            ratio = by[False]["step_time_s"] / by[True]["step_time_s"]
            lines.append(f"{precision_name}: channels_last ran at {_ratio_phrase(ratio, 'the default layout')}.")
    return "\n".join(lines)


@worded
def scaler_finding(trace: pd.DataFrame) -> str:
    """One sentence on a `scaler_trace`: steps skipped, and where the scale started and ended."""
    skipped = int(trace["skipped"].sum())
    first, last = trace["scale"].iloc[0], trace["scale"].iloc[-1]
    return (f"{skipped} of {len(trace)} optimizer steps were skipped (inf/NaN gradients); the scale went from "
            f"2**{math.log2(first):.0f} to 2**{math.log2(last):.0f} by the last step.")


def _ran(df, *labels: str) -> dict:
    """The successful runs of ``labels``; a setup that failed or is missing is a `ConfigError` naming it."""
    rows = _by_setup(df)
    missing = [label for label in labels if label not in rows]
    if missing:
        raise ConfigError("df", f"setups {sorted(rows)}", f"a frame where {', '.join(missing)} ran successfully "
                                                         "(a failed run has no numbers to compare)")
    return rows


def low_setup(low: str) -> str:
    """The setup label of the low precision ``low`` ("bf16" or "fp16") in `table`'s frames."""
    return setup_label(low, False)


def peak_fraction(df, low: str) -> float:
    """The ``low`` setup's peak memory as a fraction of fp32's (the figure section 2 asks to predict)."""
    rows = _ran(df, "fp32", low_setup(low))
    return rows[low_setup(low)]["peak_memory_bytes"] / rows["fp32"]["peak_memory_bytes"]


def speedup(df, low: str) -> float:
    """fp32's step time over the ``low`` setup's: above 1, ``low`` is faster."""
    rows = _ran(df, "fp32", low_setup(low))
    return rows["fp32"]["step_time_s"] / rows[low_setup(low)]["step_time_s"]


def own_saving_numbers(df, low: str) -> dict:
    """Your own numbers for exercise ``01.own_saving``, from the comparison's frame (MiB, three digits)."""
    rows = _ran(df, "fp32", low_setup(low))
    fp32, lower = rows["fp32"], rows[low_setup(low)]

    def in_mib(value):
        return float(f"{value / MIB:.3g}")

    return {"fp32_peak_mib": in_mib(fp32["peak_memory_bytes"]),
            "fp32_activations_mib": in_mib(fp32["mem_activations_bytes"]),
            "low_activations_mib": in_mib(lower["mem_activations_bytes"]), "low": low}


@worded
def own_saving_finding(df, low: str) -> str:
    """The measured saving beside the one the exercise computes from the activations alone."""
    numbers = own_saving_numbers(df, low)
    from_activations = (numbers["fp32_activations_mib"] - numbers["low_activations_mib"]) / numbers["fp32_peak_mib"]
    measured = 1 - peak_fraction(df, low)
    gap = ("the rest of the difference is the backward pass's temporary buffers (\"other\"), which shrink too, and "
           "when each category peaks" if abs(measured - from_activations) > 0.005 else
           "the activations account for the whole saving")
    return (f"From the activations alone: {from_activations:.1%} of the fp32 peak; measured: {low} saved "
            f"{measured:.1%} of it: {gap}.")


SPEEDUP_SOURCE = "published: NVIDIA T4 datasheet, tensor-core fp16 peak / fp32 peak"


def speedups(df, published: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each setup's speed relative to fp32, and published speed-ups to draw beside it.

    The published rows are `labkit.load_reference` rows with ``provenance`` published (the PyTorch AMP
    recipe's 2-3x on tensor-core GPUs) plus the ratio of the T4's datasheet peaks, an upper bound no
    real model reaches. None of them is a measurement of this lab.

    Returns:
        ``(live, reference)`` frames with ``setup`` and ``speedup_vs_fp32``, for
        ``plots.bar(live, x="setup", y="speedup_vs_fp32", reference=reference)``.

    Example:
        >>> live, ref = speedups(df, labkit.load_reference("01_mixed_precision-speedup-published*"))
    """
    rows = _ran(df, "fp32")
    base = rows["fp32"]["step_time_s"]
    live = pd.DataFrame([{"setup": label, "speedup_vs_fp32": base / row["step_time_s"], "source": "live"}
                         for label, row in rows.items()])
    t4 = PEAK_FLOPS["T4"]
    reference = [{"setup": "T4 peak ratio", "speedup_vs_fp32": t4["fp16"] / t4["fp32"], "source": SPEEDUP_SOURCE}]
    if published is not None and len(published):
        reference = published[["setup", "speedup_vs_fp32", "source"]].to_dict("records") + reference
    return live, pd.DataFrame(reference)

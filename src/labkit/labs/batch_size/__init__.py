"""Notebook 02 (batch size): its experiments and the findings worded from their live numbers.

- `batch_sweep`: one run per batch size, with epoch time and inference time next to `labkit.sweep`'s
  columns; `seed_claims` tests four common claims about batch size against it.
- `compare_lr_scaling`, `lr_scaling_finding`, `run_with_lr_scaling`: the same lr, the lr scaled with
  the batch (`labkit.techniques.optimizers.scale_lr`), and scaled with a warm-up.
- `accumulation_gap`, `accumulation_table`, `without_batchnorm`, `accumulation_finding`: gradient
  accumulation gives the gradient of the whole batch, except where BatchNorm normalises each
  micro-batch on its own.
- `prediction_table`, `prediction_finding`: memory predicted from two batch sizes, checked against
  measured steps (`labkit.capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ... import data, measure, models, results
from ...capacity import fit_linear_memory, memory_model, step_memory
from ...config import RunConfig
from ...env import PROFILES, env_report, profile, resolve_device, set_tf32
from ...errors import ConfigError
from ...measure import accuracy_noise
from ...messages import worded
from ...techniques.optimizers import scale_lr
from ...techniques.precision import autocast, resolve_precision
from ...train import run_splits
from ...units import mib
from ...validate import check_positive_int, is_int

BATCHNORM_MODES = ("train", "eval", "none")


def without_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` by ``nn.Identity`` (in place) and return it.

    Example:
        >>> model = without_batchnorm(models.build("small_cnn", 10)[0])
    """
    if isinstance(model, nn.modules.batchnorm._BatchNorm):
        return nn.Identity()
    for name, child in model.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, nn.Identity())
        else:
            without_batchnorm(child)
    return model


@dataclass
class AccumulationGap:
    """How far accumulated gradients are from the whole batch's: largest absolute difference, and
    relative to the largest gradient entry."""

    accum_steps: int
    batchnorm: str
    max_abs_diff: float
    max_abs_grad: float

    @property
    def relative(self) -> float:
        return self.max_abs_diff / self.max_abs_grad if self.max_abs_grad else math.nan


def _accumulation_gap(cfg: RunConfig, accum_steps: int, batchnorm: str) -> AccumulationGap:
    if batchnorm not in BATCHNORM_MODES:
        raise ConfigError("batchnorm", batchnorm, "'train' (as in training), 'eval' (running statistics) or "
                                                  "'none' (BatchNorm layers removed)")
    if not is_int(accum_steps) or accum_steps < 1 or cfg.batch_size % accum_steps:
        raise ConfigError("accum_steps", accum_steps, f"a divisor of batch_size={cfg.batch_size} "
                                                      "(each micro-batch is batch_size / accum_steps samples)")
    device = resolve_device(cfg.device)
    set_tf32(cfg.tf32)  # TF32 would add its own rounding (~1e-3) to the comparison
    split = run_splits(cfg)["train"]
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)[0]
    micro = cfg.batch_size // accum_steps
    if batchnorm == "none":
        model = without_batchnorm(model)
    elif batchnorm == "train" and micro < 2 and models.has_batchnorm(model):
        raise ConfigError("accum_steps", accum_steps, f"at most batch_size / 2 = {cfg.batch_size // 2}: BatchNorm "
                                                      "in train mode needs at least 2 samples per micro-batch")
    model = model.to(device).eval()  # dropout off: only the grouping of the samples differs
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(batchnorm == "train")
    x = data.to_model_input(split.images[:cfg.batch_size], split, device, size=cfg.image_size)
    y = split.labels[:cfg.batch_size].to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}  # BatchNorm's running statistics too
    params = [p for p in model.parameters() if p.requires_grad]

    def gradients(chunks: int) -> list[torch.Tensor]:
        model.load_state_dict(start)
        model.zero_grad(set_to_none=True)
        for micro_x, micro_y in zip(x.chunk(chunks), y.chunk(chunks), strict=True):
            (F.cross_entropy(model(micro_x), micro_y) / chunks).backward()
        return [p.grad.detach().clone() for p in params]

    whole, accumulated = gradients(1), gradients(accum_steps)
    diff = max(float((a - b).abs().max()) for a, b in zip(whole, accumulated, strict=True))
    largest = max(float(g.abs().max()) for g in whole)
    return AccumulationGap(accum_steps, batchnorm, diff, largest)


def accumulation_gap(cfg: RunConfig, accum_steps: int, batchnorm: str = "train") -> float:
    """Largest absolute difference between the gradients of one batch and of the same batch accumulated
    over ``accum_steps`` micro-batches (each loss divided by ``accum_steps``), from the same weights.

    Without BatchNorm, or with BatchNorm in eval mode (running statistics), the two are the same sum
    in a different order: the gap is float rounding (~1e-7 in fp32). With BatchNorm in train mode each
    micro-batch is normalised with its own mean and variance, so the gradients really differ. The
    batch is ``cfg.batch_size`` samples of the training set; computed in fp32 with dropout off.

    Args:
        cfg: the model, dataset, batch size, seed and device.
        accum_steps: micro-batches; must divide ``cfg.batch_size``.
        batchnorm: ``train``, ``eval`` or ``none`` (BatchNorm replaced by identity, see `without_batchnorm`).

    Example:
        >>> accumulation_gap(cfg, 4, batchnorm="none"), accumulation_gap(cfg, 4, batchnorm="train")
        (7.5e-09, 0.41)
    """
    return _accumulation_gap(cfg, accum_steps, batchnorm).max_abs_diff


def accumulation_table(cfg: RunConfig, accum_steps: int):
    """`accumulation_gap` for BatchNorm in train mode, in eval mode and removed, as a DataFrame.

    Columns: ``batchnorm``, ``accum_steps``, ``micro_batch_size``, ``max_abs_grad_diff``, ``max_abs_grad``,
    ``relative_diff`` (the gap over the largest gradient entry).

    Example:
        >>> accumulation_table(cfg, accum_steps=4)
    """
    rows = []
    for mode in BATCHNORM_MODES:
        gap = _accumulation_gap(cfg, accum_steps, mode)
        rows.append({"batchnorm": mode, "accum_steps": accum_steps, "micro_batch_size": cfg.batch_size // accum_steps,
                     "max_abs_grad_diff": gap.max_abs_diff, "max_abs_grad": gap.max_abs_grad,
                     "relative_diff": gap.relative})
    return pd.DataFrame(rows)


class _InferenceTimer:
    """Times predicting the test split at a batch size; one model (random weights: latency does not
    depend on their values), built on first use."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self._ready = None

    def _setup(self):
        cfg, prof = self.cfg, profile()
        device = resolve_device(cfg.device)
        set_tf32(cfg.tf32)
        test = run_splits(cfg, prof, training=False)["test"]
        model = models.build(cfg.model, test.num_classes, pretrained=False)[0]
        memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
        model = model.to(device, memory_format=memory_format)
        precision = resolve_precision(cfg.precision, device)
        return device, test, model, precision

    def measure(self, batch_size: int) -> dict:
        if self._ready is None:
            self._ready = self._setup()
        device, test, model, precision = self._ready
        prof = profile()
        batch = min(batch_size, len(test))
        x = data.to_model_input(test.images[:batch], test, device, self.cfg.channels_last, self.cfg.image_size)
        with autocast(precision, device):
            latency = measure.measure_latency(model, x, warmup=max(1, prof.warmup_steps), repeats=prof.repeats)
        batches = math.ceil(len(test) / batch)
        return {"inference_batch_latency_s": latency.median_s, "inference_time_s": latency.median_s * batches,
                "inference_per_sample_s": latency.median_s / batch}


def batch_sweep(cfg: RunConfig, batch_sizes: Iterable[int] | None = None, lr_scaling: bool | str = False,
                base_batch_size: int | None = None, epochs: int | None = None, refresh: bool = False,
                progress: bool = True):
    """Train ``cfg`` once per batch size for the same number of epochs and compare time, memory and accuracy.

    Runs go through `labkit.results.run_configs`: cached (reruns are instant, an interrupted sweep loses
    no finished run), and a failed run becomes a row with its ``error``. Rows have `labkit.sweep`'s
    columns plus:

    - ``steps_per_epoch``: optimizer steps per epoch (train_size // batch_size);
    - ``epoch_time_s``: median step time x steps per epoch (warm-up and profiling steps excluded);
    - ``lr``, ``lr_scaling``, ``base_batch_size``: the learning rate each run used and how it was scaled;
    - ``inference_time_s``: time to predict the test split in batches of that size (median latency of
      one batch x number of batches, the last one counted as full), ``inference_per_sample_s`` and
      ``inference_batch_latency_s`` (also cached).

    Args:
        cfg: the base run (``max_steps`` is dropped: runs are epoch-based).
        batch_sizes: the sizes (default: the profile's ``batch_sizes``).
        lr_scaling: False (same lr for all), True or ``"linear"``, or ``"sqrt"`` (see `scale_lr`).
        base_batch_size: the batch size ``cfg.lr`` was tuned for (default ``cfg.batch_size``).
        epochs: epochs per run (default: the profile's ``sweep_epochs``).
        refresh: rerun even when cached results exist; progress: show progress bars.

    Example:
        >>> df = batch_sweep(cfg, lr_scaling="sqrt")
        >>> df[["batch_size", "lr", "epoch_time_s", "peak_memory_bytes", "accuracy"]]
    """
    prof = profile()
    batch_sizes = list(prof.batch_sizes if batch_sizes is None else batch_sizes)
    if not batch_sizes:
        raise ConfigError("batch_sizes", batch_sizes, "a non-empty list of batch sizes, e.g. [16, 32, 64]")
    rules = {False: None, True: "linear", "linear": "linear", "sqrt": "sqrt"}
    if not isinstance(lr_scaling, (bool, str)) or lr_scaling not in rules:
        raise ConfigError("lr_scaling", lr_scaling, "False, True (= 'linear'), 'linear' or 'sqrt'")
    rule = rules[lr_scaling]
    base = cfg.batch_size if base_batch_size is None else base_batch_size
    check_positive_int("base_batch_size", base)
    epochs = prof.sweep_epochs if epochs is None else epochs
    configs = []
    for size in batch_sizes:  # every config is validated before anything runs
        run_cfg = cfg.replace(batch_size=size, max_steps=None, epochs=epochs)
        configs.append(scale_lr(run_cfg, base, rule) if rule else run_cfg)
    runs = results.run_configs(configs, refresh=refresh, progress=progress)
    train_size = cfg.train_size or prof.train_size
    timer = _InferenceTimer(cfg)
    rows = []
    for run_cfg, result in zip(configs, runs, strict=True):
        row = results.to_row(result)
        steps_per_epoch = train_size // run_cfg.batch_size
        row.update(lr_scaling=rule or "none", base_batch_size=base if rule else None,
                   steps_per_epoch=steps_per_epoch, epoch_time_s=result.step_time_s * steps_per_epoch)
        inference = dict.fromkeys(("inference_batch_latency_s", "inference_time_s", "inference_per_sample_s"),
                                  math.nan)
        if result.ok:
            key = f"{results.cache_key(run_cfg, env_report(run_cfg.device))}-inference"
            inference = results.cached_record(key, lambda size=run_cfg.batch_size: timer.measure(size), refresh)
        row.update(inference)
        rows.append(row)
    return pd.DataFrame(rows)


def prediction_table(cfg: RunConfig, fit_sizes: tuple[int, int] = (16, 32), check_sizes: Iterable[int] = (64, 128, 256)):
    """Predict peak memory from two small measured batches, then measure larger ones to check.

    The prediction is the line ``fixed + bytes_per_sample x batch`` through ``fit_sizes``; each size
    in ``check_sizes`` is then measured with one real training step (`step_memory`).

    Returns:
        A long DataFrame, two rows per checked size: ``batch_size``, ``kind`` (``"predicted from a
        and b"`` or ``"measured"``), ``peak_memory_bytes``; and ``prediction_error`` (predicted / measured - 1) on
        the predicted rows. (Not ``error``: in labkit's frames that column holds a failed run's message.)

    Example:
        >>> table = prediction_table(cfg); plots.line(table, x="batch_size", y="peak_memory_bytes", hue="kind")
    """
    model = memory_model(cfg, batch_sizes=tuple(fit_sizes))
    label = f"predicted from {fit_sizes[0]} and {fit_sizes[1]}"
    rows = []
    for size in check_sizes:
        predicted = model.predict(size)["total"]
        measured = step_memory(cfg, size).total_bytes
        rows.append({"batch_size": size, "kind": label, "peak_memory_bytes": predicted,
                     "prediction_error": predicted / measured - 1})
        rows.append({"batch_size": size, "kind": "measured", "peak_memory_bytes": measured,
                     "prediction_error": None})
    return pd.DataFrame(rows)


@worded
def prediction_finding(table) -> str:
    """How far the two-point prediction was from the measurement at each checked size."""
    predicted = table[table["kind"] != "measured"]
    parts = [f"{row.prediction_error:+.1%} at batch {row.batch_size}" for row in predicted.itertuples()]
    worst = predicted["prediction_error"].abs().max()
    return (f"{predicted['kind'].iloc[0].capitalize()}: off by {', '.join(parts)} against the measured peaks "
            f"(worst {worst:.1%}).")


def _test_size(frame) -> int:
    run_profile = PROFILES.get(frame["profile"].iloc[0]) if "profile" in frame else None
    return (run_profile or profile()).test_size


def _sizes(frame) -> str:
    return ", ".join(str(int(b)) for b in frame["batch_size"])


def _verdict(ok: bool | None) -> str:
    return {True: "reproduced", False: "refuted", None: "inconclusive"}[ok]


def seed_claims(df) -> pd.DataFrame:
    """Test four common claims about batch size against a `batch_sweep` frame, with the live numbers.

    1. peak memory grows linearly with the batch (least-squares R^2 >= 0.98);
    2. training time per epoch falls as the batch grows (largest batch under 0.8x the smallest's);
    3. inference time (predicting the test split) barely moves (slowest / fastest <= 1.5);
    4. small batches generalise better (Keskar et al. 2017: large batches find sharp minima): the mean
       accuracy of the smaller half of the batch sizes beats the larger half's by more than one run's
       test-set noise (refuted if it loses by more; inconclusive in between).

    Returns:
        A DataFrame: ``claim``, ``measured`` (a sentence with the numbers), ``verdict``.

    Example:
        >>> seed_claims(batch_sweep(cfg))
    """
    ok = df[df["error"].isna()].sort_values("batch_size") if "error" in df else df.sort_values("batch_size")
    if ok["batch_size"].nunique() < 3:
        raise ConfigError("df", f"{ok['batch_size'].nunique()} successful batch sizes",
                          "a batch_sweep frame with at least 3 successful batch sizes")
    first, last = ok.iloc[0], ok.iloc[-1]
    line = fit_linear_memory(ok["batch_size"], ok["peak_memory_bytes"])
    rows = [{
        "claim": "memory grows linearly with the batch size",
        "measured": (f"peak = {mib(line.fixed_bytes, '.1f')} + {line.bytes_per_sample / 1024:.0f} KiB x batch, "
                     f"R^2 = {line.r2:.4f}"),
        "verdict": _verdict(line.r2 >= 0.98),
    }]
    ratio = last["epoch_time_s"] / first["epoch_time_s"]
    fastest = ok.loc[ok["epoch_time_s"].idxmin()]
    measured = (f"{first['epoch_time_s']:.2f} s per epoch at batch {first['batch_size']}, "
                f"{last['epoch_time_s']:.2f} s at {last['batch_size']} ({ratio:.2f}x)")
    verdict = _verdict(ratio < 0.8)
    if fastest["batch_size"] != last["batch_size"] and last["epoch_time_s"] > 1.1 * fastest["epoch_time_s"]:
        measured += f"; fastest {fastest['epoch_time_s']:.2f} s at batch {fastest['batch_size']}, slower beyond"
        verdict = f"partly: falls up to batch {fastest['batch_size']}, then rises" if ratio < 0.8 else verdict
    rows.append({"claim": "training time per epoch falls as the batch grows", "measured": measured,
                 "verdict": verdict})
    slowest, fastest = ok["inference_time_s"].max(), ok["inference_time_s"].min()
    rows.append({
        "claim": "inference time barely moves with the batch size",
        "measured": (f"test-split inference from {fastest * 1e3:.1f} to {slowest * 1e3:.1f} ms across batch sizes "
                     f"({slowest / fastest:.2f}x)"),
        "verdict": _verdict(slowest / fastest <= 1.5),
    })
    half = len(ok) // 2
    small, large = ok.iloc[:half], ok.iloc[len(ok) - half:]
    gap = small["accuracy"].mean() - large["accuracy"].mean()
    noise = accuracy_noise(max(small["accuracy"].mean(), large["accuracy"].mean()), _test_size(ok))
    rows.append({
        "claim": "small batches generalise better (Keskar et al. 2017)",
        "measured": (f"mean accuracy {small['accuracy'].mean():.1%} at batches {_sizes(small)}, "
                     f"{large['accuracy'].mean():.1%} at {_sizes(large)} (differences under {noise:.1%} are within "
                     "one run's test-set noise; at a fixed number of epochs the small batches also took more steps)"),
        # The smaller half of the batch sizes must beat the larger half by more than the noise of one run
        # (or lose by more): one lucky or unlucky size at either end decides nothing.
        "verdict": _verdict(True if gap > noise else (False if -gap > noise else None)),
    })
    return pd.DataFrame(rows)


LR_SETTINGS = ("same lr", "scaled", "scaled + warm-up")


def compare_lr_scaling(cfg: RunConfig, warmup_steps: int, rule: str = "linear", base_batch_size: int | None = None,
                       batch_sizes: Iterable[int] | None = None, refresh: bool = False, progress: bool = True):
    """Three `batch_sweep`s: the same lr at every batch size, lr scaled by ``rule``, and scaled with a warm-up.

    Args:
        cfg: the base run; ``cfg.lr`` is the lr tuned for ``base_batch_size`` (default ``cfg.batch_size``).
        warmup_steps: optimizer steps of linear lr warm-up in the third sweep (fewer than any run's steps).
        rule: ``"linear"`` (Goyal et al. 2017, derived for SGD) or ``"sqrt"`` (often better for Adam).

    Returns:
        The three frames concatenated, with an ``lr_setting`` column (`LR_SETTINGS`).

    Example:
        >>> df = compare_lr_scaling(cfg, warmup_steps=4)
        >>> plots.line(df, x="batch_size", y="accuracy", hue="lr_setting")
    """
    if not is_int(warmup_steps) or warmup_steps < 1:
        raise ConfigError("warmup_steps", warmup_steps, "a positive integer (optimizer steps of lr warm-up)")
    common = dict(batch_sizes=batch_sizes, base_batch_size=base_batch_size, refresh=refresh, progress=progress)
    frames = {
        LR_SETTINGS[0]: batch_sweep(cfg, lr_scaling=False, **common),
        LR_SETTINGS[1]: batch_sweep(cfg, lr_scaling=rule, **common),
        LR_SETTINGS[2]: batch_sweep(cfg.replace(lr_warmup_steps=warmup_steps), lr_scaling=rule, **common),
    }
    return pd.concat([frame.assign(lr_setting=name) for name, frame in frames.items()], ignore_index=True)


@worded
def lr_scaling_finding(df) -> str:
    """Which lr setting gave the best accuracy at each batch size, from `compare_lr_scaling`'s frame."""
    ok = df[df["error"].isna()] if "error" in df else df
    lines = []
    for batch_size, group in ok.groupby("batch_size"):
        best = group["accuracy"].max()
        noise = accuracy_noise(best, _test_size(group))
        top = [row.lr_setting for row in group.itertuples() if best - row.accuracy <= noise]
        behind = [row.lr_setting for row in group.itertuples() if best - row.accuracy > noise]
        scores = ", ".join(f"{row.lr_setting} {row.accuracy:.1%} (lr {row.lr:.2g})" for row in group.itertuples())
        if len(top) == 1:
            verdict = f"best: {top[0]}"
        elif not behind:
            verdict = f"no clear winner (all within {noise:.1%}, the test-set noise)"
        else:
            verdict = f"{' and '.join(top)} tie within the test-set noise ({noise:.1%}), ahead of {' and '.join(behind)}"
        lines.append(f"batch {batch_size}: {scores}; {verdict}.")
    return "\n".join(lines)


def run_with_lr_scaling(cfg: RunConfig, lr_scaling: bool | str = False, base_batch_size: int | None = None, on_step=None,
                        refresh: bool = False, progress: bool = True):
    """`labkit.results.cached_fit` with ``cfg.lr`` scaled from ``base_batch_size`` when ``lr_scaling`` is set.

    For a panel whose controls choose the batch size and whether the lr follows it.

    Args:
        lr_scaling: False (lr as given), True or ``"linear"``, or ``"sqrt"`` (see `scale_lr`).
        base_batch_size: the batch size ``cfg.lr`` was tuned for (default: the profile's workload batch size,
            the baseline's).

    Example:
        >>> res = run_with_lr_scaling(cfg.replace(batch_size=256), lr_scaling="linear")   # lr x4
    """
    if lr_scaling is not False:
        base_batch_size = profile().batch_size if base_batch_size is None else base_batch_size
        cfg = scale_lr(cfg, base_batch_size, rule="linear" if lr_scaling is True else lr_scaling)
    return results.cached_fit(cfg, refresh=refresh, progress=progress, on_step=on_step)


@worded
def accumulation_finding(df) -> str:
    """What gradient accumulation did to peak memory and step time, from a sweep over ``grad_accum``."""
    ok = df[df["error"].isna()] if "error" in df else df
    ok = ok.sort_values("grad_accum")
    base = ok.iloc[0]
    parts = [f"grad_accum={row.grad_accum} (micro-batch {row.batch_size // row.grad_accum}): peak "
             f"{mib(row.peak_memory_bytes, '.1f')} ({row.peak_memory_bytes / base['peak_memory_bytes']:.2f}x), "
             f"step {row.step_time_s * 1e3:.1f} ms ({row.step_time_s / base['step_time_s']:.2f}x)"
             for row in ok.iloc[1:].itertuples()]
    return (f"Against grad_accum={base['grad_accum']} (peak {mib(base['peak_memory_bytes'], '.1f')}, step "
            f"{base['step_time_s'] * 1e3:.1f} ms), same batch of {base['batch_size']}:\n" + "\n".join(parts))


def epoch_time_floor(df, within: float = 0.1) -> int:
    """The smallest batch whose epoch time is within ``within`` (10 %) of the fastest epoch of the sweep:
    where epoch time stops falling (the figure section 2 asks to predict)."""
    ok = df[df["error"].isna()] if "error" in df else df
    fastest = ok["epoch_time_s"].min()
    return int(ok[ok["epoch_time_s"] <= (1 + within) * fastest]["batch_size"].min())


def max_batch_numbers(line, budget_bytes: float) -> dict:
    """Your own numbers for exercise ``02.max_batch``: the fitted line (MiB, KiB per sample) and the budget.

    Example:
        >>> numbers = max_batch_numbers(capacity.fit_linear_memory(df.batch_size, df.peak_memory_bytes), BUDGET)
    """
    return {"fixed_mib": float(f"{line.fixed_bytes / 2**20:.3g}"),
            "kib_per_sample": float(f"{line.bytes_per_sample / 1024:.3g}"),
            "budget_mib": float(f"{budget_bytes / 2**20:.3g}")}


@worded
def line_vs_search(numbers: dict, found: int) -> str:
    """The largest batch the fitted line predicts beside the one `find_max_batch_size` found by probing."""
    predicted = math.floor((numbers["budget_mib"] - numbers["fixed_mib"]) * 1024 / numbers["kib_per_sample"])
    if found < 1:
        return f"Your line predicts batch {predicted}; find_max_batch_size found that not even one sample fits."
    if predicted == found:
        return f"Your line predicts batch {predicted}; find_max_batch_size found {found}: the same."
    direction = "more" if predicted > found else "fewer"
    return (f"Your line predicts batch {predicted}; find_max_batch_size found {found} by probing single steps "
            f"({abs(predicted - found)} {direction}, {predicted / found - 1:+.0%}). The line was fitted to whole "
            "runs' peaks at a few batch sizes; a probe measures the one step it tries, so small per-sample costs "
            "the line averages away (or extrapolates) decide the last few samples.")

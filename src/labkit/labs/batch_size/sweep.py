"""Section 2 of notebook 02: one run per batch size (`batch_sweep`), the popular claims tested against it
(`folk_claims`), and where epoch time stops falling (`epoch_time_floor`)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch

from ... import data, measure, models, results
from ...capacity import fit_linear_memory
from ...config import RunConfig
from ...display import number, quantity
from ...env import env_report, profile, resolve_device, set_tf32
from ...errors import ConfigError
from ...measure import accuracy_noise
from ...techniques.optimizers import scale_lr
from ...techniques.precision import autocast, resolve_precision
from ...train import run_splits
from ...validate import check_positive_int
from ._shared import apart, sizes, test_set_size, verdict

INFERENCE_COLUMNS = ("inference_batch_latency_s", "inference_time_s", "inference_time_p10_s", "inference_time_p90_s",
                     "inference_per_sample_s")


def seconds(value) -> str:
    """A duration in s, or in ms below 0.1 s, to three significant digits."""
    return quantity("epoch_time_s", value)


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
                "inference_time_p10_s": latency.p10_s * batches, "inference_time_p90_s": latency.p90_s * batches,
                "inference_per_sample_s": latency.median_s / batch}


def batch_sweep(cfg: RunConfig, batch_sizes: Iterable[int] | None = None, lr_scaling: bool | str = False,
                base_batch_size: int | None = None, epochs: int | None = None, refresh: bool = False,
                progress: bool = True):
    """Train ``cfg`` once per batch size for the same number of epochs: time, memory, accuracy (columns: see above).

    Args:
        cfg: the base run (``max_steps`` is dropped: runs are epoch-based).
        batch_sizes: the sizes (default: the profile's ``batch_sizes``).
        lr_scaling: False (same lr for all), True or ``"linear"``, or ``"sqrt"`` (see `scale_lr`).
        base_batch_size: the batch size ``cfg.lr`` was tuned for (default ``cfg.batch_size``).
        epochs: epochs per run (default: the profile's ``sweep_epochs``).
        refresh: rerun even when cached results exist; progress: show progress bars.

    Example:
        >>> df = batch_sweep(cfg, lr_scaling="sqrt")   # cached; a failed run is a row with its ``error``
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
        configs.append(run_cfg.replace(lr=scale_lr(run_cfg.lr, run_cfg.batch_size, base, rule)) if rule else run_cfg)
    runs = results.run_configs(configs, refresh=refresh, progress=progress)
    train_size = cfg.train_size or prof.train_size
    timer = _InferenceTimer(cfg)
    rows = []
    for run_cfg, result in zip(configs, runs, strict=True):
        row = results.to_row(result)
        steps_per_epoch = train_size // run_cfg.batch_size
        row.update(lr_scaling=rule or "none", base_batch_size=base if rule else None,
                   steps_per_epoch=steps_per_epoch, epoch_time_s=result.step_time_s * steps_per_epoch,
                   epoch_time_p10_s=result.step_time_p10_s * steps_per_epoch,
                   epoch_time_p90_s=result.step_time_p90_s * steps_per_epoch)
        inference = dict.fromkeys(INFERENCE_COLUMNS, math.nan)
        if result.ok:
            key = f"{results.cache_key(run_cfg, env_report(run_cfg.device))}-inference"
            inference = results.cached_record(key, lambda size=run_cfg.batch_size: timer.measure(size), refresh)
        row.update({name: inference.get(name, math.nan) for name in INFERENCE_COLUMNS})  # older records: no spread
        rows.append(row)
    return pd.DataFrame(rows)


# The claims `folk_claims` tests, as the notebook quotes them.
FOLK_CLAIMS = ("memory grows linearly with the batch size", "a bigger batch trains an epoch faster",
               "inference time does not depend on the batch size", "small batches generalise better")


def _memory_claim(ok) -> tuple[str, str]:
    line = fit_linear_memory(ok["batch_size"], ok["peak_memory_bytes"])
    r2 = f"{line.r2:.3f}" if line.r2 < 0.999 else "above 0.999"
    return (f"peak = {number(line.fixed_bytes / 2**20)} MiB + {number(line.bytes_per_sample / 1024)} KiB x batch, "
            f"R^2 {r2}"), verdict(line.r2 >= 0.98)


def _epoch_claim(ok) -> tuple[str, str]:
    first, last = ok.iloc[0], ok.iloc[-1]
    fastest = ok.loc[ok["epoch_time_s"].idxmin()]
    measured = (f"{seconds(first['epoch_time_s'])} per epoch at batch {int(first['batch_size'])}, "
                f"{seconds(last['epoch_time_s'])} at {int(last['batch_size'])} "
                f"({number(last['epoch_time_s'] / first['epoch_time_s'])}x)")
    fell, rose = apart(first, last, "epoch_time"), apart(last, first, "epoch_time")
    if fell is None or rose is None:
        return measured + "; no timing spread measured", "inconclusive"
    middle = fastest["batch_size"] not in (first["batch_size"], last["batch_size"])
    if middle and apart(first, fastest, "epoch_time") and apart(last, fastest, "epoch_time"):
        return (measured + f"; fastest {seconds(fastest['epoch_time_s'])} at batch {int(fastest['batch_size'])}",
                f"partly: falls up to batch {int(fastest['batch_size'])}, then rises")
    if not fell and not rose:
        return measured + "; within the p10-p90 spread of the step times", "inconclusive"
    return measured, verdict(bool(fell))


def _inference_claim(ok) -> tuple[str, str]:
    slow, fast = ok.loc[ok["inference_time_s"].idxmax()], ok.loc[ok["inference_time_s"].idxmin()]
    measured = (f"test split in {seconds(fast['inference_time_s'])} at batch {int(fast['batch_size'])}, "
                f"{seconds(slow['inference_time_s'])} at {int(slow['batch_size'])} "
                f"({number(slow['inference_time_s'] / fast['inference_time_s'])}x)")
    differs = apart(slow, fast, "inference_time")
    if differs is None:
        return measured + "; no timing spread measured", "inconclusive"
    return measured + ("" if differs else "; within the p10-p90 spread"), verdict(not differs)


def _accuracy_claim(ok) -> tuple[str, str]:
    # The smaller half of the batch sizes must beat the larger half by more than one run's test-set noise (or
    # lose by more): one lucky or unlucky size at either end decides nothing.
    half = len(ok) // 2
    small, large = ok.iloc[:half], ok.iloc[len(ok) - half:]
    gap = small["accuracy"].mean() - large["accuracy"].mean()
    noise = accuracy_noise(max(small["accuracy"].mean(), large["accuracy"].mean()), test_set_size(ok))
    measured = (f"mean accuracy {small['accuracy'].mean():.1%} at batches {sizes(small)}, "
                f"{large['accuracy'].mean():.1%} at {sizes(large)}; test-set noise {noise * 100:.1f} points")
    return measured, verdict(True if gap > noise else (False if -gap > noise else None))


def folk_claims(df) -> pd.DataFrame:
    """Test four popular claims about the batch size (`FOLK_CLAIMS`) against a `batch_sweep` frame.

    A timing claim holds or fails only outside the runs' p10-p90 spreads; the accuracy claim only outside the
    test-set noise; memory is linear when a least-squares line has R^2 >= 0.98.

    Args:
        df: a `batch_sweep` frame with at least 3 successful batch sizes.

    Returns:
        A DataFrame: ``claim``, ``measured`` (the live numbers), ``verdict`` (reproduced, refuted, inconclusive).

    Example:
        >>> display.table(folk_claims(batch_sweep(cfg)))
    """
    ok = df[df["error"].isna()].sort_values("batch_size") if "error" in df else df.sort_values("batch_size")
    if ok["batch_size"].nunique() < 3:
        raise ConfigError("df", f"{ok['batch_size'].nunique()} successful batch sizes",
                          "a batch_sweep frame with at least 3 successful batch sizes")
    checks = (_memory_claim, _epoch_claim, _inference_claim, _accuracy_claim)
    rows = [dict(zip(("claim", "measured", "verdict"), (claim, *check(ok)), strict=True))
            for claim, check in zip(FOLK_CLAIMS, checks, strict=True)]
    return pd.DataFrame(rows)


def epoch_time_floor(df, within: float = 0.1) -> int:
    """The smallest batch whose epoch time is within ``within`` (10 %) of the sweep's fastest epoch.

    Args:
        df: a `batch_sweep` frame.
        within: how close to the fastest counts as "stopped falling" (the question notebook 02 asks).
    """
    ok = df[df["error"].isna()] if "error" in df else df
    fastest = ok["epoch_time_s"].min()
    return int(ok[ok["epoch_time_s"] <= (1 + within) * fastest]["batch_size"].min())

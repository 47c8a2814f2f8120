"""Section 2 of notebook 02: one run per batch size, and popular claims tested against it."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch

from ... import data, measure, results
from ...capacity import fit_linear_memory
from ...config import RunConfig
from ...display import number, quantity
from ...env import env_report, profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...runsetup import set_up
from ...techniques.optimizers import scale_lr
from ...techniques.precision import autocast, resolve_precision
from ...validate import check_positive_int
from ._shared import sizes, succeeded, test_set_size, verdict

INFERENCE_COLUMNS = ("inference_batch_latency_s", "inference_time_s", "inference_time_p10_s", "inference_time_p90_s",
                     "inference_per_sample_s")
# The claims `BatchSweep.claims` tests, as the notebook quotes them.
FOLK_CLAIMS = ("memory grows linearly with the batch size", "a bigger batch trains an epoch faster",
               "inference time does not depend on the batch size", "small batches generalise better")


def seconds(value) -> str:
    return quantity("epoch_time_s", value)


class _InferenceTimer:
    """Times predicting the test split at a batch size (random weights: latency does not depend on them)."""

    def __init__(self, cfg: RunConfig):
        self.cfg, self.setup = cfg, None

    def measure(self, batch_size: int) -> dict:
        cfg, prof = self.cfg, profile()
        if self.setup is None:
            self.setup = set_up(cfg.replace(pretrained=False), training=False)
            if cfg.channels_last:
                self.setup.model.to(memory_format=torch.channels_last)
        s = self.setup
        test = s.splits["test"]
        batch = min(batch_size, len(test))
        x = data.to_model_input(test.images[:batch], test, s.device, cfg.channels_last, cfg.image_size)
        with autocast(resolve_precision(cfg.precision, s.device), s.device):
            latency = measure.measure_latency(s.model, x, warmup=max(1, prof.warmup_steps), repeats=prof.repeats)
        batches = math.ceil(len(test) / batch)
        return {"inference_batch_latency_s": latency.median_s, "inference_time_s": latency.median_s * batches,
                "inference_time_p10_s": latency.p10_s * batches, "inference_time_p90_s": latency.p90_s * batches,
                "inference_per_sample_s": latency.median_s / batch}


class BatchSweep(LabResult):
    shown = ("batch_size", "steps_per_epoch", "epoch_time_s", "throughput", "inference_time_s", "peak_memory_bytes",
             "accuracy")

    def floor(self, within: float = 0.1) -> int:
        """The smallest batch whose epoch is within ``within`` (10 %) of the fastest."""
        ok = succeeded(self.frame)
        return int(ok[ok["epoch_time_s"] <= (1 + within) * ok["epoch_time_s"].min()]["batch_size"].min())

    @worded
    def finding(self) -> str:
        ok = succeeded(self.frame).dropna(subset=["epoch_time_s"])
        if ok.empty:
            return "No run finished: no epoch time to compare."
        fastest = ok.loc[ok["epoch_time_s"].idxmin()]
        return (f"Epoch time comes within 10 % of the fastest ({seconds(fastest['epoch_time_s'])} at batch "
                f"{int(fastest['batch_size'])}) from batch {self.floor()} on.")

    def claims(self) -> LabResult:
        """`FOLK_CLAIMS` against the sweep."""
        ok = succeeded(self.frame).sort_values("batch_size")
        if ok["batch_size"].nunique() < 3:
            raise ConfigError("df", f"{ok['batch_size'].nunique()} successful batch sizes",
                              "a batch_sweep frame with at least 3 successful batch sizes")
        checks = (_memory_claim, _epoch_claim, _inference_claim, _accuracy_claim)
        return LabResult(pd.DataFrame([dict(zip(("claim", "measured", "verdict"), (claim, *check(ok)), strict=True))
                                       for claim, check in zip(FOLK_CLAIMS, checks, strict=True)]))


def batch_sweep(cfg: RunConfig, batch_sizes: Iterable[int] | None = None, lr_scaling: bool | str = False,
                base_batch_size: int | None = None, epochs: int | None = None, refresh: bool = False,
                progress: bool = True) -> BatchSweep:
    """One cached run of ``cfg`` per batch size for the same epochs, and its inference time on the test split;
    ``lr_scaling`` as in `scale_lr` from ``base_batch_size`` (default ``cfg.batch_size``)."""
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
        steps = train_size // run_cfg.batch_size
        row.update(lr_scaling=rule or "none", base_batch_size=base if rule else None, steps_per_epoch=steps,
                   epoch_time_s=result.step_time_s * steps, epoch_time_p10_s=result.step_time_p10_s * steps,
                   epoch_time_p90_s=result.step_time_p90_s * steps)
        inference = dict.fromkeys(INFERENCE_COLUMNS, math.nan)
        if result.ok:
            key = f"{results.cache_key(run_cfg, env_report(run_cfg.device))}-inference"
            inference = results.cached_record(key, lambda size=run_cfg.batch_size: timer.measure(size), refresh)
        row.update({name: inference.get(name, math.nan) for name in INFERENCE_COLUMNS})  # older records: no spread
        rows.append(row)
    return BatchSweep(pd.DataFrame(rows))


def _memory_claim(ok) -> tuple[str, str]:
    line = fit_linear_memory(ok["batch_size"], ok["peak_memory_bytes"])
    r2 = f"{line.r2:.3f}" if line.r2 < 0.999 else "above 0.999"
    return (f"peak = {number(line.fixed_bytes / 2**20)} MiB + {number(line.bytes_per_sample / 1024)} KiB x batch, "
            f"R^2 {r2}"), verdict(line.r2 >= 0.98)


def _epochs(row) -> Measured:
    return Measured.row(row, "epoch_time_s")


def _epoch_claim(ok) -> tuple[str, str]:
    first, last = ok.iloc[0], ok.iloc[-1]
    fastest = ok.loc[ok["epoch_time_s"].idxmin()]
    c = compare(_epochs(last), _epochs(first), words=("faster", "slower"))
    measured = (f"{seconds(first['epoch_time_s'])} per epoch at batch {int(first['batch_size'])}, "
                f"{seconds(last['epoch_time_s'])} at {int(last['batch_size'])}: {c}")
    middle = fastest["batch_size"] not in (first["batch_size"], last["batch_size"])
    if c.real is not None and middle and all(compare(_epochs(fastest), _epochs(end)).direction == -1
                                              for end in (first, last)):
        return (measured + f"; fastest {seconds(fastest['epoch_time_s'])} at batch {int(fastest['batch_size'])}",
                f"partly: falls up to batch {int(fastest['batch_size'])}, then rises")
    return measured, verdict(None if not c.real else c.direction == -1)


def _inference_claim(ok) -> tuple[str, str]:
    slow, fast = ok.loc[ok["inference_time_s"].idxmax()], ok.loc[ok["inference_time_s"].idxmin()]
    c = compare(Measured.row(slow, "inference_time_s"), Measured.row(fast, "inference_time_s"),
                words=("faster", "slower"))
    measured = (f"test split in {seconds(fast['inference_time_s'])} at batch {int(fast['batch_size'])}, "
                f"{seconds(slow['inference_time_s'])} at {int(slow['batch_size'])}: {c}")
    return measured, verdict(None if c.real is None else not c.real)


def _accuracy_claim(ok) -> tuple[str, str]:
    # The smaller half of the batch sizes against the larger half: one lucky size at either end decides nothing.
    half = len(ok) // 2
    small, large = ok.iloc[:half], ok.iloc[len(ok) - half:]
    n = test_set_size(ok)
    c = compare(*(Measured.accuracy(part["accuracy"].mean(), n) for part in (small, large)),
                words=("worse for small batches", "better for small batches"))
    measured = (f"mean accuracy {small['accuracy'].mean():.1%} at batches {sizes(small)}, "
                f"{large['accuracy'].mean():.1%} at {sizes(large)}; on {n} test images: {c.verdict}")
    return measured, verdict(None if not c.real else c.direction == 1)

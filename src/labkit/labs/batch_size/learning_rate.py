"""Section 3 of notebook 02: the learning rate kept, scaled with the batch, and scaled with a warm-up."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from ... import results
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques.optimizers import scale_lr
from ...validate import is_int
from ._shared import succeeded, test_set_size
from .sweep import batch_sweep

LR_SETTINGS = ("same lr", "scaled", "scaled + warm-up")


class LRScaling(LabResult):
    shown = ("lr_setting", "batch_size", "lr", "lr_warmup_steps", "accuracy")

    @worded
    def finding(self) -> str:
        ok = succeeded(self.frame)
        outcomes: dict[str, list[str]] = {}
        for batch_size, group in ok.groupby("batch_size"):
            n = test_set_size(group)
            best = Measured.accuracy(group["accuracy"].max(), n)
            top = [row.lr_setting for row in group.itertuples()
                   if not compare(Measured.accuracy(row.accuracy, n), best)]
            key = "no clear winner" if len(top) == len(group) else f"{' and '.join(top)} ahead"
            outcomes.setdefault(key, []).append(str(int(batch_size)))
        parts = [f"{key} at batch {', '.join(sizes)}" for key, sizes in outcomes.items()]
        return "Accuracy, counting only differences beyond the test-set noise: " + "; ".join(parts) + "."


def compare_lr_scaling(cfg: RunConfig, warmup_steps: int, rule: str = "linear", base_batch_size: int | None = None,
                       batch_sizes: Iterable[int] | None = None, refresh: bool = False,
                       progress: bool = True) -> LRScaling:
    """Three `batch_sweep`s: the same lr, the lr scaled by ``rule``, and scaled with ``warmup_steps`` of warm-up."""
    if not is_int(warmup_steps) or warmup_steps < 1:
        raise ConfigError("warmup_steps", warmup_steps, "a positive integer (optimizer steps of lr warm-up)")
    common = dict(batch_sizes=batch_sizes, base_batch_size=base_batch_size, refresh=refresh, progress=progress)
    frames = (batch_sweep(cfg, lr_scaling=False, **common).frame, batch_sweep(cfg, lr_scaling=rule, **common).frame,
              batch_sweep(cfg.replace(lr_warmup_steps=warmup_steps), lr_scaling=rule, **common).frame)
    return LRScaling(pd.concat([frame.assign(lr_setting=name) for name, frame in zip(LR_SETTINGS, frames, strict=True)],
                               ignore_index=True))


def run_with_lr_scaling(cfg: RunConfig, lr_scaling: bool | str = False, base_batch_size: int | None = None,
                        on_step=None, refresh: bool = False, progress: bool = True):
    """`labkit.results.cached_fit` with ``cfg.lr`` scaled from ``base_batch_size`` (default: the profile's)."""
    if lr_scaling is not False:
        base_batch_size = profile().batch_size if base_batch_size is None else base_batch_size
        rule = "linear" if lr_scaling is True else lr_scaling
        cfg = cfg.replace(lr=scale_lr(cfg.lr, cfg.batch_size, base_batch_size, rule))
    return results.cached_fit(cfg, refresh=refresh, progress=progress, on_step=on_step)

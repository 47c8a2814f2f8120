"""Section 3 of notebook 02: the same learning rate at every batch size, the lr scaled with the batch, and
scaled with a warm-up."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from ... import results
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...measure import accuracy_noise
from ...messages import worded
from ...techniques.optimizers import scale_lr
from ...validate import is_int
from ._shared import test_set_size
from .sweep import batch_sweep

LR_SETTINGS = ("same lr", "scaled", "scaled + warm-up")


def compare_lr_scaling(cfg: RunConfig, warmup_steps: int, rule: str = "linear", base_batch_size: int | None = None,
                       batch_sizes: Iterable[int] | None = None, refresh: bool = False, progress: bool = True):
    """Three `batch_sweep`s: the same lr at every batch size, lr scaled by ``rule``, and scaled with a warm-up.

    Args:
        cfg: the base run; ``cfg.lr`` is the lr tuned for ``base_batch_size`` (default ``cfg.batch_size``).
        warmup_steps: optimizer steps of linear lr warm-up in the third sweep (fewer than any run's steps).
        rule: ``"linear"`` (Goyal et al. 2017, derived for SGD) or ``"sqrt"`` (often better for Adam).
        base_batch_size, batch_sizes, refresh, progress: as in `batch_sweep`.

    Returns:
        The three frames concatenated, with an ``lr_setting`` column (`LR_SETTINGS`).

    Example:
        >>> plots.line(compare_lr_scaling(cfg, warmup_steps=4), x="batch_size", y="accuracy", hue="lr_setting")
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
    """Which lr setting won at each batch size beyond the test-set noise, from `compare_lr_scaling`'s frame."""
    ok = df[df["error"].isna()] if "error" in df else df
    outcomes: dict[str, list[str]] = {}
    noises = []
    for batch_size, group in ok.groupby("batch_size"):
        best = group["accuracy"].max()
        noise = accuracy_noise(best, test_set_size(group))
        noises.append(noise)
        top = [row.lr_setting for row in group.itertuples() if best - row.accuracy <= noise]
        key = "no clear winner" if len(top) == len(group) else f"{' and '.join(top)} ahead"
        outcomes.setdefault(key, []).append(str(int(batch_size)))
    parts = [f"{key} at batch {', '.join(sizes)}" for key, sizes in outcomes.items()]
    return (f"Accuracy, counting only differences beyond the test-set noise (up to {max(noises) * 100:.1f} points): "
            + "; ".join(parts) + ".")


def run_with_lr_scaling(cfg: RunConfig, lr_scaling: bool | str = False, base_batch_size: int | None = None,
                        on_step=None, refresh: bool = False, progress: bool = True):
    """`labkit.results.cached_fit` with ``cfg.lr`` scaled from ``base_batch_size`` when ``lr_scaling`` is set.

    Args:
        cfg: the run (a panel's controls choose its batch size).
        lr_scaling: False (lr as given), True or ``"linear"``, or ``"sqrt"`` (see `scale_lr`).
        base_batch_size: the batch size ``cfg.lr`` was tuned for (default: the profile's workload batch size).
        on_step, refresh, progress: as in `labkit.results.cached_fit`.

    Example:
        >>> res = run_with_lr_scaling(cfg.replace(batch_size=256), lr_scaling="linear")   # lr x4
    """
    if lr_scaling is not False:
        base_batch_size = profile().batch_size if base_batch_size is None else base_batch_size
        rule = "linear" if lr_scaling is True else lr_scaling
        cfg = cfg.replace(lr=scale_lr(cfg.lr, cfg.batch_size, base_batch_size, rule))
    return results.cached_fit(cfg, refresh=refresh, progress=progress, on_step=on_step)

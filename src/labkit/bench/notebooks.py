"""``labkit bench``: notebooks 00-03's experiments at a profile, one reference JSON file per part.

Each notebook loads its own parts, e.g. ``labkit.load_reference("01_mixed_precision-compare*")``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..config import RunConfig, baseline
from ..env import env_report, profile
from ..errors import ConfigError
from . import parts
from .common import Part, profile_env, write_part

# Each notebook's parts, in order; a part's file is written as soon as it finishes.
EXPERIMENTS: dict[str, tuple[Callable[[RunConfig], Part], ...]] = {
    "00_start_here": (parts.baseline_00,),
    "01_mixed_precision": (parts.compare_01, parts.memory_01, parts.layouts_01, parts.scaler_01),
    "02_batch_size": (parts.sweep_02, parts.accumulation_02, parts.search_02, parts.prediction_02),
    "03_memory_savers": (parts.tradeoff_03, parts.staged_03, parts.optimizers_03),
}


def run_bench(out_dir: Path | None = None, profile_name: str = "full", experiments: Iterable[str] | None = None,
              cfg: RunConfig | None = None) -> list[Path]:
    """Run the notebooks' experiments at ``profile_name`` and write one reference JSON per part.

    Args:
        out_dir: where to write (default: ``src/labkit/assets/reference``).
        profile_name: the profile the runs use (the caller's ``LABKIT_PROFILE`` is restored afterwards).
        experiments: notebook names from `EXPERIMENTS` (default: all).
        cfg: the base run (default: notebook 00's baseline for the profile); tests pass a tiny one.

    Returns:
        The paths written, ``<notebook>-<part>-<gpu>-<date>.json``.

    Example:
        >>> run_bench(experiments=["01_mixed_precision"])
    """
    names = list(EXPERIMENTS) if experiments is None else list(experiments)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown or not names:
        raise ConfigError("experiments", unknown or names, f"names from {list(EXPERIMENTS)}")
    paths = []
    with profile_env(profile_name):
        base = cfg or baseline(profile())
        env = env_report(base.device)
        for name in names:
            for measure_part in EXPERIMENTS[name]:
                paths.append(write_part(measure_part(base), name, out_dir, env))
    return paths

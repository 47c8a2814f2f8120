"""`labkit bench`: the notebook-00 baseline and the timing demo at the ``full`` profile, saved as a
reference result (``src/labkit/assets/reference/<gpu>-<date>.json``) for the notebooks to show."""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from pathlib import Path

from .config import baseline
from .env import PROFILE_ENV, profile
from .results import REFERENCE_DIR, write_reference
from .train import fit, timing_demo


def run_bench(out_dir: Path | None = None, profile_name: str = "full") -> Path:
    """Run the baseline fine-tune and the timing demo; write and return the reference JSON's path."""
    previous = os.environ.get(PROFILE_ENV)
    os.environ[PROFILE_ENV] = profile_name  # fit reads the profile from the environment
    try:
        prof = profile()
        cfg = baseline(prof)
        result = fit(cfg)
        pitfalls = timing_demo(cfg, repeats=prof.repeats)
    finally:
        if previous is None:
            os.environ.pop(PROFILE_ENV, None)
        else:
            os.environ[PROFILE_ENV] = previous
    name = result.env.get("gpu") or "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    path = (out_dir or REFERENCE_DIR) / f"{slug}-{datetime.date.today().isoformat()}.json"
    return write_reference([result], path, extras={"timing_pitfalls": dataclasses.asdict(pitfalls)})

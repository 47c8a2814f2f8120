"""Helpers the batch-size lab's modules share: the test-set size of a frame's profile, how a duration is
written, and when two timings differ beyond their measured spread."""

from __future__ import annotations

from ...env import profile, profile_of
from ...measure import separated


def test_set_size(frame) -> int:
    """The test split's size at the profile ``frame``'s runs were measured at (default: the current one)."""
    run_profile = profile_of(frame["profile"].iloc[0]) if "profile" in frame else None
    return (run_profile or profile()).test_size


def sizes(frame) -> str:
    """``frame``'s batch sizes as "8, 16, 32"."""
    return ", ".join(str(int(b)) for b in frame["batch_size"])


def apart(slow, fast, column: str) -> bool | None:
    """True when ``slow``'s 10th percentile of ``column`` lies above ``fast``'s 90th: a real difference.

    Args:
        slow, fast: rows with ``<column>_p10_s`` and ``<column>_p90_s``; None when a spread was not measured.
        column: e.g. ``"epoch_time"``.
    """
    order = separated(*((run.get(f"{column}_p10_s"), run.get(f"{column}_p90_s")) for run in (slow, fast)))
    return None if order is None else order == 1


def verdict(ok: bool | None) -> str:
    """A claim's verdict: True reproduced, False refuted, None inconclusive."""
    return {True: "reproduced", False: "refuted", None: "inconclusive"}[ok]


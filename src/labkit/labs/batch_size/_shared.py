"""What the batch-size lab's modules share."""

from __future__ import annotations

from ...env import profile, profile_of


def test_set_size(frame) -> int:
    run_profile = profile_of(frame["profile"].iloc[0]) if "profile" in frame else None
    return (run_profile or profile()).test_size


def sizes(frame) -> str:
    return ", ".join(str(int(b)) for b in frame["batch_size"])


def verdict(ok: bool | None) -> str:
    return {True: "reproduced", False: "refuted", None: "inconclusive"}[ok]


def succeeded(frame):
    return frame[frame["error"].isna()] if "error" in frame else frame

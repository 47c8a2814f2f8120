"""What the memory-savers lab's findings share: whether two runs' step times differ beyond their spreads."""

from __future__ import annotations

from ...measure import separated


def timing_noise(run, reference) -> str:
    """Whether ``run``'s step time differs from ``reference``'s beyond both runs' p10-p90 spreads, in words.

    Args:
        run, reference: rows (or dicts) with ``step_time_p10_s`` and ``step_time_p90_s``.
    """
    order = separated(*((r.get("step_time_p10_s"), r.get("step_time_p90_s")) for r in (run, reference)))
    if order is None:
        return "no timing spread measured"
    return "outside the p10-p90 spreads" if order else "within the p10-p90 spreads: no measurable change"

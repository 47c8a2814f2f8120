"""What the memory-savers lab's findings share: whether two runs' step times differ beyond their spreads."""

from __future__ import annotations

import math


def timing_noise(run, reference) -> str:
    """Whether ``run``'s step time differs from ``reference``'s beyond both runs' p10-p90 spreads, in words.

    Args:
        run, reference: rows (or dicts) with ``step_time_p10_s`` and ``step_time_p90_s``.
    """
    spreads = [run.get("step_time_p10_s"), run.get("step_time_p90_s"), reference.get("step_time_p10_s"),
               reference.get("step_time_p90_s")]
    if any(v is None or math.isnan(v) for v in spreads):
        return "no timing spread measured"
    low, high, ref_low, ref_high = spreads
    if low == high or ref_low == ref_high:  # one timing, or all equal: no spread to judge by
        return "no timing spread measured"
    if low > ref_high or high < ref_low:
        return "outside the p10-p90 spreads"
    return "within the p10-p90 spreads: no measurable change"

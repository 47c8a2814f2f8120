"""What notebook 10's sections share: a one-row result, interleaved timing, time per real token."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ... import measure
from ...labresult import LabResult
from ...measure import Measured


@dataclass
class Record(LabResult):
    """A result of one row; `row` reads it."""

    @classmethod
    def of(cls, record: dict, **fields):
        return cls(pd.DataFrame([record]), **fields)

    @property
    def row(self):
        return self.frame.iloc[0]


def interleaved(calls: dict, repeats: int, device, column: str = "step_time_s") -> dict:
    """`labkit.measure.in_turns` as rows: per key, the median ``column`` with its ``_p10``/``_p90``."""
    stem = column[:-2]
    return {key: dict(zip((column, f"{stem}_p10_s", f"{stem}_p90_s"), times, strict=True))
            for key, times in measure.in_turns(calls, repeats, device).items()}


def per_real_token(row) -> Measured:
    """Time per real token: 1 / real tokens/s, with the step times' p10-p90 over a step's real tokens."""
    return Measured(1 / row["real_tokens_per_s"], row["time_per_real_token_p10_s"], row["time_per_real_token_p90_s"])

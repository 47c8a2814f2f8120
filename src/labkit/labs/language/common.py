"""What notebook 10's sections share: a one-row result, interleaved timing."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ... import measure
from ...labresult import LabResult


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


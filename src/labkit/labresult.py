"""What a lab experiment returns: its frame, the columns to show and its finding, displayed together.

A notebook cell reads ``r = lab.attention_memory(); r``: Jupyter shows the table (`labkit.display.table` of the
columns to show) and the finding under it; ``print(r.finding())`` prints the finding alone and ``r.frame`` keeps
every column and the raw numbers. Where a frame is expected (``r["column"]``, ``len(r)``, ``r.iloc``), the result
reads as its frame.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import ClassVar

import pandas as pd

from . import display
from .messages import Text


@dataclass
class LabResult:
    """An experiment's rows (``frame``) and the ones to show (``columns``, default: `shown`'s). A lab's result type
    subclasses it and words `finding` from its own numbers."""

    frame: pd.DataFrame
    columns: list | None = field(default=None, kw_only=True)

    shown: ClassVar[tuple] = ()  # the columns a table shows by default (class attribute of each result type)

    def finding(self) -> Text:
        """One sentence from the live numbers (a result type words its own)."""
        return Text("")

    def show_columns(self) -> list:
        chosen = self.columns or [c for c in self.shown if c in self.frame.columns]
        return chosen or list(self.frame.columns[: display.MAX_TABLE_COLUMNS])

    def table(self):
        """The columns to show, in display units (`labkit.display.table`)."""
        return display.table(self.frame, self.show_columns())

    def _repr_html_(self) -> str:
        finding = str(self.finding())
        text = f"<p style='max-width: 60em'>{html.escape(finding)}</p>" if finding else ""
        return self.table().to_html() + text

    def text(self) -> str:
        """The table as plain text, then the finding."""
        finding = str(self.finding())
        return display.text_table(self.frame, self.show_columns()) + (f"\n\n{finding}" if finding else "")

    def __repr__(self) -> str:
        return self.text()

    def __init_subclass__(cls, **kwargs):
        # A result type's own @dataclass would write a constructor-style __repr__; one already in the class's
        # namespace is kept by dataclass, so every result type shows its table and finding as plain text too.
        super().__init_subclass__(**kwargs)
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = LabResult.__repr__

    def __getitem__(self, key):
        return self.frame[key]

    def __len__(self) -> int:
        return len(self.frame)

    def __getattr__(self, name: str):
        # Only reached for a name the result does not have: read it from the frame (r.iloc, r.columns, ...).
        if name.startswith("_") or name == "frame":
            raise AttributeError(name)
        return getattr(self.frame, name)

"""Section 10 of notebook 10, what fits a T4: fine-tuning memory by formula (`labkit.capacity.lm_training_memory`)
for models of 0.1B to 7B parameters, each fully fine-tuned, with LoRA and with QLoRA, against a T4's 15 GiB and the
learner's own GPU."""

from __future__ import annotations

import pandas as pd

from ...capacity.lm_fits import METHOD_NAMES, SETTINGS, SIZES, T4_USABLE_BYTES
from ...capacity.lm_fits import fits_table as t4_table
from ...display import number
from ...messages import worded

__all__ = ["SETTINGS", "SIZES", "T4_USABLE_BYTES", "t4_finding", "t4_table"]


@worded
def t4_finding(table: pd.DataFrame) -> str:
    """The largest model each method fits on a T4, and what the largest one needs with QLoRA."""
    parts = []
    for method in METHOD_NAMES.values():
        rows = table[(table["method"] == method) & (table["fits_t4"] == "yes")]
        largest = rows.loc[rows["num_params"].idxmax(), "model"] if len(rows) else "no model here"
        parts.append(f"{method} up to {largest}")
    biggest = table[table["num_params"] == table["num_params"].max()].set_index("method")
    gib = {m: number(biggest.loc[m, "total_bytes"] / 2**30) for m in METHOD_NAMES.values()}
    return (f"On a T4 (15 GiB usable): {'; '.join(parts)}. {biggest.iloc[0]['model']} needs {gib['full fine-tune']} "
            f"GiB fully fine-tuned, {gib['LoRA']} GiB with LoRA and {gib['QLoRA']} GiB with QLoRA.")

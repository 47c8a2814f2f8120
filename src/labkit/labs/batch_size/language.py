"""Section 7 of notebook 02: a language model's batch in tokens, and gradient accumulation over token losses.

`lm_accumulation` runs the profile's Llama (`labkit.workloads.lm_speed_config`) on 8 rows of pydoc_text padded to
the dataset's length, in 1, 2 and 4 micro-batches: the same tokens a step, label tokens spread unevenly over the
micro-batches. labkit divides each micro-batch's summed token loss by the whole step's label tokens
(`labkit.techniques.token_loss`), so every split trains on the same losses as one large batch.
"""

from __future__ import annotations

import pandas as pd

from ... import results, text
from ...display import number
from ...messages import worded
from ...units import change, mib, ratio
from ...workloads import lm_speed_config
from ._shared import apart

LM_ACCUM = (1, 2, 4)
LM_ROWS = 8


def lm_accumulation(grad_accum=LM_ACCUM, batch_size: int = LM_ROWS, refresh: bool = False) -> pd.DataFrame:
    """The same step of ``batch_size`` padded rows in each number of micro-batches of ``grad_accum`` (cached runs).

    Args:
        grad_accum: micro-batches per step, each dividing ``batch_size``. batch_size: rows a step. refresh: rerun.

    Returns:
        `labkit.sweep`'s columns and ``micro_batch_rows``, ``tokens_per_step`` (rows x length, padding included),
        ``loss_diff`` (the largest relative difference of the step losses from the first run's).
    """
    base = lm_speed_config(batch_size=batch_size, packing="pad_max")
    runs = results.run_configs([base.replace(grad_accum=k) for k in grad_accum], refresh=refresh, progress=False)
    frame = results.to_frame(runs)
    reference = runs[0].losses
    frame["micro_batch_rows"] = [batch_size // k for k in grad_accum]
    frame["tokens_per_step"] = batch_size * text.resolve_seq_len(base.dataset, base.seq_len)
    frame["loss_diff"] = [max(abs(a - b) / abs(b) for a, b in zip(run.losses, reference, strict=True))
                          for run in runs]
    return frame


@worded
def lm_accumulation_finding(frame: pd.DataFrame) -> str:
    """One line: the step's tokens, what the most micro-batches did to the peak and step time, the losses' match."""
    base, most = frame.iloc[0], frame.iloc[-1]
    slower, faster = apart(most, base, "step_time"), apart(base, most, "step_time")
    noise = ("no timing spread measured" if slower is None or faster is None else
             "outside the p10-p90 spreads" if slower or faster else "within the p10-p90 spreads")
    peak, most_peak = base["peak_memory_bytes"], most["peak_memory_bytes"]
    return (f"{int(base['tokens_per_step']):,} tokens a step ({int(base['batch_size'])} rows, "
            f"{base['pad_fraction']:.0%} of them padding) on {base['model']}: in {int(most['grad_accum'])} "
            f"micro-batches of {int(most['micro_batch_rows'])} rows the peak went {mib(peak, '.3g')} -> "
            f"{mib(most_peak, '.3g')} ({change(ratio(most_peak, peak))}), a step "
            f"{number(most['step_time_s'] / base['step_time_s'])}x ({noise}); the step losses match one large "
            f"batch's within {frame.loss_diff.max():.1e}.")

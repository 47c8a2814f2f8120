"""Notebook 06, section 4: fine-tune then quantize (PTQ) against quantization-aware fine-tuning (QAT).

Three recipes from the same fine-tuned model: static int8 at once; as many more float steps as QAT takes, then
static int8 (which separates QAT's effect from the extra training); and the QAT steps, then int8.
"""

from __future__ import annotations

import copy
import math
import time

import pandas as pd
from torch import nn

from ... import measure, results, train
from ...config import RunConfig
from ...env import profile
from ...inference import accuracy
from ...messages import worded
from ...techniques import quantization
from .workload import CALIBRATION_BATCHES, calibration_batches, continued, extra_steps, fine_tuned, qat_model


def qat_vs_ptq(cfg: RunConfig, steps: int | None = None, num_calibration: int = CALIBRATION_BATCHES,
               progress: bool = False, refresh: bool = False) -> pd.DataFrame:
    """PTQ at once, more float steps then PTQ, and QAT steps then int8, from one fine-tune (measured once, cached).

    Args:
        cfg: the fine-tune. steps: the continued runs' steps (`extra_steps`). num_calibration: calibration
            batches for PTQ. progress: show the training bars. refresh: train and measure again.

    Returns:
        ``recipe``, ``extra_steps``, ``extra_train_time_s``, ``step_time_s`` with ``step_time_p10_s`` and
        ``step_time_p90_s``, ``quantize_s``, ``float_accuracy`` (before int8), ``test_accuracy`` (int8),
        ``accuracy_drop`` (below the fine-tuned fp32 model).
    """
    steps = extra_steps(steps)
    frame = results.cached_frame("quant-qat", [cfg], lambda: _measure(cfg, steps, num_calibration, progress),
                                 refresh=refresh, steps=steps, num_calibration=num_calibration)
    for column in ("step_time_s", "step_time_p10_s", "step_time_p90_s"):
        frame[column] = pd.to_numeric(frame[column])
    return frame


def _measure(cfg: RunConfig, steps: int, num_calibration: int, progress: bool) -> pd.DataFrame:
    model, base = fine_tuned(cfg, progress=progress)
    calibration = calibration_batches(cfg, num_calibration)

    def ptq(trained: nn.Module) -> tuple[nn.Module, float]:
        start = time.perf_counter()
        return quantization.quantize(trained, "int8_static", calibration), time.perf_counter() - start

    at_once, at_once_s = ptq(model)
    longer = copy.deepcopy(model)
    run = train.fit(continued(cfg, steps), model=longer, progress=progress)
    longer_int8, longer_s = ptq(longer)
    qat, qat_run, convert_s = qat_model(cfg, steps, progress=progress)

    def timed(r) -> dict:
        return {"extra_steps": steps, "extra_train_time_s": r.train_time_s, "step_time_s": r.step_time_s,
                "step_time_p10_s": r.step_time_p10_s, "step_time_p90_s": r.step_time_p90_s}

    untimed = {"extra_steps": 0, "extra_train_time_s": 0.0, "step_time_s": math.nan, "step_time_p10_s": math.nan,
               "step_time_p90_s": math.nan}
    rows = [
        {"recipe": "fine-tune, then int8 (PTQ)", **untimed, "quantize_s": at_once_s, "float_accuracy": base.accuracy,
         "test_accuracy": accuracy(at_once, cfg, "test")},
        {"recipe": f"+{steps} float steps, then int8 (PTQ)", **timed(run), "quantize_s": longer_s,
         "float_accuracy": run.accuracy, "test_accuracy": accuracy(longer_int8, cfg, "test")},
        {"recipe": f"+{steps} QAT steps, then int8", **timed(qat_run), "quantize_s": convert_s,
         "float_accuracy": qat_run.accuracy, "test_accuracy": accuracy(qat, cfg, "test")},
    ]
    frame = pd.DataFrame(rows)
    frame["accuracy_drop"] = base.accuracy - frame.test_accuracy
    return frame


@worded
def qat_finding(frame: pd.DataFrame) -> str:
    """One line: QAT against PTQ at once and against as many float steps, against the test noise; its step cost.

    Args:
        frame: `qat_vs_ptq`'s frame.
    """
    ptq, longer, qat = (frame.iloc[i] for i in range(3))
    noise = measure.accuracy_noise(ptq.test_accuracy, profile().test_size)

    def gap(a, b) -> str:
        points = round((a.test_accuracy - b.test_accuracy) * 100, 1) + 0.0
        return f"{points:+.1f} points" + (" (chance)" if abs(points) <= noise * 100 else "")

    ratio = qat.step_time_s / longer.step_time_s
    if qat.step_time_p10_s > longer.step_time_p90_s:
        cost = f"a QAT step took {ratio:.2f}x a float step"
    elif qat.step_time_p90_s < longer.step_time_p10_s:
        cost = f"a QAT step took {ratio:.2f}x a float step, faster"
    else:
        cost = f"QAT and float steps took the same time within their p10-p90 spread ({ratio:.2f}x)"
    return (f"QAT against PTQ at once: {gap(qat, ptq)}; against as many float steps: {gap(qat, longer)}; chance "
            f"is up to {noise * 100:.1f} points; {cost}.")

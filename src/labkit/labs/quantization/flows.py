"""Notebook 06, section 2: static int8 by the two flows, FX graph mode (torch.ao, deprecated) and PT2E (torchao).

Both start from the same fine-tuned model and the same calibration batches and use the x86 recipe (int8 weights per
channel, uint8 activations per tensor). What they keep of the file, their test accuracy, and which layers each stores
in int8. No latency: the PT2E graph computes in float until ``torch.compile`` lowers it (the notebook says why).
"""

from __future__ import annotations

import copy
import time

import pandas as pd

from ... import measure, results
from ...config import RunConfig
from ...env import profile
from ...messages import worded
from ...techniques import quantization
from .workload import CALIBRATION_BATCHES, EVAL_IMAGES, calibration_batches, eval_accuracy, fine_tuned

FLOWS = {"int8_static": "FX graph mode (torch.ao, deprecated)", "int8_pt2e": "PT2E (torchao)"}


def flows(cfg: RunConfig, num_calibration: int = CALIBRATION_BATCHES, refresh: bool = False) -> pd.DataFrame:
    """fp32, and static int8 by FX graph mode and by PT2E, from one fine-tune (measured once, cached).

    Args:
        cfg: the fine-tune. num_calibration: calibration batches, the same for both. refresh: measure again.

    Returns:
        ``flow``, ``method``, ``model_size_bytes``, ``size_vs_fp32``, ``test_accuracy``, ``accuracy_drop`` (below
        fp32), ``int8_layers`` (how many), ``same_layers`` (the same layer names as FX), ``quantize_s``.
    """
    frame = results.cached_frame("quant-flows", [cfg], lambda: _measure(cfg, num_calibration), refresh=refresh,
                                 num_calibration=num_calibration)
    frame["size_vs_fp32"] = frame.model_size_bytes / frame.model_size_bytes.iloc[0]
    frame["accuracy_drop"] = frame.test_accuracy.iloc[0] - frame.test_accuracy
    return frame


def _measure(cfg: RunConfig, num_calibration: int) -> pd.DataFrame:
    model, _ = fine_tuned(cfg, progress=False)
    model = copy.deepcopy(model).cpu().eval()
    calibration = calibration_batches(cfg, num_calibration)
    rows = [{"flow": "fp32 (reference)", "method": "fp32", "model_size_bytes": measure.model_size_bytes(model),
             "test_accuracy": eval_accuracy(model, cfg), "layers": [], "quantize_s": 0.0}]
    for method, flow in FLOWS.items():
        start = time.perf_counter()
        int8 = quantization.quantize(model, method, calibration)
        seconds = time.perf_counter() - start
        rows.append({"flow": flow, "method": method, "model_size_bytes": measure.model_size_bytes(int8),
                     "test_accuracy": eval_accuracy(int8, cfg), "layers": quantization.int8_layers(int8),
                     "quantize_s": seconds})
    frame = pd.DataFrame(rows)
    fx_layers = frame.layers.iloc[1]
    frame["int8_layers"] = frame.layers.map(len)
    frame["same_layers"] = frame.layers.map(lambda names: names == fx_layers)
    return frame.drop(columns="layers")


@worded
def flows_finding(frame: pd.DataFrame, model: str = "the model") -> str:
    """One line: PT2E against FX graph mode: accuracy (a difference real only beyond the test noise), size, layers.

    Args:
        frame: `flows`' frame. model: the model's name, for the text.
    """
    fp32, fx, pt2e = (frame.iloc[i] for i in range(3))
    noise = measure.accuracy_noise(fp32.test_accuracy, min(profile().test_size, EVAL_IMAGES))
    points = round((pt2e.test_accuracy - fx.test_accuracy) * 100, 1) + 0.0  # never "-0.0"
    verdict = "the same within" if abs(points) <= noise * 100 else "beyond"
    layers = (f"the same {fx.int8_layers} layers in int8" if pt2e.same_layers else
              f"different layers in int8 ({fx.int8_layers} by FX, {pt2e.int8_layers} by PT2E)")
    return (f"{model}, static int8: PT2E {pt2e.test_accuracy:.1%} against FX {fx.test_accuracy:.1%} ({points:+.1f} "
            f"points, {verdict} the {noise * 100:.1f}-point test noise; fp32 {fp32.test_accuracy:.1%}); files "
            f"{pt2e.size_vs_fp32:.0%} and {fx.size_vs_fp32:.0%} of fp32's; {layers}.")

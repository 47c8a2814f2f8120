"""Notebook 06, section 3: four popular claims about quantizing a fine-tuned model, tested on the run's table.

The claims and why each holds or fails are in the notebook; these functions word what the live numbers showed.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import measure
from ...config import RunConfig
from ...display import quantity
from ...env import cpu_fp16_native
from ...inference import example_batch
from ...messages import worded, wrap
from ...techniques import quantization
from .methods import row, speed_verdict
from .workload import VIT, fine_tuned


@worded
def size_finding(table: pd.DataFrame, cnn: str | None = None) -> str:
    """One line: what int8 dynamic (and static int8) kept of each model's file, beside its share of Linear weights.

    Args:
        table: `compare`'s table. cnn: the CNN's name (default: the model that is not ``tiny_vit``).
    """
    cnn = cnn or next(m for m in table.model.unique() if m != VIT)
    vit, conv, static = row(table, VIT, "int8_dynamic"), row(table, cnn, "int8_dynamic"), row(table, cnn, "int8_static")
    text = (f"int8 dynamic kept {vit.size_vs_fp32:.0%} of {VIT}'s file ({vit.linear_share:.1%} of its parameters in "
            f"Linear layers) and {conv.size_vs_fp32:.0%} of {cnn}'s ({conv.linear_share:.1%})")
    if static.ran:
        text += f"; static int8 took {cnn} to {static.size_vs_fp32:.0%}"
    return text + "."


@worded
def fp16_finding(table: pd.DataFrame, model: str = VIT) -> str:
    """One line: fp16 and bf16 against fp32 on this CPU (and GPU), speed-ups judged against the timing noise.

    Args:
        table: `compare`'s table. model: the model compared.
    """
    fp16, bf16 = row(table, model, "fp16"), row(table, model, "bf16")
    has = {True: "with", False: "without", None: "perhaps without"}[cpu_fp16_native()]
    text = (f"{model} on this CPU ({has} fp16 arithmetic): fp16 {speed_verdict(fp16.cpu_speedup, fp16.cpu_noise)}; "
            f"bf16 {speed_verdict(bf16.cpu_speedup, bf16.cpu_noise)}")
    if not math.isnan(fp16.gpu_speedup):
        text += (f". On the GPU: fp16 {speed_verdict(fp16.gpu_speedup, fp16.gpu_noise)}; bf16 "
                 f"{speed_verdict(bf16.gpu_speedup, bf16.gpu_noise)}")
    return text + "."


@dataclass
class Stacking:
    """fp16 then int8 dynamic: the sizes, and what happened when the result ran."""

    fp32_bytes: int
    fp16_bytes: int
    int8_bytes: int
    int8_from_fp16_bytes: int
    fp16_input_error: str | None
    fp32_input_error: str | None

    def __str__(self) -> str:
        def outcome(error):
            return "ran" if error is None else f"failed: {error}"

        def size(nbytes):
            return quantity("model_size_bytes", nbytes)

        return wrap(f"files: fp32 {size(self.fp32_bytes)}, fp16 {size(self.fp16_bytes)}, "
                    f"int8 dynamic {size(self.int8_bytes)}, "
                    f"fp16 then int8 dynamic {size(self.int8_from_fp16_bytes)}.\n"
                    f"fp16 then int8 dynamic, fp16 inputs: {outcome(self.fp16_input_error)}\n"
                    f"fp16 then int8 dynamic, fp32 inputs: {outcome(self.fp32_input_error)}")


def _forward_error(model: nn.Module, x: torch.Tensor) -> str | None:
    try:
        with torch.no_grad():
            model(x)
    except (RuntimeError, TypeError) as exc:
        return str(exc).split("\n")[0]
    return None


def stacking(cfg: RunConfig) -> Stacking:
    """Cast the fine-tuned model to fp16, then apply int8 dynamic quantization, and run it on fp16 and fp32 inputs.

    Args:
        cfg: the fine-tune.
    """
    model, _ = fine_tuned(cfg, progress=False)
    model = copy.deepcopy(model).cpu().eval()
    x = example_batch(cfg, 8, device=torch.device("cpu"))
    half = copy.deepcopy(model).half()
    both = quantization.quantize(half, "int8_dynamic")
    return Stacking(measure.model_size_bytes(model), measure.model_size_bytes(half),
                    measure.model_size_bytes(quantization.quantize(model, "int8_dynamic")),
                    measure.model_size_bytes(both), _forward_error(both, x.half()), _forward_error(both, x))

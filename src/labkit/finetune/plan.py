"""The plan: what each way of fine-tuning a learner's model needs at their token lengths, against their GPU, predicted
from the config alone (`labkit.capacity.lm_training_memory`, no weights built).

One row per method (full, LoRA, QLoRA) and length (the data's p90, p99 and longest example, capped at ``seq_len``) at
the learner's batch: the predicted peak by category, plus `OVERHEAD_SHARE` on a GPU for what the formula does not
count (the CUDA caching allocator's rounding, cuBLAS workspaces); whether it fits; for a row that does not, the first
knob, taken in `KNOBS`' order and kept once taken, that makes it fit; the largest batch that fits; and the step
and epoch time from FLOPs at `ASSUMED_MFU` of the GPU's datasheet peak (``measure`` gives yours).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ..capacity import lm_training_memory, lora_parameters
from ..labresult import LabResult
from ..measure.counts import peak_flops
from ..messages import worded
from ..models.hub import DecoderShape
from ..units import GIB
from .target import Target

METHODS = ("full", "lora", "qlora")
METHOD_NAMES = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}
LORA = {"lora_rank": 16, "lora_targets": "all"}  # PEFT's target_modules="all-linear" at rank 16, as TRL's examples
OVERHEAD_SHARE = 0.10  # on a GPU beyond the formula: allocator rounding, library workspaces (lm_memory's 10-20 %)
ASSUMED_MFU = 0.35  # a fine-tune's share of a GPU's datasheet peak before measuring (nanoGPT-class loops: 0.3-0.5)
LOSS_CHUNKS = 8
# The knobs a plan tries on a row that does not fit, in order; each is kept once taken.
KNOBS = (("per-layer checkpointing", {"checkpointing": True}), ("8-bit AdamW", {"optimizer": "adamw8bit"}),
         ("chunked loss", {"loss_chunks": LOSS_CHUNKS}))
CATEGORIES = ("weights", "adapters", "gradients", "optimizer_state", "activations", "logits", "overhead")
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def loss_chunks_for(seq_len: int) -> int:
    """The chunked loss's slices for rows of ``seq_len``: the most, up to `LOSS_CHUNKS`, that divide it evenly (as
    `labkit.RunConfig` requires)."""
    return max(d for d in range(1, LOSS_CHUNKS + 1) if seq_len % d == 0)


def round_up(seq_len: int, cap: int, multiple: int = LOSS_CHUNKS) -> int:
    """``seq_len`` rounded up to a multiple of ``multiple`` (the chunked loss's slices divide it), at most ``cap``."""
    return min(-(-seq_len // multiple) * multiple, cap)


def predicted(shape: DecoderShape, method: str, seq_len: int, batch: int, target: Target, **knobs) -> dict:
    """The peak by category (`CATEGORIES`) and ``total`` of one plan row, in bytes."""
    settings = {"optimizer": "adamw", "checkpointing": False, "loss_chunks": None, **knobs}
    lora = LORA if method != "full" else {}
    parts = lm_training_memory(shape, method, seq_len, batch, precision=target.precision, **lora, **settings)
    adapters = 4 * lora_parameters(shape, LORA["lora_rank"], LORA["lora_targets"]) if lora else 0
    parts["weights"] -= adapters
    parts["adapters"] = adapters
    parts["overhead"] = int(OVERHEAD_SHARE * parts["total"]) if target.on_gpu else 0
    parts["total"] += parts["overhead"]
    return {k: parts[k] for k in (*CATEGORIES, "total")}


def training_flops_per_token(shape: DecoderShape, method: str, seq_len: int, checkpointing: bool = False) -> float:
    """FLOPs one trained token costs: forward 2N plus attention, backward twice the forward (once without weight
    gradients under LoRA/QLoRA: the base is frozen), a second forward when checkpointed."""
    forward = 2 * shape.num_parameters() + 4 * shape.num_hidden_layers * seq_len * shape.q_width // 2
    return forward * ((3 if method == "full" else 2) + checkpointing)


def largest_batch(shape: DecoderShape, method: str, seq_len: int, target: Target, **knobs) -> int:
    """The largest of `BATCHES` whose predicted peak fits ``target`` (0: not even one row)."""
    fits = [b for b in BATCHES if predicted(shape, method, seq_len, b, target, **knobs)["total"] <= target.memory_bytes]
    return max(fits, default=0)


@dataclass
class Plan(LabResult):
    """The plan's rows (see the module); ``target`` is where it was planned."""

    shown = ("method", "seq_len", "total_bytes", "fits", "knob", "largest_batch", "epoch_time_s")
    target: Target = field(default=None, kw_only=True)

    @worded
    def finding(self) -> str:
        rows = self.frame
        plain = rows[rows["fits"] == "yes"]
        if len(plain):
            best = plain.sort_values("seq_len", ascending=False, kind="stable").iloc[0]  # rows: full, LoRA, QLoRA
            return (f"On {self.target.label}: {best['method']} fits at seq_len {best['seq_len']} as it is "
                    f"({best['total_bytes'] / GIB:.3g} GiB predicted, up to batch {best['largest_batch']}).")
        knobbed = rows[rows["fits"] == "with the knob"]
        if len(knobbed):
            best = knobbed.sort_values("seq_len", ascending=False, kind="stable").iloc[0]
            return (f"On {self.target.label}: nothing fits as it is; {best['method']} at seq_len {best['seq_len']} "
                    f"fits with {best['knob']} ({best['knob_total_bytes'] / GIB:.3g} GiB predicted).")
        smallest = rows.loc[rows["knob_total_bytes"].idxmin()]
        return (f"On {self.target.label}: NO plan fits. The smallest is {smallest['method']} at seq_len "
                f"{smallest['seq_len']}, batch 1, with every knob: {smallest['knob_total_bytes'] / GIB:.3g} GiB "
                f"predicted against {self.target.memory_bytes / GIB:.3g} GiB.")


def make_plan(shape: DecoderShape, target: Target, lengths: dict, batch: int, tokens_per_epoch: int,
              methods=METHODS) -> Plan:
    """`Plan` for ``shape`` on ``target`` (see the module).

    Args:
        shape: the model's `DecoderShape` (`labkit.models.own.config_shape`). target: a `Target`.
        lengths: ``{"p90": 312, "p99": 870, "max": 1024}``, each a row length (already capped at seq_len).
        batch: rows per micro-batch. tokens_per_epoch: the tokens (padding included) one epoch trains.
        methods: of `METHODS`.

    Example:
        >>> make_plan(config_shape(model_config("Qwen/Qwen2.5-7B")), parse_target("t4"), {"max": 1024}, 1, 10**6)
    """
    flops = peak_flops(target.gpu_name, "bf16" if target.precision == "bf16" else "fp16")
    rows, order = [], {name: i for i, name in enumerate(METHOD_NAMES.values())}
    lengths = {label: n for i, (label, n) in enumerate(lengths.items()) if n not in list(lengths.values())[:i]}
    for method in methods:
        for label, seq_len in lengths.items():
            parts = predicted(shape, method, seq_len, batch, target)
            knob, knobs, fit = "", {}, parts["total"] <= target.memory_bytes
            with_knobs = parts
            if not fit:
                for name, change in KNOBS:
                    knobs.update(change)
                    with_knobs = predicted(shape, method, seq_len, batch, target, **knobs)
                    knob = f"{knob} + {name}" if knob else name
                    if with_knobs["total"] <= target.memory_bytes:
                        break
            ok = with_knobs["total"] <= target.memory_bytes
            if not ok and 0 < (smaller := largest_batch(shape, method, seq_len, target, **knobs)) < batch:
                knob, ok = f"{knob} + batch {smaller} x {-(-batch // smaller)} accumulated", True
                with_knobs = predicted(shape, method, seq_len, smaller, target, **knobs)
            per_token = training_flops_per_token(shape, method, seq_len, bool(knobs.get("checkpointing")))
            step = per_token * seq_len * batch / (flops * ASSUMED_MFU) if flops else None
            epoch = per_token * tokens_per_epoch / (flops * ASSUMED_MFU * target.gpus) if flops else None
            rows.append({"method": METHOD_NAMES[method], "length": label, "seq_len": seq_len, "batch": batch,
                         "total_bytes": parts["total"], "fits": "yes" if fit else "with the knob" if ok else "no",
                         "knob": knob if ok and not fit else "" if fit else "none enough: QLoRA or a shorter seq_len",
                         "knob_total_bytes": with_knobs["total"],
                         "largest_batch": largest_batch(shape, method, seq_len, target, **knobs),
                         "step_time_s": step, "epoch_time_s": epoch,
                         **{f"{k}_bytes": v for k, v in parts.items() if k != "total"}})
    frame = pd.DataFrame(rows)
    frame["_order"] = frame["method"].map(order)
    return Plan(frame.drop(columns="_order"), target=target)

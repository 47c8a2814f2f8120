"""The plan: what each way of fine-tuning a learner's model needs at their token lengths, against their GPU, predicted
from the config alone (`labkit.capacity.lm_training_memory`, no weights built).

One row per method (full, LoRA, QLoRA) and length (the data's p90, p99 and longest example, capped at ``seq_len``) at
the learner's batch: the predicted peak by category, plus `OVERHEAD_SHARE` on a GPU for what the formula does not
count (the CUDA caching allocator's rounding, cuBLAS workspaces); whether it fits; for a row that does not, the first
knob, taken in `KNOBS`' order and kept once taken, that makes it fit; the largest batch that fits; and the step
and epoch time from FLOPs at `ASSUMED_MFU` of the GPU's datasheet peak (``measure`` gives yours).

On several GPUs (``kaggle-2xt4``) each method is planned both ways, per GPU at the same micro-batch: DDP (a whole
copy per GPU, plus DDP's gradient buckets, a second copy of the trainable gradients) and FSDP2 (1/N of the
weights, gradients and optimizer state, plus the gathered root and layers: `lm_training_memory`'s ``shards``), with
the communication a step adds at `ASSUMED_LINK_BYTES_S`, not overlapped (an upper bound). QLoRA is planned under
DDP only: FSDP2 cannot shard bitsandbytes' 4-bit weights (`labkit.techniques.distributed.check_shardable`).
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
STRATEGIES = {"DDP": "ddp", "FSDP2": "fsdp"}  # how a plan on several GPUs trains each method
# Between two GPUs without a peer-to-peer path (Kaggle's 2 x T4: NCCL through host memory), an assumption, as the MFU
ASSUMED_LINK_BYTES_S = 5e9


def loss_chunks_for(seq_len: int) -> int:
    """The chunked loss's slices for rows of ``seq_len``: the most, up to `LOSS_CHUNKS`, that divide it evenly (as
    `labkit.RunConfig` requires)."""
    return max(d for d in range(1, LOSS_CHUNKS + 1) if seq_len % d == 0)


def round_up(seq_len: int, cap: int, multiple: int = LOSS_CHUNKS) -> int:
    """``seq_len`` rounded up to a multiple of ``multiple`` (the chunked loss's slices divide it), at most ``cap``."""
    return min(-(-seq_len // multiple) * multiple, cap)


def predicted(shape: DecoderShape, method: str, seq_len: int, batch: int, target: Target, strategy: str | None = None,
              **knobs) -> dict:
    """The peak by category (`CATEGORIES`) and ``total`` of one plan row, in bytes (per GPU under ``strategy``,
    ``ddp`` or ``fsdp``, on a target of several GPUs)."""
    settings = {"optimizer": "adamw", "checkpointing": False, "loss_chunks": None, **knobs}
    lora = LORA if method != "full" else {}
    shards = target.gpus if strategy == "fsdp" else 1
    parts = lm_training_memory(shape, method, seq_len, batch, precision=target.precision, shards=shards, **lora,
                               **settings)
    adapters = 4 * lora_parameters(shape, LORA["lora_rank"], LORA["lora_targets"]) // shards if lora else 0
    parts["weights"] -= adapters
    parts["adapters"] = adapters
    if strategy == "ddp":  # DDP's buckets: a second copy of the trainable gradients, allocated when it wraps
        parts["total"] += parts["gradients"]
        parts["gradients"] *= 2
    parts["overhead"] = int(OVERHEAD_SHARE * parts["total"]) if target.on_gpu else 0
    parts["total"] += parts["overhead"]
    return {k: parts[k] for k in (*CATEGORIES, "total")}


def training_flops_per_token(shape: DecoderShape, method: str, seq_len: int, checkpointing: bool = False) -> float:
    """FLOPs one trained token costs: forward 2N plus attention, backward twice the forward (once without weight
    gradients under LoRA/QLoRA: the base is frozen), a second forward when checkpointed."""
    forward = 2 * shape.num_parameters() + 4 * shape.num_hidden_layers * seq_len * shape.q_width // 2
    return forward * ((3 if method == "full" else 2) + checkpointing)


def communication_bytes(shape: DecoderShape, method: str, strategy: str | None, gpus: int) -> float:
    """Bytes each GPU sends a step: DDP's ring all-reduce of the trainable gradients (twice (N-1)/N of them);
    FSDP2's all-gathers of the stored weights in the forward and the backward and its reduce-scatter of the
    gradients ((N-1)/N of each). The weights are float32, as labkit keeps them (a frozen base too)."""
    if strategy is None or gpus < 2:
        return 0.0
    trainable = 4 * (shape.num_parameters() if method == "full" else
                     lora_parameters(shape, LORA["lora_rank"], LORA["lora_targets"]))
    stored = 4 * shape.num_parameters() + (trainable if method != "full" else 0)
    ring = (gpus - 1) / gpus
    return 2 * ring * trainable if strategy == "ddp" else ring * (2 * stored + trainable)


def largest_batch(shape: DecoderShape, method: str, seq_len: int, target: Target, strategy: str | None = None,
                  **knobs) -> int:
    """The largest of `BATCHES` whose predicted peak fits ``target`` (0: not even one row)."""
    fits = [b for b in BATCHES
            if predicted(shape, method, seq_len, b, target, strategy, **knobs)["total"] <= target.memory_bytes]
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
            return (f"On {self.target.label}: {_named(best)} fits at seq_len {best['seq_len']} as it is "
                    f"({best['total_bytes'] / GIB:.3g} GiB predicted{self._per_gpu}, up to batch "
                    f"{best['largest_batch']}).{self._strategies()}")
        knobbed = rows[rows["fits"] == "with the knob"]
        if len(knobbed):
            best = knobbed.sort_values("seq_len", ascending=False, kind="stable").iloc[0]
            return (f"On {self.target.label}: nothing fits as it is; {_named(best)} at seq_len {best['seq_len']} "
                    f"fits with {best['knob']} ({best['knob_total_bytes'] / GIB:.3g} GiB predicted"
                    f"{self._per_gpu}).{self._strategies()}")
        smallest = rows.loc[rows["knob_total_bytes"].idxmin()]
        return (f"On {self.target.label}: NO plan fits. The smallest is {_named(smallest)} at seq_len "
                f"{smallest['seq_len']}, batch 1, with every knob: {smallest['knob_total_bytes'] / GIB:.3g} GiB "
                f"predicted against {self.target.memory_bytes / GIB:.3g} GiB{self._per_gpu}.")

    @property
    def _per_gpu(self) -> str:
        return " per GPU" if self.target.gpus > 1 else ""

    def _strategies(self) -> str:
        """On several GPUs: what FSDP2 saves per GPU and costs in communication against DDP, per method."""
        if self.target.gpus < 2:
            return ""
        rows, said = self.frame, []
        for method in rows["method"].unique():
            by = rows[rows["method"] == method].groupby("strategy").first()
            if {"DDP", "FSDP2"} <= set(by.index):
                ddp, fsdp = by.loc["DDP"], by.loc["FSDP2"]
                sends = fsdp["communication_bytes"] / max(ddp["communication_bytes"], 1)
                said.append(f"{method}: FSDP2 holds {fsdp['total_bytes'] / ddp['total_bytes']:.0%} of DDP's memory "
                            f"per GPU and sends {sends:.3g}x its bytes a step")
        return (" " + "; ".join(said) + f" (at an assumed {ASSUMED_LINK_BYTES_S / 1e9:g} GB/s between the GPUs). QLoRA "
                "is planned under DDP only: FSDP2 cannot shard 4-bit weights.")


def _named(row) -> str:
    return f"{row['method']} under {row['strategy']}" if isinstance(row.get("strategy"), str) else row["method"]


def make_plan(shape: DecoderShape, target: Target, lengths: dict, batch: int, tokens_per_epoch: int,
              methods=METHODS) -> Plan:
    """`Plan` for ``shape`` on ``target`` (see the module).

    Args:
        shape: the model's `DecoderShape` (`labkit.models.own.config_shape`). target: a `Target`.
        lengths: ``{"p90": 312, "p99": 870, "max": 1024}``, each a row length (already capped at seq_len).
        batch: rows per micro-batch (per GPU). tokens_per_epoch: the tokens (padding included) one epoch trains.
        methods: of `METHODS`.

    Example:
        >>> make_plan(config_shape(model_config("Qwen/Qwen2.5-7B")), parse_target("t4"), {"max": 1024}, 1, 10**6)
    """
    lengths = {label: n for i, (label, n) in enumerate(lengths.items()) if n not in list(lengths.values())[:i]}
    strategies = STRATEGIES if target.gpus > 1 else {None: None}
    rows = [_row(shape, target, method, label, seq_len, batch, tokens_per_epoch, name, strategy)
            for method in methods for name, strategy in strategies.items() for label, seq_len in lengths.items()
            if not (method == "qlora" and strategy == "fsdp")]
    frame = pd.DataFrame(rows)
    if target.gpus > 1:
        return Plan(frame, target=target, columns=["method", "strategy", "seq_len", "total_bytes", "fits", "knob",
                                                   "epoch_time_s"])
    return Plan(frame.drop(columns=["strategy", "communication_bytes"]), target=target)


def _row(shape: DecoderShape, target: Target, method: str, label: str, seq_len: int, batch: int,
         tokens_per_epoch: int, name: str | None, strategy: str | None) -> dict:
    """One plan row: ``method`` at ``seq_len`` (``label``), per GPU under ``strategy`` where there are several."""
    parts = predicted(shape, method, seq_len, batch, target, strategy)
    knob, knobs, fit = "", {}, parts["total"] <= target.memory_bytes
    with_knobs = parts
    if not fit:
        for knob_name, change in KNOBS:
            knobs.update(change)
            with_knobs = predicted(shape, method, seq_len, batch, target, strategy, **knobs)
            knob = f"{knob} + {knob_name}" if knob else knob_name
            if with_knobs["total"] <= target.memory_bytes:
                break
    ok = with_knobs["total"] <= target.memory_bytes
    if not ok and 0 < (smaller := largest_batch(shape, method, seq_len, target, strategy, **knobs)) < batch:
        knob, ok = f"{knob} + batch {smaller} x {-(-batch // smaller)} accumulated", True
        with_knobs = predicted(shape, method, seq_len, smaller, target, strategy, **knobs)
    flops = peak_flops(target.gpu_name, "bf16" if target.precision == "bf16" else "fp16")
    per_token = training_flops_per_token(shape, method, seq_len, bool(knobs.get("checkpointing")))
    sent = communication_bytes(shape, method, strategy, target.gpus)
    step = per_token * seq_len * batch / (flops * ASSUMED_MFU) + sent / ASSUMED_LINK_BYTES_S if flops else None
    epoch = step * tokens_per_epoch / (seq_len * batch * target.gpus) if flops else None
    return {"method": METHOD_NAMES[method], "strategy": name, "length": label, "seq_len": seq_len, "batch": batch,
            "total_bytes": parts["total"], "fits": "yes" if fit else "with the knob" if ok else "no",
            "knob": knob if ok and not fit else "" if fit else "none enough: QLoRA or a shorter seq_len",
            "knob_total_bytes": with_knobs["total"],
            "largest_batch": largest_batch(shape, method, seq_len, target, strategy, **knobs),
            "step_time_s": step, "epoch_time_s": epoch, "communication_bytes": sent,
            "tokens_per_s": seq_len * batch * target.gpus / step if step else None,
            **{f"{k}_bytes": v for k, v in parts.items() if k != "total"}}

"""The recommended run: the plan's row the data and the GPU support, as labkit `RunConfig` fields (and YAML) and as the
keyword arguments of TRL's ``SFTConfig``, PEFT's ``LoraConfig`` and transformers' ``BitsAndBytesConfig``, each choice
with the row behind it.

The choice: the length is the data's p99 (one example in a hundred cut, counted by the audit), the method the first of
full, LoRA, QLoRA that fits there as is or with the plan's knob, the batch the learner's, split into micro-batches of
the largest that fits with gradient accumulation making up the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import yaml

from ..config import RunConfig
from ..errors import ConfigError
from ..labresult import LabResult
from ..messages import worded
from ..units import GIB
from .plan import LORA, Plan, loss_chunks_for

LENGTH = "p99"
_OPTIM = {"adamw": "adamw_torch", "adamw8bit": "adamw_8bit", "paged_adamw8bit": "paged_adamw_8bit"}


@dataclass
class Recommendation(LabResult):
    """The choices (``choice``, ``value``, ``because``); ``config`` (labkit's fields), ``sft``, ``lora`` and
    ``bnb`` (keyword arguments of TRL's SFTConfig, PEFT's LoraConfig, BitsAndBytesConfig; None: not used)."""

    shown = ("choice", "value", "because")
    config: dict = field(default_factory=dict, kw_only=True)
    sft: dict = field(default_factory=dict, kw_only=True)
    lora: dict | None = field(default=None, kw_only=True)
    bnb: dict | None = field(default=None, kw_only=True)

    def run_config(self) -> RunConfig:
        """labkit's `RunConfig` of the recommendation (QLoRA's NF4 base is `labkit.finetune.qlora`'s, not a field)."""
        if not self.config:
            raise ConfigError("recommendation", str(self.finding()), "a plan that fits the target")
        return RunConfig(**self.config)

    def yaml(self) -> str:
        """labkit's config as YAML (`labkit.load_config` reads it)."""
        return yaml.safe_dump(self.config, sort_keys=False)

    @worded
    def finding(self) -> str:
        values = dict(zip(self.frame["choice"], self.frame["value"], strict=True))
        if values["method"] == "none":
            return f"Nothing to recommend: {self.frame.iloc[0]['because']}."
        return (f"Train {values['method']} at seq_len {values['seq_len']}, batch {values['batch']}"
                + (f" ({values['knobs']})" if values.get("knobs") else "") + f": {self.frame.iloc[0]['because']}.")


def _pick(plan: Plan) -> pd.Series | None:
    rows = plan.frame[plan.frame["length"] == LENGTH] if (plan.frame["length"] == LENGTH).any() else plan.frame
    for method in ("full", "LoRA", "QLoRA"):
        chosen = rows[(rows["method"] == method) & (rows["fits"] != "no")]
        if len(chosen):
            return chosen.iloc[0]
    return None


def recommend_from(plan: Plan, model: str, data: str, loss_on: str | None, batch: int, lr: float = 2e-4,
                   measured=None) -> Recommendation:
    """The `Recommendation` for ``model`` on ``data`` from ``plan`` (see the module); ``measured``: a `Measurement`
    of this model here, whose row for the chosen method the choice cites beside the plan's.

    Example:
        >>> recommend_from(mine.plan(), "Qwen/Qwen2.5-0.5B", "chats.jsonl", "assistant", 8).sft["max_length"]
    """
    row = _pick(plan)
    if row is None:
        smallest = plan.frame.loc[plan.frame["knob_total_bytes"].idxmin()]
        raise_text = (f"no plan fits {plan.target.label}: the smallest, {smallest['method']} at seq_len "
                      f"{smallest['seq_len']} with every knob, needs {smallest['knob_total_bytes'] / GIB:.3g} GiB")
        return Recommendation(pd.DataFrame([{"choice": "method", "value": "none", "because": raise_text}]))
    knob = row["knob"]
    micro = batch
    if "accumulated" in knob:
        micro = int(knob.split("batch ")[1].split(" x")[0])
    accum = -(-batch // micro)
    checkpointing, eight_bit, chunks = ("checkpointing" in knob, "8-bit" in knob, "chunked" in knob)
    optimizer = ("paged_adamw8bit" if row["method"] == "QLoRA" else "adamw8bit") if eight_bit else "adamw"
    precision = plan.target.precision
    because = (f"predicted {row['knob_total_bytes'] / GIB:.3g} GiB of {plan.target.memory_bytes / GIB:.3g} on "
               f"{plan.target.label} (plan row {row['method']}, {row['length']} = {row['seq_len']} tokens)")
    if measured is not None and (rows := measured.frame[measured.frame["method"] == row["method"]]).size:
        seen = rows.iloc[-1]
        if seen.get("peak_memory_bytes") == seen.get("peak_memory_bytes"):  # measured (not NaN)
            because += (f"; measured here at batch {seen['batch']}: {seen['peak_memory_bytes'] / 2**20:.3g} MiB, "
                        f"{seen['error']:+.1%} from its prediction")
    choices = [("method", row["method"], because), ("seq_len", int(row["seq_len"]), f"the data's {row['length']}: "
               "longer examples are cut (the audit counts them)"),
               ("batch", f"{micro} x {accum}" if accum > 1 else micro, "the largest micro-batch that fits, "
                "accumulated to your batch" if accum > 1 else "your batch fits"),
               ("knobs", knob, "the plan's first knobs that make it fit" if knob else "none needed"),
               ("precision", precision, f"autocast on {plan.target.label}")]
    config = {"model": model, "dataset": data, "seq_len": int(row["seq_len"]), "batch_size": micro * accum,
              "grad_accum": accum, "precision": precision, "optimizer": optimizer, "lr": lr,
              "checkpointing": checkpointing, "loss_chunks": loss_chunks_for(int(row["seq_len"])) if chunks else None,
              "loss_on": loss_on}
    lora = bnb = None
    if row["method"] != "full":
        config.update(lora_rank=LORA["lora_rank"], lora_alpha=2 * LORA["lora_rank"], lora_targets="all-linear")
        lora = {"r": LORA["lora_rank"], "lora_alpha": 2 * LORA["lora_rank"], "target_modules": "all-linear",
                "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    if row["method"] == "QLoRA":
        bnb = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
               "bnb_4bit_compute_dtype": "bfloat16" if precision == "bf16" else "float16"}
    sft = {"max_length": int(row["seq_len"]), "per_device_train_batch_size": micro,
           "gradient_accumulation_steps": accum, "gradient_checkpointing": checkpointing,
           "optim": _OPTIM[optimizer], "learning_rate": lr, "packing": False,
           "bf16": precision == "bf16", "fp16": precision == "fp16"}
    if loss_on == "completion":
        sft["completion_only_loss"] = True
    elif loss_on == "assistant":
        sft["assistant_only_loss"] = True
    return Recommendation(pd.DataFrame([dict(zip(("choice", "value", "because"), c, strict=True)) for c in choices]),
                          config=config, sft=sft, lora=lora, bnb=bnb)

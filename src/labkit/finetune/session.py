"""`Finetune`: a learner's own model and data taken from question to recommended run (audit, plan, measure,
recommend), nothing run until asked. The model is a hub id or a folder with ``config.json``; the data a file or an
``hf:`` id, as `labkit.RunConfig` takes them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import machine, train
from ..config import RunConfig
from ..env import is_online, profile
from ..errors import ConfigError
from ..messages import note
from ..models import own
from ..result import RunResult
from ..techniques.lora import lora_state_dict
from ..text import pydoc_bpe
from ..text.own_data import DEFAULT_OWN_SEQ_LEN, HELD_OUT, encode_records
from ..text.records import is_data_file, is_hf_dataset
from ..validate import is_int
from .audit import LEAK_TOLERANCE, Audit, audit_examples, packing_leak
from .ladder import FinetuneLadder, climb
from .measure import Measurement, RankMeasurement, measure_methods, measure_ranks, method_config, run_method
from .plan import METHODS, Plan, largest_batch, make_plan, round_up
from .recommend import Recommendation, recommend_from
from .target import parse_target

LEAK_DOCUMENTS = 4  # examples packed in one row for the leak check
MARGIN = 0.10  # the share of the target's memory the largest batch leaves free (fragmentation, a longer batch)


def _positive(name: str, value, optional: bool = False):
    if (value is None and optional) or (is_int(value) and value > 0):
        return value
    raise ConfigError(name, value, "a positive integer" + (" or None" if optional else ""))


class Finetune:
    """A learner's fine-tune (see the module).

    Args:
        model: a hub id (``Qwen/Qwen2.5-0.5B``) or a folder with ``config.json``.
        data: a ``.jsonl``/``.json``/``.csv``/``.parquet`` file or ``hf:ORG/NAME``.
        gpu: ``t4``, ``kaggle-2xt4``, ``this``, a size (``24GiB``) or None (`labkit.finetune.target.parse_target`).
        seq_len: the most tokens an example keeps (None: 1024, capped at the model's maximum).
        batch_size: rows per optimizer step. loss_on, data_columns: as `labkit.RunConfig`'s.

    Example:
        >>> mine = Finetune("Qwen/Qwen2.5-0.5B", data="chats.jsonl", gpu="t4")
        >>> mine.plan()
    """

    def __init__(self, model: str, data: str, gpu=None, seq_len: int | None = None, batch_size: int = 8,
                 loss_on: str | None = None, data_columns: dict | None = None):
        if not own.is_own_language_model(model):
            raise ConfigError("model", model, "a hub id (ORG/NAME) or a folder holding config.json")
        if not (is_data_file(data) or is_hf_dataset(data)):
            raise ConfigError("data", data, "a .jsonl, .json, .csv or .parquet file, or hf:ORG/NAME")
        self.model, self.data, self.loss_on, self.data_columns = model, data, loss_on, dict(data_columns or {})
        self.batch_size = _positive("batch_size", batch_size)
        self.target = parse_target(gpu)
        self.config = own.model_config(model)  # checks it is a dense decoder, offline from a shipped config
        self.shape = own.config_shape(self.config)
        limit = own.max_positions(model)
        self.seq_len = min(_positive("seq_len", seq_len, optional=True) or DEFAULT_OWN_SEQ_LEN, limit)
        self.measured: Measurement | None = None  # the last measure()

    @functools.cached_property
    def tokenizer(self):
        tokenizer, why = own.own_tokenizer(self.model)
        if tokenizer is None:
            note(f"NO TOKENIZER for {self.model}: {why}. Token lengths are counted by labkit's BPE instead: expect "
                 "them to differ from the model's own tokenizer's.")
            return pydoc_bpe()
        return tokenizer

    @functools.cached_property
    def encoded(self):
        return encode_records(self.data, self.tokenizer, self.loss_on, self.data_columns, is_online())

    def lengths(self) -> dict:
        """The plan's row lengths: the data's p90, p99 and longest example, each capped at ``seq_len``."""
        lengths = np.array([len(ids) for ids, _ in self.encoded.examples])
        out = {k: int(np.ceil(np.percentile(lengths, q))) for k, q in (("p90", 90), ("p99", 99))}
        return {k: min(v, self.seq_len) for k, v in {**out, "max": int(lengths.max())}.items()}

    def audit(self, packing: bool = True) -> Audit:
        """Token lengths, truncated / pad / supervised shares, EOS in the labels, the template, the longest example,
        one example with its trained tokens marked and (``packing``) the packing leak check on this architecture."""
        data = self.encoded
        eos_expected = data.loss_on == "all" or data.shape not in ("messages", "sharegpt")
        result = audit_examples(data.examples, self.tokenizer, self.seq_len, self.batch_size, data.loss_on,
                                data.template, eos_expected)
        if packing:
            leak = self.leak()
            leaks = leak > LEAK_TOLERANCE
            row = {"check": "packing leak", "value": f"{leak:.2g}", "status": "fault" if leaks else "ok",
                   "detail": "packed documents attend to each other on this architecture and transformers: train "
                   "with packing='pad'" if leaks else "packed documents stay apart (logits equal to "
                   "each run alone) on this architecture and transformers"}
            result.frame.loc[len(result.frame)] = row
        return result

    def leak_model(self):
        """This model's architecture at a few layers and narrow widths, random weights: what the leak check runs."""
        transformers = own.transformers_module(self.model)
        fields = {**self.config.to_dict(), "num_hidden_layers": 2, "vocab_size": self.tokenizer.vocab_size,
                  "hidden_size": 16 * self.config.num_attention_heads, "intermediate_size": 64}
        if fields.get("head_dim"):
            fields["head_dim"] = 16
        if isinstance(fields.get("layer_types"), list):  # one per layer (Qwen2's sliding window, Gemma 2's)
            fields["layer_types"] = fields["layer_types"][:2]
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if isinstance(fields.get(name), int) and fields[name] >= fields["vocab_size"]:
                fields[name] = None
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        config._attn_implementation = "sdpa"
        # float32, as labkit trains (a published config.json says bfloat16, whose rounding would read as a leak)
        return transformers.AutoModelForCausalLM.from_config(
            config, **{own.dtype_argument(transformers.__version__): torch.float32})

    def plan(self, seq_len: int | None = None, batch_size: int | None = None, methods=METHODS) -> Plan:
        """Predicted, no weights: each method at the data's p90, p99 and longest length against the target."""
        seq_len = min(_positive("seq_len", seq_len, optional=True) or self.seq_len, own.max_positions(self.model))
        batch = _positive("batch_size", batch_size, optional=True) or self.batch_size
        bad = [m for m in methods if m not in METHODS]
        if bad or not methods:
            raise ConfigError("method", list(methods), f"names from {list(METHODS)}")
        lengths = {k: min(v, seq_len) for k, v in self.lengths().items()}
        kept = [min(len(ids), seq_len) for ids, _ in self.encoded.examples]
        audit = audit_examples(self.encoded.examples, self.tokenizer, seq_len, batch, self.encoded.loss_on)
        share = float(audit.frame.set_index("check").loc["padding", "value"].rstrip("%")) / 100
        return make_plan(self.shape, self.target, lengths, batch, int(sum(kept) / (1 - share)), methods)

    def run_config(self, steps: int | None = None) -> RunConfig:
        """The measured run: rows padded to the longest example (capped at ``seq_len``; rounded up to a multiple of 8,
        which the chunked loss's slices divide), a few steps, unscored."""
        prof = profile()
        steps = steps or prof.warmup_steps + train.PROFILING_STEPS + 3
        return RunConfig(model=self.model, dataset=self.data, batch_size=self.batch_size,
                         seq_len=round_up(self.lengths()["max"], self.seq_len), packing="pad_max", max_steps=steps,
                         evaluate=False,
                         loss_on=self.loss_on, data_columns=self.data_columns, lr=2e-4)

    def measure(self, methods=("full", "lora", "qlora"), refresh: bool = False) -> Measurement:
        """A few steps of each method here, as long as the longest batch: measured beside predicted (kept, so that
        `recommend` cites it)."""
        self.measured = measure_methods(self.run_config(), self.shape, methods, refresh=refresh)
        return self.measured

    def measure_ranks(self, methods=("full", "lora"), refresh: bool = False) -> RankMeasurement:
        """The plan's rows on several GPUs, checked here: each method under DDP and FSDP2 on as many processes as the
        target has GPUs (CPU processes over gloo here, with the global batch the target's GPUs would share)."""
        gpus = max(self.target.gpus, 2)
        cfg = self.run_config()
        return measure_ranks(cfg.replace(batch_size=cfg.batch_size * gpus), self.shape, methods, gpus, refresh)

    def largest_batch(self, method: str = "lora", margin: float = MARGIN) -> Measurement:
        """The largest batch that fits the target's memory less ``margin``, measured: the plan's largest batch (rows
        as long as the longest example, at most the training examples) run here, halved until its measured peak
        fits. Its rows are `measure`'s, the last one the batch that fits (none fits: an empty result says so)."""
        if method not in ("full", "lora"):
            raise ConfigError("method", method, "'full' or 'lora'")
        if not 0 <= margin < 1:
            raise ConfigError("margin", margin, "a share of the memory, 0 <= margin < 1 (e.g. 0.1)")
        budget = int(self.target.memory_bytes * (1 - margin))
        train_rows = len(self.encoded.examples) - 2 * max(1, round(HELD_OUT * len(self.encoded.examples)))
        batch = min(largest_batch(self.shape, method, self.lengths()["max"], replace(self.target, memory_bytes=budget)),
                    train_rows)
        frames = []
        while batch >= 1:
            row = measure_methods(self.run_config().replace(batch_size=batch), self.shape, (method,)).frame
            row["budget_bytes"] = budget
            frames.append(row)
            if row["peak_memory_bytes"].notna().all() and (row["peak_memory_bytes"] <= budget).all():
                break
            batch //= 2
        return Measurement(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())

    def ladder(self, rungs=None, refresh: bool = False) -> FinetuneLadder:
        """Each technique on this model and data, rung by rung, counted only outside the noise (packing only where
        the leak check finds none); ``rungs``: of `labkit.finetune.ladder.RUNGS` (None: all)."""
        return climb(self.run_config(), self.leak() <= LEAK_TOLERANCE, rungs, refresh=refresh)

    def leak(self) -> float:
        """The packing leak check's largest logit difference (`labkit.finetune.audit.packing_leak`)."""
        cut = [(ids[:self.seq_len], labels[:self.seq_len]) for ids, labels in self.encoded.examples[:LEAK_DOCUMENTS]]
        return packing_leak(self.leak_model(), cut, self.seq_len * LEAK_DOCUMENTS)

    def train(self, recommendation: Recommendation | None = None, out_dir: str | Path = "labkit-adapter",
              max_steps: int | None = None) -> RunResult:
        """Train the recommended run (`recommend`'s, or ``recommendation``) with `labkit.fit` here, and save the
        adapter (`labkit.techniques.lora.lora_state_dict`, ``adapter.pt``, with its LoraConfig arguments beside it)
        or, for a full fine-tune, the weights (``model.pt``) in ``out_dir``."""
        rec = recommendation or self.recommend()
        method = {"full": "full", "LoRA": "lora", "QLoRA": "qlora"}[rec.frame.set_index("choice").loc["method",
                                                                                                      "value"]]
        cfg = rec.run_config().replace(evaluate=False, **({"max_steps": max_steps} if max_steps else {}))
        if not self.target.on_gpu or machine.gpu_budget_bytes() is None:  # trained here, not on the target
            cfg = cfg.replace(precision="auto")
        if method == "qlora":
            cfg = method_config(cfg, "qlora")
        result = run_method(cfg, method, refresh=True, keep_model=True)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if method == "full":
            torch.save(result.model.state_dict(), out / "model.pt")
        else:
            torch.save(lora_state_dict(result.model), out / "adapter.pt")
            (out / "adapter_config.json").write_text(json.dumps(rec.lora, indent=1))
        return result

    def recommend(self) -> Recommendation:
        """The run the plan supports, as labkit's config and TRL / PEFT / bitsandbytes arguments."""
        return recommend_from(self.plan(), self.model, self.data, self.encoded.loss_on, self.batch_size,
                              measured=self.measured)

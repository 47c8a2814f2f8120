"""Measure a learner's fine-tune here: a few steps of each method, every row padded to the longest example's length
(``packing="pad_max"``), so that every step is as large as the largest batch the run will meet and an out-of-memory
shows at the first step, not the hundredth. Each row puts the measured peak (`labkit.fit`'s ``peak_memory_bytes``:
the allocator on a GPU, every live tensor on a CPU) beside the predicted one (`labkit.capacity.lm_training_memory`,
without the plan's GPU overhead) and prints the error. Each run is cached (`labkit.results.cached_fit`), so an
interrupted measurement keeps the rows that finished.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..capacity import lm_training_memory
from ..config import RunConfig
from ..env import resolve_device
from ..errors import ConfigError
from ..labresult import LabResult
from ..launcher import launch
from ..measure import Measured, compare
from ..messages import worded
from ..models.hub import DecoderShape
from ..result import RunResult
from ..results import cached_fit
from ..runsetup import build_model, set_up
from ..train import fit
from ..units import mib
from .plan import LORA, METHOD_NAMES, STRATEGIES, communication_bytes
from .qlora import nf4_lora, qlora_dtypes, qlora_optimizer

ERROR_BOUND = 0.10  # the stated accuracy: predicted within 10 % of measured (never more than 5 % under)
UNDER_BOUND = 0.05


def method_config(base: RunConfig, method: str) -> RunConfig:
    """``base`` as ``method`` trains it: full, LoRA (`LORA`: rank 16 on every linear layer) or QLoRA (the same
    adapters over an NF4 base, in 16 bits, with `qlora_optimizer`'s AdamW)."""
    if method == "full":
        return base.replace(lora_rank=None)
    lora = base.replace(lora_rank=LORA["lora_rank"], lora_targets="all-linear")
    if method == "qlora":
        device = resolve_device(base.device)
        return lora.replace(precision=qlora_dtypes(device)[2], optimizer=qlora_optimizer(device))
    return lora


def run_method(cfg: RunConfig, method: str, refresh: bool = False, progress: bool = False,
               keep_model: bool = False) -> RunResult:
    """One measured run of ``cfg`` (`method_config`'s): cached, except QLoRA, whose NF4 model is built here and
    handed to the loop (`labkit.finetune.qlora.nf4_lora`); a QLoRA this machine cannot run is a row with its error."""
    if method != "qlora":
        return fit(cfg, progress=progress) if keep_model else cached_fit(cfg, refresh=refresh, progress=progress)
    setup = set_up(cfg, model=False)
    model = nf4_lora(build_model(cfg, setup.kind, setup.train)[0], setup.device, cfg.lora_rank, cfg.lora_alpha)
    if isinstance(model, str):
        return RunResult(cfg.to_dict(), error=model)
    result = fit(cfg, model=model, progress=progress)
    result.model = result.model if keep_model else None
    return result


def predicted_peak(shape: DecoderShape, cfg: RunConfig, precision: str, method: str, ranks: int = 1,
                   strategy: str | None = None) -> int:
    """The formula's peak for ``cfg`` as it ran (rows of ``cfg.seq_len`` tokens, padded); per rank of ``ranks``
    under ``strategy`` (DDP: plus its gradient buckets; FSDP2: ``shards``)."""
    lora = LORA if method != "full" else {}
    parts = lm_training_memory(shape, method, cfg.seq_len, cfg.batch_size // (cfg.grad_accum * ranks),
                               precision=precision, shards=ranks if strategy == "fsdp" else 1,
                               foreach=resolve_device(cfg.device).type == "cuda",
                               optimizer=cfg.optimizer, checkpointing=bool(cfg.checkpointing),
                               attn_implementation=cfg.attn_implementation, loss_chunks=cfg.loss_chunks,
                               half_base=method != "lora", adapter_bytes=2 if method == "qlora" and
                               qlora_dtypes(resolve_device(cfg.device))[1] != torch.float32 else 4,
                               **lora)  # labkit's LoRA keeps a float32 base and float32 adapters
    return parts["total"] + (parts["gradients"] if strategy == "ddp" else 0)


@dataclass
class Measurement(LabResult):
    """One row per method measured: predicted and measured peak, the error, tokens/s, real tokens/s, MFU."""

    shown = ("method", "predicted_bytes", "peak_memory_bytes", "error", "tokens_per_s", "real_tokens_per_s", "mfu")

    @worded
    def finding(self) -> str:
        rows = self.frame.dropna(subset=["peak_memory_bytes"])
        if not len(rows):
            return "Nothing was measured: " + "; ".join(self.frame["error_message"].dropna()) + "."
        worst = rows.loc[rows["error"].abs().idxmax()]
        held = ((rows["error"].abs() <= ERROR_BOUND) & (rows["error"] >= -UNDER_BOUND)).all()
        parts = [f"{r.method}: predicted {mib(r.predicted_bytes)}, measured {mib(r.peak_memory_bytes)} ({r.error:+.1%})"
                 for r in rows.itertuples()]
        speed = ""
        if len(rows) > 1 and {"full", "LoRA"} <= set(rows["method"]):
            by = rows.set_index("method")
            step = compare(Measured.row(by.loc["LoRA"], "step_time_s"), Measured.row(by.loc["full"], "step_time_s"),
                           ("faster", "slower"))
            speed = f" A LoRA step against a full one: {step}."
        verdict = ("every prediction within its stated error (+-10 %, never 5 % under)" if held else
                   f"OUTSIDE the stated error at {worst.method} ({worst.error:+.1%})")
        return "; ".join(parts) + f": {verdict}." + speed


def measure_methods(base: RunConfig, shape: DecoderShape, methods=("full", "lora"), refresh: bool = False,
                    progress: bool = False) -> Measurement:
    """Run ``base`` (a learner's model and data, rows of ``base.seq_len`` tokens) as each method and measure it.

    Args:
        base: the run, with ``packing="pad_max"`` and a few ``max_steps``. shape: the model's `DecoderShape`.
        methods: of ``full``, ``lora``, ``qlora``. refresh: rerun cached rows. progress: a bar per run.

    Example:
        >>> measure_methods(cfg, config_shape(model_config(cfg.model))).frame[["method", "error"]]
    """
    rows = []
    for method in methods:
        cfg = method_config(base, method)
        result = run_method(cfg, method, refresh, progress)
        row = {"method": METHOD_NAMES[method], "seq_len": cfg.seq_len, "batch": cfg.batch_size,
               "precision": result.precision_used, "error_message": result.error}
        if result.ok:
            guess = predicted_peak(shape, cfg, result.precision_used, method)
            row.update(predicted_bytes=guess, peak_memory_bytes=result.peak_memory_bytes,
                       error=guess / result.peak_memory_bytes - 1, tokens_per_s=result.tokens_per_s,
                       real_tokens_per_s=result.real_tokens_per_s, mfu=result.mfu, step_time_s=result.step_time_s,
                       skipped_steps=result.skipped_steps,
                       step_time_p10_s=result.step_time_p10_s, step_time_p90_s=result.step_time_p90_s,
                       **{f"measured_{k}_bytes": v for k, v in result.memory_at_peak.items()})
        rows.append(row)
    return Measurement(pd.DataFrame(rows))


@dataclass
class RankMeasurement(LabResult):
    """One row per method and strategy on N processes: each rank's predicted and measured peak (the larger rank's),
    the error, the bytes a rank sent per step against the plan's, the communication share, tokens/s."""

    shown = ("method", "strategy", "predicted_bytes", "peak_memory_bytes", "error", "sent_bytes", "comm_share")

    @worded
    def finding(self) -> str:
        rows = self.frame
        held = ((rows["error"].abs() <= ERROR_BOUND) & (rows["error"] >= -UNDER_BOUND)).all()
        parts = [f"{r.method} under {r.strategy}: predicted {mib(r.predicted_bytes)} a rank, measured "
                 f"{mib(r.peak_memory_bytes)} ({r.error:+.1%})" for r in rows.itertuples()]
        sent = rows.dropna(subset=["sent_bytes"])
        sends = "; ".join(f"{r.method} under DDP sent {mib(r.sent_bytes)} a step, the plan says "
                          f"{mib(r.planned_sent_bytes)}" for r in sent.itertuples())
        verdict = "every prediction within its stated error" if held else "OUTSIDE the stated error"
        return "; ".join(parts) + f": {verdict}." + (f" {sends}." if sends else "")


def measure_ranks(base: RunConfig, shape: DecoderShape, methods=("full", "lora"), nproc: int = 2,
                  refresh: bool = False, progress: bool = False) -> RankMeasurement:
    """``base`` as each method on ``nproc`` processes (`labkit.launcher.launch`), under DDP and FSDP2: each rank's
    peak against `predicted_peak`'s per rank, and DDP's bytes all-reduced per step against the plan's."""
    for method in methods:  # all checked before the first job starts
        if method not in ("full", "lora"):
            raise ConfigError("method", method, "'full' or 'lora' (QLoRA's 4-bit base is built in one process)")
    rows = []
    for method in methods:
        cfg = method_config(base, method)
        for name, strategy in STRATEGIES.items():
            job = launch(cfg, nproc=nproc, strategy=strategy, refresh=refresh, progress=progress)
            peak = max(r["peak_memory_bytes"] for r in job.distributed["ranks"])
            guess = predicted_peak(shape, cfg, job.precision_used, method, nproc, strategy)
            rows.append(dict(method=METHOD_NAMES[method], strategy=name, predicted_bytes=guess,
                             peak_memory_bytes=peak, error=guess / peak - 1,
                             sent_bytes=job.distributed.get("allreduce_bytes_per_step"),
                             planned_sent_bytes=communication_bytes(shape, method, strategy, nproc),
                             comm_share=job.distributed["communication"]["share"], tokens_per_s=job.tokens_per_s,
                             step_time_s=job.step_time_s))
    return RankMeasurement(pd.DataFrame(rows))

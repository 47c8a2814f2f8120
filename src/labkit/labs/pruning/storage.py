"""Section 2 of notebook 04: a weight stored dense, as COO and as CSR (bytes and matmul time), and 2:4 sparsity."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import machine, measure
from ...config import RunConfig
from ...env import profile, resolve_device
from ...errors import ConfigError
from ...inference import LATENCY_BATCH, accuracy
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques import pruning
from .common import fine_tuned, timed

STORAGE_SPARSITIES = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


def largest_layer(model: nn.Module) -> str:
    """The prunable layer with the most weights (where storage format matters most)."""
    return max(pruning.prunable_layers(model), key=lambda item: item[1].weight.numel())[0]


@dataclass
class SparseStorage(LabResult):
    """`sparse_storage`'s rows, one per sparsity: bytes per layout and the matmul times."""

    shown = ("sparsity", "dense_bytes", "coo_bytes", "csr_bytes", "dense_matmul_s", "csr_matmul_s")

    def break_even(self, column: str) -> float | None:
        """The lowest sparsity at which ``column`` beats dense (a ``*_matmul_s`` time: faster beyond the noise)."""
        if column.endswith("_s"):
            wins = [compare(Measured.row(row, column), Measured.row(row, "dense_matmul_s")).direction == -1
                    for _, row in self.frame.iterrows()]
        else:
            wins = self.frame[column] < self.frame["dense_file_bytes" if "_file_" in column else "dense_bytes"]
        won = self.frame.sparsity[list(wins)]
        return float(won.min()) if len(won) else None

    def predicted(self) -> dict:
        """The break-even sparsities a float32 weight's bytes per nonzero predict: COO a value and an 8-byte index
        per dimension, CSR (as a matrix) a value and a column index."""
        ndim = len(str(self.frame.weight_shape.iloc[0]).split("x"))
        return {"coo_predicted": 1 - 4 / (4 + 8 * ndim), "csr_predicted": 1 - 4 / (4 + 8), "ndim": ndim}

    def long(self, what: str = "bytes") -> pd.DataFrame:
        """One row per layout, to draw a line each: ``bytes`` (dense, COO, CSR) or ``time`` (the matmul: dense, CSR)."""
        if what not in ("bytes", "time"):
            raise ConfigError("what", what, "'bytes' (storage in memory) or 'time' (matmul time)")
        layouts, column, source = ((pruning.LAYOUTS, "weight_bytes", "{}_bytes") if what == "bytes"
                                   else (("dense", "csr"), "matmul_s", "{}_matmul_s"))
        return pd.DataFrame([{"sparsity": row.sparsity, "layout": layout, column: row[source.format(layout)]}
                             for _, row in self.frame.iterrows() for layout in layouts])

    @worded
    def finding(self) -> str:
        predicted = self.predicted()
        parts = []
        for fmt in ("coo", "csr"):
            measured = self.break_even(f"{fmt}_bytes")
            where = f"from {measured:.0%} zeros" if measured is not None else "at no sparsity measured"
            parts.append(f"{fmt.upper()} took fewer bytes than dense {where} "
                         f"(predicted {predicted[f'{fmt}_predicted']:.0%})")
        top = self.frame.sort_values("sparsity").iloc[-1]
        speed = self.break_even("csr_matmul_s")
        at_top = compare(Measured.row(top, "csr_matmul_s"), Measured.row(top, "dense_matmul_s"), ("faster", "slower"))
        since = f"faster from {speed:.0%} zeros on" if speed is not None else "never faster"
        first = f"{self.frame.layer.iloc[0]} ({self.frame.weight_shape.iloc[0]})"
        return f"{first}: " + "; ".join(parts) + f"; the CSR matmul {since}, at {top.sparsity:.0%} {at_top}."


def sparse_storage(cfg: RunConfig, sparsities: Iterable[float] = STORAGE_SPARSITIES, layer: str | None = None,
                   batch_size: int = LATENCY_BATCH) -> SparseStorage:
    """The largest weight of the fine-tuned model pruned to each sparsity, stored dense, as COO and as CSR; its CPU
    matmul (``batch_size`` x 16 input columns: a conv's im2col at 4x4 pixels) dense and as CSR, timed in turns."""
    model, _ = fine_tuned(cfg)
    name = layer or largest_layer(model)
    layers = dict(pruning.prunable_layers(model))
    if name not in layers:
        raise ConfigError("layer", name, f"a prunable layer ({', '.join(layers)})")
    weight = layers[name].weight.detach().cpu()
    matrix_inputs = torch.randn(weight[0].numel(), batch_size * 16)
    rows = []
    for s in sparsities:
        s = pruning.check_amount(s, "sparsities")
        holder = nn.Linear(1, 1)  # a holder for torch's own L1 rule on this weight
        holder.weight = nn.Parameter(weight.clone())
        pruning.prune.l1_unstructured(holder, "weight", amount=s)
        w = holder.weight.detach()
        dense, csr = w.reshape(w.shape[0], -1).contiguous(), pruning.to_csr(w)
        times = _in_turns({"dense": lambda d=dense: d @ matrix_inputs, "csr": lambda c=csr: c @ matrix_inputs})
        rows.append({"layer": name, "weight_shape": "x".join(map(str, weight.shape)), "sparsity": s,
                     "measured_sparsity": float((w == 0).float().mean()),
                     **{f"{layout}_bytes": pruning.sparse_bytes(w, layout) for layout in pruning.LAYOUTS},
                     **{f"{layout}_file_bytes": pruning.sparse_bytes(w, layout, saved=True)
                        for layout in pruning.LAYOUTS}, **times})
    return SparseStorage(pd.DataFrame(rows))


def _in_turns(calls: dict) -> dict:
    """Each CPU call's median, p10 and p90 time (``<name>_matmul_s``, ``_p10_s``, ``_p90_s``), timed in turns."""
    for call in calls.values():
        call()  # warm-up
    # A quarter of the profile's repeats, at least 5: at `full` a dense CPU product of a ResNet's largest conv
    # takes a good fraction of a second.
    spreads = measure.in_turns(calls, max(5, profile().repeats // 4), torch.device("cpu"))
    return {f"{name}_matmul{part}_s": value for name, spread in spreads.items()
            for part, value in zip(("", "_p10", "_p90"), spread, strict=True)}


@dataclass
class SemiStructured:
    """2:4 sparsity on this machine: the 2:4 model's accuracy without recovery, and where it runs, a 4096x4096 fp16
    Linear's latency dense and 2:4 (``(median, p10, p90)``), or why not (``reason``)."""

    layers: list
    sparsity: float
    val_accuracy: float
    test_accuracy: float
    dense_test_accuracy: float
    speedup: float | None = None
    dense_latency: tuple | None = None
    sparse_latency: tuple | None = None
    reason: str | None = None

    @worded
    def finding(self) -> str:
        text = (f"2:4 pattern in {len(self.layers)} layers ({self.sparsity:.0%} of all prunable weights are zero): "
                f"test accuracy {self.dense_test_accuracy:.1%} -> {self.test_accuracy:.1%} without recovery. ")
        if self.speedup is None:
            return text + f"Speed not measured: {self.reason}."
        c = compare(tuple(self.sparse_latency), tuple(self.dense_latency), ("faster", "slower"))
        return text + f"A 4096x4096 fp16 Linear with 2:4 weights took {c} the dense layer's time."

    def __str__(self) -> str:
        return str(self.finding())


def semi_structured(cfg: RunConfig, size: int = 4096) -> SemiStructured:
    """The 2:4 pattern on the fine-tuned model; on an Ampere+ GPU, a 2:4 Linear timed against a dense one."""
    model, _ = fine_tuned(cfg)
    sparse_model = copy.deepcopy(model)
    layers = pruning.apply_2to4(sparse_model)
    record = SemiStructured(layers, pruning.sparsity(sparse_model).overall, accuracy(sparse_model, cfg, "val"),
                            accuracy(sparse_model, cfg, "test"), accuracy(model, cfg, "test"))
    device = resolve_device(cfg.device)
    capability = machine.here().capability if device.type == "cuda" else None
    if capability is None or capability < (8, 0):
        record.reason = ("2:4 kernels need a CUDA GPU of compute capability 8.0+, and this run is on the CPU"
                         if capability is None else f"2:4 kernels need compute capability 8.0+, and this GPU has "
                         f"{capability[0]}.{capability[1]}")
        return record
    try:
        dense = nn.Linear(size, size, bias=False).half().to(device)
        with torch.no_grad():
            dense.weight.mul_(pruning.semi_structured_mask(dense.weight))
        sparse = pruning.to_semi_structured(copy.deepcopy(dense))
        t = timed([dense, sparse], torch.randn(size, size, dtype=torch.float16, device=device))
        record.dense_latency, record.sparse_latency = [(t["latency_s"][i], t["latency_p10_s"][i],
                                                        t["latency_p90_s"][i]) for i in (0, 1)]
        record.speedup = t["latency_s"][0] / t["latency_s"][1]
    except Exception as exc:  # noqa: BLE001 - a missing kernel (e.g. an older torch build): say so, keep the rest
        record.reason = f"torch's 2:4 kernels failed here ({type(exc).__name__}: {exc})"
    return record

"""Section 2 of notebook 04: a weight stored dense, as COO and as CSR (bytes and matmul time), and 2:4 sparsity."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import machine, measure
from ...config import RunConfig
from ...env import Profile, profile, resolve_device
from ...errors import ConfigError
from ...messages import worded, wrap
from ...techniques import pruning
from .common import LATENCY_BATCH, accuracy, fine_tuned, latencies_with_band

STORAGE_SPARSITIES = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


def largest_layer(model: nn.Module) -> str:
    """The prunable layer with the most weights (where storage format matters most).

    Args:
        model: the model.
    """
    return max(pruning.prunable_layers(model), key=lambda item: item[1].weight.numel())[0]


def sparse_storage(cfg: RunConfig, sparsities: Iterable[float] = STORAGE_SPARSITIES, layer: str | None = None,
                   batch_size: int = LATENCY_BATCH) -> pd.DataFrame:
    """The largest weight of the fine-tuned model, pruned to each sparsity and stored dense, as COO and as CSR.

    Args:
        cfg: the fine-tune.
        sparsities: the shares of zeros.
        layer: the weight (default: the largest).
        batch_size: the matmul's input columns are ``batch_size`` x 16 (a conv's im2col product at 4x4 pixels).

    Returns:
        Rows ``sparsity``, ``{dense,coo,csr}_bytes`` (in memory), ``{...}_file_bytes`` (``torch.save``), and the
        CPU matmul times timed in turns: ``dense_matmul_s``, ``csr_matmul_s`` (medians) and the dense one's
        ``dense_matmul_p10_s`` / ``dense_matmul_p90_s`` (its call-to-call spread).
    """
    model, _ = fine_tuned(cfg)
    name = layer or largest_layer(model)
    layers = dict(pruning.prunable_layers(model))
    if name not in layers:
        raise ConfigError("layer", name, f"a prunable layer ({', '.join(layers)})")
    weight = layers[name].weight.detach().cpu()
    matrix_inputs = torch.randn(weight[0].numel(), batch_size * 16)
    prof = profile()
    rows = []
    for s in sparsities:
        s = pruning.check_amount(s, "sparsities")
        layer_copy = nn.Linear(1, 1)  # a holder for torch's own L1 rule on this weight
        layer_copy.weight = nn.Parameter(weight.clone())
        pruning.prune.l1_unstructured(layer_copy, "weight", amount=s)
        w = layer_copy.weight.detach()
        dense, csr = w.reshape(w.shape[0], -1).contiguous(), pruning.to_csr(w)
        dense_t, csr_t = _in_turns([lambda d=dense: d @ matrix_inputs, lambda c=csr: c @ matrix_inputs], prof)
        rows.append({"layer": name, "weight_shape": "x".join(map(str, weight.shape)), "sparsity": s,
                     "measured_sparsity": float((w == 0).float().mean()),
                     **{f"{layout}_bytes": pruning.sparse_bytes(w, layout) for layout in pruning.LAYOUTS},
                     **{f"{layout}_file_bytes": pruning.sparse_bytes(w, layout, saved=True)
                        for layout in pruning.LAYOUTS},
                     "dense_matmul_s": dense_t[0], "dense_matmul_p10_s": dense_t[1], "dense_matmul_p90_s": dense_t[2],
                     "csr_matmul_s": csr_t[0]})
    return pd.DataFrame(rows)


def _in_turns(calls: list, prof: Profile) -> list[tuple[float, float, float]]:
    """(median, p10, p90) of each CPU call's time, timed in turns (one call of each, round after round)."""
    for call in calls:
        call()  # warm-up
    times: list[list[float]] = [[] for _ in calls]
    # A quarter of the profile's repeats, at least 5: at `full` the matrix is a ResNet's largest conv (2.4M weights),
    # and a dense CPU product of it takes a good fraction of a second.
    for _ in range(max(5, prof.repeats // 4)):
        for call, collected in zip(calls, times, strict=True):
            start = time.perf_counter()
            call()
            collected.append(time.perf_counter() - start)
    return [measure.spread(t) for t in times]


def break_even(frame: pd.DataFrame, column: str) -> float | None:
    """The lowest sparsity at which ``column`` beats dense; for a time, below the dense one's 10th percentile.

    Args:
        frame: `sparse_storage`'s rows.
        column: ``coo_bytes``, ``csr_bytes``, ``coo_file_bytes``, ``csr_file_bytes`` or ``csr_matmul_s``.
    """
    if column.endswith("_s"):
        dense = "dense_matmul_p10_s"
    else:
        dense = "dense_file_bytes" if column.endswith("_file_bytes") else "dense_bytes"
    wins = frame[frame[column] < frame[dense]]
    return float(wins.sparsity.min()) if len(wins) else None


def storage_numbers(frame: pd.DataFrame) -> dict:
    """The break-even sparsities that a format's bytes per nonzero predict for the float32 weight in ``frame``.

    COO keeps a 4-byte value and one 8-byte index per dimension for each nonzero; CSR (as a matrix) a value and
    an 8-byte column index (its one pointer per row left out).

    Args:
        frame: `sparse_storage`'s rows (their ``weight_shape``).
    """
    ndim = len(str(frame.weight_shape.iloc[0]).split("x"))
    return {"coo_predicted": 1 - 4 / (4 + 8 * ndim), "csr_predicted": 1 - 4 / (4 + 8), "ndim": ndim}


@worded
def storage_finding(frame: pd.DataFrame) -> str:
    """One line: from which sparsity COO and CSR took fewer bytes than dense, and whether CSR's matmul won.

    Args:
        frame: `sparse_storage`'s rows.
    """
    predicted = storage_numbers(frame)
    parts = []
    for fmt in ("coo", "csr"):
        measured = break_even(frame, f"{fmt}_bytes")
        where = f"from {measured:.0%} zeros" if measured is not None else "at no sparsity measured"
        expected = predicted[f"{fmt}_predicted"]
        parts.append(f"{fmt.upper()} took fewer bytes than dense {where} (predicted {expected:.0%})")
    speed = break_even(frame, "csr_matmul_s")
    top = frame.sort_values("sparsity").iloc[-1]
    if speed is None:
        verdict = (f"the CSR matmul never beat the dense one's call-to-call spread, not even at {top.sparsity:.0%} "
                   f"zeros ({top.csr_matmul_s / top.dense_matmul_s:.2f}x its time)")
    else:
        verdict = (f"the CSR matmul beat the dense one, beyond its call-to-call spread, from {speed:.0%} zeros on "
                   f"({top.csr_matmul_s / top.dense_matmul_s:.2f}x its time at {top.sparsity:.0%})")
    return f"{frame.layer.iloc[0]} ({frame.weight_shape.iloc[0]}): " + "; ".join(parts) + f"; {verdict}."


def storage_long(frame: pd.DataFrame, what: str = "bytes") -> pd.DataFrame:
    """`sparse_storage`'s frame with one row per layout, to draw one line per layout.

    Args:
        frame: `sparse_storage`'s rows.
        what: ``bytes`` (in memory: dense, COO, CSR) or ``time`` (the matmul: dense, CSR).
    """
    if what not in ("bytes", "time"):
        raise ConfigError("what", what, "'bytes' (storage in memory) or 'time' (matmul time)")
    layouts = pruning.LAYOUTS if what == "bytes" else ("dense", "csr")
    column = "weight_bytes" if what == "bytes" else "matmul_s"
    source = "{}_bytes" if what == "bytes" else "{}_matmul_s"
    return pd.DataFrame([{"sparsity": row.sparsity, "layout": layout, column: row[source.format(layout)]}
                         for _, row in frame.iterrows() for layout in layouts])


@dataclass
class SemiStructured:
    """2:4 sparsity on this machine: accuracy after the pattern is applied, and the GPU speed-up where it runs.

    Attributes:
        layers: the layers that got the 2:4 pattern. sparsity: zeros among all prunable weights.
        val_accuracy / test_accuracy: of the 2:4 model, without recovery; dense_test_accuracy: before.
        speedup: dense fp16 latency / 2:4 latency of a 4096x4096 Linear at batch 4096, timed in turns (None where
            it cannot run). band: the noise band of the latency ratio (`latencies_with_band`).
        reason: why the speed was not measured (None when it was).
    """

    layers: list
    sparsity: float
    val_accuracy: float
    test_accuracy: float
    dense_test_accuracy: float
    speedup: float | None = None
    band: tuple | None = None
    reason: str | None = None

    def __str__(self) -> str:
        text = (f"2:4 pattern in {len(self.layers)} layers ({self.sparsity:.0%} of all prunable weights are zero): "
                f"test accuracy {self.dense_test_accuracy:.1%} -> {self.test_accuracy:.1%} without recovery. ")
        if self.speedup is None:
            return wrap(text + f"Speed not measured: {self.reason}.")
        low, high = self.band
        real = "beyond" if not low <= 1 / self.speedup <= high else "within"
        return wrap(text + f"A 4096x4096 fp16 Linear ran {self.speedup:.2f}x faster with 2:4 weights, {real} the "
                           f"dense layer's timing noise ({low:.2f}x-{high:.2f}x).")


def semi_structured(cfg: RunConfig, size: int = 4096) -> SemiStructured:
    """Apply the 2:4 pattern to the fine-tuned model; on an Ampere+ GPU, time a 2:4 Linear against a dense one.

    Args:
        cfg: the fine-tune.
        size: the timed Linear's inputs, outputs and batch.
    """
    model, _ = fine_tuned(cfg)
    dense_acc = accuracy(model, cfg, "test")
    sparse_model = copy.deepcopy(model)
    layers = pruning.apply_2to4(sparse_model)
    record = SemiStructured(layers, pruning.sparsity(sparse_model).overall, accuracy(sparse_model, cfg, "val"),
                            accuracy(sparse_model, cfg, "test"), dense_acc)
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        record.reason = "2:4 kernels need a CUDA GPU of compute capability 8.0+, and this run is on the CPU"
        return record
    capability = machine.here().capability
    if capability < (8, 0):
        record.reason = (f"2:4 kernels need compute capability 8.0+, and this GPU has "
                         f"{capability[0]}.{capability[1]}")
        return record
    try:
        dense = nn.Linear(size, size, bias=False).half().to(device)
        with torch.no_grad():
            dense.weight.mul_(pruning.semi_structured_mask(dense.weight))
        sparse = pruning.to_semi_structured(copy.deepcopy(dense))
        x = torch.randn(size, size, dtype=torch.float16, device=device)
        (dense_s, sparse_s), record.band = latencies_with_band([dense, sparse], x)
        record.speedup = dense_s / sparse_s
    except Exception as exc:  # noqa: BLE001 - a missing kernel (e.g. an older torch build): say so, keep the rest
        record.reason = f"torch's 2:4 kernels failed here ({type(exc).__name__}: {exc})"
    return record

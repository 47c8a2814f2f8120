"""Section 6 of notebook 10: the logits' bytes (rows x length x vocabulary, float32) for real vocabularies, and the
peak memory of output layer + loss + backward with one cross-entropy against chunked cross-entropy."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import measure
from ...display import number
from ...env import profile, resolve_device
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...techniques.chunked_loss import chunked_loss_sum, logits_bytes
from ...techniques.token_loss import token_loss_sum
from ...units import mib
from .common import interleaved

# Vocabulary sizes of familiar tokenizers: labkit's digits and pydoc BPE, Llama 2, SmolLM2, Llama 3.
VOCAB_SIZES = {"labkit digits": 16, "labkit pydoc BPE": 2048, "Llama 2": 32000, "SmolLM2": 49152, "Llama 3": 128256}
_WIDTHS = {"ci": 128, "quick": 512, "full": 512}  # the measured case's row length at each profile


@dataclass
class LogitsSizes(LabResult):
    """One batch's float32 logits and their gradient, by formula, per vocabulary."""

    shown = ("tokenizer", "vocab_size", "logits_bytes", "with_gradient_bytes")


def logits_sizes(rows: int = 4, width: int = 512, vocab_sizes: dict | None = None) -> LogitsSizes:
    """`LogitsSizes` of ``rows`` x ``width`` tokens for each vocabulary (name -> size, default `VOCAB_SIZES`)."""
    vocab_sizes = VOCAB_SIZES if vocab_sizes is None else vocab_sizes
    return LogitsSizes(pd.DataFrame([{"tokenizer": name, "vocab_size": size, "logits_bytes": logits_bytes(
        rows, width, size), "with_gradient_bytes": 2 * logits_bytes(rows, width, size)}
        for name, size in vocab_sizes.items()]))


@dataclass
class ChunkedLoss(LabResult):
    """Per chunk count (1: one cross-entropy): peak memory, its ratio, step time and the loss's and gradients'
    largest relative difference from one cross-entropy."""

    shown = ("chunks", "peak_memory_bytes", "peak_ratio", "loss_diff", "grad_diff", "step_time_s")

    @worded
    def finding(self) -> str:
        frame = self.frame
        base, parts = frame.iloc[0], []
        for _, row in frame.iloc[1:].iterrows():
            time = compare(Measured.row(row, "step_time_s"), Measured.row(base, "step_time_s"),
                           words=("faster", "slower"))
            parts.append(f"{int(row['chunks'])} chunks {mib(row['peak_memory_bytes'], '.3g')} "
                         f"({number(row['peak_ratio'])}x), step time {time}")
        same = frame["loss_diff"].max() < 1e-5 and frame["grad_diff"].max() < 1e-5
        verdict = "the same loss and gradients" if same else "DIFFERENT losses or gradients"
        return (f"One cross-entropy peaks at {mib(base['peak_memory_bytes'], '.3g')} for "
                f"{mib(base['logits_bytes'], '.3g')} of float32 logits; " + "; ".join(parts) +
                f"; {verdict} (loss {frame['loss_diff'].max():.1e} relative, gradients "
                f"{frame['grad_diff'].max():.1e}).")


def chunked_loss_peaks(chunk_counts=(2, 4, 8), rows: int = 4, width: int | None = None, hidden_size: int = 128,
                       vocab_size: int = 2048, repeats: int | None = None, seed: int = 0,
                       loss_fn=chunked_loss_sum, device=None) -> ChunkedLoss:
    """Peak memory (`labkit.measure.track_step_memory`) and time of a bias-free head + loss + backward on random
    hidden states: one cross-entropy, then ``loss_fn(hidden, head, labels, chunks)`` per chunk count (each >= 2).
    ``width`` None: 128 at ``ci``, 512 otherwise; ``repeats`` None: the profile's; ``device`` None: the learner's."""
    prof = profile()
    width = _WIDTHS.get(prof.name, 512) if width is None else width
    repeats = prof.repeats if repeats is None else repeats
    if any(not isinstance(c, int) or c < 2 for c in chunk_counts):
        raise ConfigError("chunk_counts", chunk_counts, "integers >= 2 (1 chunk, one cross-entropy, is the baseline)")
    device = resolve_device("auto" if device is None else device)
    g = torch.Generator().manual_seed(seed)  # on the CPU: the same numbers on every device
    torch.manual_seed(seed)
    head = nn.Linear(hidden_size, vocab_size, bias=False).to(device)
    hidden = torch.randn(rows, width, hidden_size, generator=g).to(device).requires_grad_(True)
    labels = torch.randint(0, vocab_size, (rows, width), generator=g).to(device)
    chunked = loss_fn  # the loop below rebinds the name loss_fn
    variants = {1: lambda: token_loss_sum(head(hidden), labels)}
    variants.update({c: (lambda c=c: chunked(hidden, head, labels, c)) for c in chunk_counts})

    def run(loss_fn):
        hidden.grad = head.weight.grad = None
        loss = loss_fn()
        loss.backward()
        return loss.detach()

    optimizer = torch.optim.SGD(head.parameters(), lr=0.0)  # no state: only the step's own tensors count
    records, reference, holder = [], None, {}
    for chunks, loss_fn in variants.items():
        breakdown = measure.track_step_memory(lambda loss_fn=loss_fn: holder.update(loss=run(loss_fn)), head,
                                              optimizer, device)
        got = (holder.pop("loss"), hidden.grad.clone(), head.weight.grad.clone())
        reference = reference or got
        records.append({"chunks": chunks, "logits_bytes": logits_bytes(rows, width, vocab_size),
                        "peak_memory_bytes": breakdown.total_peak_bytes,
                        "loss_diff": float((got[0] - reference[0]).abs() / reference[0].abs()),
                        "grad_diff": max(float((a - b).abs().max() / b.abs().max())
                                         for a, b in zip(got[1:], reference[1:], strict=True))})
    times = interleaved({chunks: (lambda f=f: run(f)) for chunks, f in variants.items()}, repeats, device)
    for record in records:
        record.update(times[record["chunks"]])
    frame = pd.DataFrame(records)
    frame.insert(3, "peak_ratio", frame["peak_memory_bytes"] / frame["peak_memory_bytes"].iloc[0])
    return ChunkedLoss(frame)

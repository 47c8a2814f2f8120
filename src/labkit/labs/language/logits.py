"""Section 6 of notebook 10, the logits and chunked cross-entropy: rows x length x vocabulary float32 numbers (and
their gradient) computed for real vocabularies, then the peak memory of the output layer + loss + backward measured
with one cross-entropy against `labkit.techniques.chunked_loss.chunked_loss_sum` at a few chunk counts."""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from ... import measure
from ...display import number
from ...env import profile, resolve_device
from ...errors import ConfigError
from ...messages import worded
from ...techniques.chunked_loss import chunked_loss_sum, logits_bytes
from ...techniques.token_loss import token_loss_sum
from ...units import mib

# Vocabulary sizes of familiar tokenizers: labkit's digits and pydoc BPE, Llama 2, SmolLM2, Llama 3.
VOCAB_SIZES = {"labkit digits": 16, "labkit pydoc BPE": 2048, "Llama 2": 32000, "SmolLM2": 49152, "Llama 3": 128256}
_WIDTHS = {"ci": 128, "quick": 512, "full": 512}  # the measured case's row length at each profile


def logits_sizes(rows: int = 4, width: int = 512, vocab_sizes: dict | None = None) -> pd.DataFrame:
    """One batch's logits in float32 (the loss's upcast) and their gradient, by formula, for each vocabulary.

    Args:
        rows, width: the batch's rows and tokens per row. vocab_sizes: name -> vocabulary size (`VOCAB_SIZES`).

    Example:
        >>> logits_sizes(4, 512).set_index("tokenizer").loc["Llama 2", "logits_bytes"] / 2**20
        250.0
    """
    vocab_sizes = VOCAB_SIZES if vocab_sizes is None else vocab_sizes
    rows_out = [{"tokenizer": name, "vocab_size": size, "logits_bytes": logits_bytes(rows, width, size),
                 "with_gradient_bytes": 2 * logits_bytes(rows, width, size)} for name, size in vocab_sizes.items()]
    return pd.DataFrame(rows_out)


def chunked_loss_peaks(chunk_counts=(2, 4, 8), rows: int = 4, width: int | None = None, hidden_size: int = 128,
                       vocab_size: int = 2048, repeats: int | None = None, seed: int = 0,
                       loss_fn=chunked_loss_sum, device=None) -> pd.DataFrame:
    """Peak memory and time of output layer + loss + backward: one cross-entropy, then ``chunked_loss_sum``.

    A bias-free ``nn.Linear(hidden_size, vocab_size)`` head on random final hidden states (what a model's body
    hands the head); peaks from `labkit.measure.track_step_memory` (head, hidden states, logits, gradients).

    Args:
        chunk_counts: slices of the sequence to try, each >= 2 (``chunked_loss_sum`` allows uneven slices).
        rows, width: the batch (``width`` None: 128 at ``ci``, 512 otherwise). hidden_size, vocab_size: the head.
        repeats: timed passes of each, interleaved (None: the profile's). seed: for the head and the data.
        loss_fn: the chunked loss, ``loss_fn(hidden, head, labels, chunks)`` (a learner's own, or labkit's).
        device: where to measure (None: the learner's, a GPU when there is one; the tracker counts that device's
            tensors, the timer synchronises it).

    Returns:
        A frame: ``chunks`` (1: one cross-entropy, no checkpoint), ``logits_bytes``, ``peak_memory_bytes``,
        ``peak_ratio``, ``step_time_s`` (median) with ``step_time_p10_s`` / ``_p90_s``, ``loss_diff`` and
        ``grad_diff`` (largest difference over the largest value, hidden states' and head's gradients), both
        against one cross-entropy.

    Example:
        >>> chunked_loss_peaks()[["chunks", "peak_memory_bytes", "loss_diff"]]
    """
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
    timers = {chunks: measure.StepTimer(hidden.device) for chunks in variants}
    for _ in range(repeats):  # interleaved: a busy moment slows every variant alike
        for chunks, loss_fn in variants.items():
            timers[chunks].start()
            run(loss_fn)
            timers[chunks].stop()
    for record in records:
        median, p10, p90 = measure.spread(timers[record["chunks"]].times_s())
        record.update(step_time_s=median, step_time_p10_s=p10, step_time_p90_s=p90)
    frame = pd.DataFrame(records)
    frame.insert(3, "peak_ratio", frame["peak_memory_bytes"] / frame["peak_memory_bytes"].iloc[0])
    return frame


@worded
def logits_finding(frame: pd.DataFrame) -> str:
    """The chunked losses' peak memory against one cross-entropy's, their time (beyond the noise or not) and
    whether loss and gradients stayed the same."""
    base, parts = frame.iloc[0], []
    for _, row in frame.iloc[1:].iterrows():
        order = measure.separated((row["step_time_p10_s"], row["step_time_p90_s"]),
                                  (base["step_time_p10_s"], base["step_time_p90_s"]))
        time = {None: "no timing spread", 0: "time within the noise", 1: "slower", -1: "faster"}[order]
        if order in (1, -1):
            time = f"{number(row['step_time_s'] / base['step_time_s'])}x the time ({time})"
        parts.append(f"{int(row['chunks'])} chunks {mib(row['peak_memory_bytes'], '.3g')} "
                     f"({number(row['peak_ratio'])}x), {time}")
    same = frame["loss_diff"].max() < 1e-5 and frame["grad_diff"].max() < 1e-5
    verdict = "the same loss and gradients" if same else "DIFFERENT losses or gradients"
    return (f"One cross-entropy peaks at {mib(base['peak_memory_bytes'], '.3g')} for "
            f"{mib(base['logits_bytes'], '.3g')} of float32 logits; " + "; ".join(parts) +
            f"; {verdict} (loss {frame['loss_diff'].max():.1e} relative, gradients {frame['grad_diff'].max():.1e}).")

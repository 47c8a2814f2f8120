"""Section 4 of notebook 10, packing: the padding share of real text batched three ways (``pad``, ``pad_max``,
``pack``) and what it does to tokens/s and real tokens/s; then the packing pitfall caught live: a packed row through
the model with and without a cache, against each document run alone."""

from __future__ import annotations

import pandas as pd
import torch

from ... import measure, text
from ...choices import PACKINGS
from ...display import number
from ...errors import ConfigError
from ...messages import worded
from ...models.language import build_llama
from ...results import cached_frame
from ...techniques.token_loss import token_loss_sum
from ...train import fit
from .throughput import lm_config


def packing_runs(packings=PACKINGS, rounds: int = 2, seq_len: int = 128, batch_size: int = 4,
                 progress: bool = False, refresh: bool = False, **fields) -> pd.DataFrame:
    """Each packing run ``rounds`` times, interleaved (each round in a rotated order), the timed steps pooled (cached).

    Args:
        packings: from `labkit.text.PACKINGS`. rounds: runs of each. seq_len, batch_size: tokens per row, rows.
        progress: show the runs' progress bars. refresh: measure again. fields: other `RunConfig` fields
        (`throughput.lm_config`'s).

    Returns:
        One row per packing: ``pad_fraction``, ``tokens_per_s``, ``real_tokens_per_s``, ``step_time_s`` with
        ``_p10_s``/``_p90_s``, and ``time_per_real_token_p10_s``/``_p90_s`` (the spread over a mean step's real tokens).

    Example:
        >>> packing_runs()[["packing", "pad_fraction", "real_tokens_per_s"]]
    """
    packings = list(packings)
    if not packings or rounds < 1:
        raise ConfigError("packings", packings, "at least one packing, with rounds >= 1")
    cfgs = {packing: lm_config(seq_len, batch_size, "sdpa", packing=packing, **fields) for packing in packings}
    return cached_frame("lm-packing", cfgs.values(), lambda: _packing_frame(cfgs, rounds, progress), refresh=refresh,
                        rounds=rounds)


def _packing_frame(cfgs: dict, rounds: int, progress: bool) -> pd.DataFrame:
    packings = list(cfgs)
    pooled = {p: {"times": [], "tokens": 0.0, "real": 0.0} for p in packings}
    for round_ in range(rounds):
        for packing in packings[round_ % len(packings):] + packings[:round_ % len(packings)]:
            res = fit(cfgs[packing], progress=progress)
            total_s = sum(res.step_times_s)
            pool = pooled[packing]
            pool["times"] += res.step_times_s
            pool["tokens"] += res.tokens_per_s * total_s
            pool["real"] += res.real_tokens_per_s * total_s
    rows = []
    for packing, pool in pooled.items():
        median, p10, p90 = measure.spread(pool["times"])
        real_per_step = pool["real"] / len(pool["times"])
        total_s = sum(pool["times"])
        rows.append({"packing": packing, "pad_fraction": 1 - pool["real"] / pool["tokens"],
                     "tokens_per_s": pool["tokens"] / total_s, "real_tokens_per_s": pool["real"] / total_s,
                     "step_time_s": median, "step_time_p10_s": p10, "step_time_p90_s": p90,
                     "time_per_real_token_p10_s": p10 / real_per_step,
                     "time_per_real_token_p90_s": p90 / real_per_step})
    return pd.DataFrame(rows)


@worded
def packing_finding(frame: pd.DataFrame) -> str:
    """Each packing's padding share, and its real tokens/s against the first's, called faster or slower only outside
    both spreads of time per real token."""
    base = frame.iloc[0]
    parts = []
    for _, row in frame.iterrows():
        part = f"{row['packing']} {number(100 * row['pad_fraction'])} % padding"
        if row["packing"] != base["packing"]:
            order = measure.separated((row["time_per_real_token_p10_s"], row["time_per_real_token_p90_s"]),
                                      (base["time_per_real_token_p10_s"], base["time_per_real_token_p90_s"]))
            verdict = {None: "no spread measured", 0: "within the noise", 1: "slower", -1: "faster"}[order]
            part += f", {number(row['real_tokens_per_s'] / base['real_tokens_per_s'])}x the real tokens/s ({verdict})"
        parts.append(part)
    return f"Against {base['packing']}: " + "; ".join(parts) + "."


def cross_document_check(num_documents: int = 4, seq_len: int = 128, seed: int = 0) -> dict:
    """One packed row of short pydoc paragraphs through a random tiny_llama in train mode, with the cache off (what
    `TokenBatch.model_inputs` passes) and on (the default), against each paragraph run alone.

    Args:
        num_documents: paragraphs in the row. seq_len: its width. seed: the weights and which paragraphs.

    Returns:
        A dict: ``documents``, ``max_logit_diff_cache_off`` and ``_cache_on`` (max |packed - alone| over the real
        tokens), ``packed_loss`` (cache off) and ``separate_loss`` (the token loss over the same label tokens).

    Example:
        >>> cross_document_check()["max_logit_diff_cache_on"] > 1e-3
        True
    """
    data = text.load_text_splits("pydoc_text", 256, 1, 1, seq_len=seq_len, seed=seed)["train"]
    short = [i for i, n in enumerate(data.lengths().tolist()) if 4 <= n <= seq_len // num_documents]
    if len(short) < num_documents:
        raise ConfigError("num_documents", num_documents, f"fewer: only {len(short)} paragraphs fit {seq_len} tokens")
    batch = text.collate([data[i] for i in short[:num_documents]], packing="pack", seq_len=seq_len)
    if batch.input_ids.shape[0] != 1:
        raise ConfigError("seq_len", seq_len, f"wide enough for {num_documents} paragraphs in one row")
    torch.manual_seed(seed)
    model = build_llama("tiny_llama", data.tokenizer.vocab_size).train()  # train mode, as in a training step
    diffs, losses, label_tokens = {}, [], int((batch.labels != text.IGNORE_INDEX).sum())
    with torch.no_grad():
        packed = {cache: model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=cache).logits[0]
                  for cache in (False, True)}
        for doc in range(num_documents):
            where = (batch.document_ids[0] == doc).nonzero().flatten()
            alone = model(input_ids=batch.input_ids[:, where], use_cache=False).logits
            losses.append(token_loss_sum(alone, batch.labels[:, where]))
            for cache, logits in packed.items():
                diff = float((logits[where] - alone[0]).abs().max())
                diffs[cache] = max(diffs.get(cache, 0.0), diff)
        packed_loss = float(token_loss_sum(packed[False][None], batch.labels)) / label_tokens
    return {"documents": num_documents, "max_logit_diff_cache_off": diffs[False],
            "max_logit_diff_cache_on": diffs[True], "packed_loss": packed_loss,
            "separate_loss": float(sum(losses)) / label_tokens}


@worded
def cross_document_finding(check: dict) -> str:
    """Whether the packed row's documents stayed apart, cache off and cache on, by their logits against each alone."""
    def kept(diff):
        return "kept apart" if diff < 1e-4 else "ATTENDING ACROSS"

    off, on = check["max_logit_diff_cache_off"], check["max_logit_diff_cache_on"]
    return (f"{check['documents']} paragraphs packed in one row: cache off, documents {kept(off)} (logits within "
            f"{number(off)} of each run alone, loss {number(check['packed_loss'])} against "
            f"{number(check['separate_loss'])}); cache on, {kept(on)} (logits up to {number(on)} off).")

"""Section 4 of notebook 10: padding against packing on real text, and the packed documents kept apart only without
a cache."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ... import measure, text
from ...choices import PACKINGS
from ...config import RunConfig
from ...display import number
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...results import cached_frame
from ...runsetup import set_up
from ...techniques.token_loss import token_loss_sum
from ...train import fit
from .common import Record
from .throughput import lm_config


@dataclass
class PackingRuns(LabResult):
    """One row per packing: padding share, tokens/s, real tokens/s, step time and time per real token's spread."""

    shown = ("packing", "pad_fraction", "tokens_per_s", "real_tokens_per_s", "step_time_s")

    @worded
    def finding(self) -> str:
        base, parts = self.frame.iloc[0], []
        for _, row in self.frame.iterrows():
            part = f"{row['packing']} {number(100 * row['pad_fraction'])} % padding"
            if row["packing"] != base["packing"]:
                c = compare(*(Measured.row(r, "time_per_real_token_s") for r in (row, base)),
                            words=("faster", "slower"))
                part += f", {number(row['real_tokens_per_s'] / base['real_tokens_per_s'])}x the real tokens/s " \
                        f"({c.verdict})"
            parts.append(part)
        return f"Against {base['packing']}: " + "; ".join(parts) + "."


def packing_runs(packings=PACKINGS, rounds: int = 2, seq_len: int = 128, batch_size: int = 4,
                 progress: bool = False, refresh: bool = False, **fields) -> PackingRuns:
    """Each packing run ``rounds`` times, interleaved in rotated order, the timed steps pooled (cached);
    ``fields``: other `lm_config` fields."""
    packings = list(packings)
    if not packings or rounds < 1:
        raise ConfigError("packings", packings, "at least one packing, with rounds >= 1")
    cfgs = {packing: lm_config(seq_len, batch_size, "sdpa", packing=packing, **fields) for packing in packings}
    return PackingRuns(cached_frame("lm-packing", cfgs.values(), lambda: _packing_frame(cfgs, rounds, progress),
                                    refresh=refresh, rounds=rounds))


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
                     "time_per_real_token_s": total_s / pool["real"],
                     "time_per_real_token_p10_s": p10 / real_per_step,
                     "time_per_real_token_p90_s": p90 / real_per_step})
    return pd.DataFrame(rows)


@dataclass
class CrossDocument(Record):
    """A packed row's largest logit difference from each document run alone, cache off and on, and its losses."""

    shown = ("documents", "max_logit_diff_cache_off", "max_logit_diff_cache_on", "packed_loss", "separate_loss")

    @worded
    def finding(self) -> str:
        def kept(diff):
            return "kept apart" if diff < 1e-4 else "ATTENDING ACROSS"

        c = self.row
        off, on = c["max_logit_diff_cache_off"], c["max_logit_diff_cache_on"]
        return (f"{int(c['documents'])} paragraphs packed in one row: cache off, documents {kept(off)} (logits within "
                f"{number(off)} of each run alone, loss {number(c['packed_loss'])} against "
                f"{number(c['separate_loss'])}); cache on, {kept(on)} (logits up to {number(on)} off).")


def cross_document_check(num_documents: int = 4, seq_len: int = 128, seed: int = 0) -> CrossDocument:
    """One packed row of short pydoc paragraphs through a random tiny_llama in train mode, cache off (as
    `TokenBatch.model_inputs` passes) and on (the default), against each paragraph run alone."""
    run = set_up(RunConfig(model="tiny_llama", dataset="pydoc_text", seq_len=seq_len, train_size=256, pretrained=False,
                           precision="fp32", seed=seed, device="cpu"), training=False)
    data = run.train
    short = [i for i, n in enumerate(data.lengths().tolist()) if 4 <= n <= seq_len // num_documents]
    if len(short) < num_documents:
        raise ConfigError("num_documents", num_documents, f"fewer: only {len(short)} paragraphs fit {seq_len} tokens")
    batch = text.collate([data[i] for i in short[:num_documents]], packing="pack", seq_len=seq_len)
    if batch.input_ids.shape[0] != 1:
        raise ConfigError("seq_len", seq_len, f"wide enough for {num_documents} paragraphs in one row")
    model = run.model.train()  # the loop's seeded random tiny_llama, in train mode as in a training step
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
    return CrossDocument.of({"documents": num_documents, "max_logit_diff_cache_off": diffs[False],
                             "max_logit_diff_cache_on": diffs[True], "packed_loss": packed_loss,
                             "separate_loss": float(sum(losses)) / label_tokens})

"""The audit of a learner's data before any training: what their tokenizer makes of it and what the loss is on.

Each check is one row (``check``, ``value``, ``status``: ``ok``, ``warning`` or ``fault``, ``detail``). Faults are what
silently wastes a run: no token trained (the loss falls and the model learns nothing), EOS never trained (the model
never stops; a collator that masks the pad id does this where pad equals EOS), more than `TRUNCATED_FAULT` of the
examples cut at ``seq_len``, a chat template without ``{% generation %}`` marks while the loss is on the assistant
(TRL's ``assistant_only_loss`` then trains on nothing; labkit finds the turns itself), and packed documents that
attend to each other on this model and library versions (`packing_leak`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..labresult import LabResult
from ..messages import worded
from ..text import IGNORE_INDEX, collate

TRUNCATED_FAULT = 0.10  # more examples cut than this is a fault: seq_len is below the data's p90
LEAK_TOLERANCE = 1e-4  # a packed document's logits further than this from the document run alone: a leak
LENGTH_QUANTILES = {"p50": 50, "p90": 90, "p99": 99}


@dataclass
class Audit(LabResult):
    """The audit's checks, one row each; ``lengths`` (each example's tokens, before truncation), ``trained`` (each
    example's trained tokens), ``example`` (one decoded with its trained tokens marked) and ``longest`` (its index)."""

    shown = ("check", "value", "status", "detail")
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int), kw_only=True)
    example: str = field(default="", kw_only=True)
    longest: int = field(default=0, kw_only=True)

    @property
    def faults(self) -> list[str]:
        return self.frame.loc[self.frame["status"] == "fault", "check"].tolist()

    @property
    def warnings(self) -> list[str]:
        return self.frame.loc[self.frame["status"] == "warning", "check"].tolist()

    def length(self, which: str) -> int:
        """``p50``, ``p90``, ``p99`` or ``max`` of the examples' token lengths."""
        if which == "max":
            return int(self.lengths.max())
        return int(np.ceil(np.percentile(self.lengths, LENGTH_QUANTILES[which])))

    @worded
    def finding(self) -> str:
        lengths = ", ".join(f"{k} {self.length(k)}" for k in (*LENGTH_QUANTILES, "max"))
        head = f"{len(self.lengths)} examples, tokens {lengths}."
        if self.faults:
            rows = self.frame.set_index("check")
            return head + " FAULTS: " + "; ".join(f"{c}: {rows.loc[c, 'detail']}" for c in self.faults) + "."
        warned = f" Warnings: {', '.join(self.warnings)}." if self.warnings else ""
        return head + " No fault found." + warned


def _row(check: str, value, status: str, detail: str) -> dict:
    return {"check": check, "value": value, "status": status, "detail": detail}


def pad_share(lengths: np.ndarray, batch_size: int, seed: int = 0) -> float:
    """The share of padding when ``lengths`` are batched ``batch_size`` rows at a time in a seeded random order and
    padded to each batch's longest row (``packing="pad"``)."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    padded = real = 0
    for start in range(0, len(order) - batch_size + 1, batch_size):
        rows = lengths[order[start:start + batch_size]]
        padded, real = padded + rows.max() * len(rows), real + rows.sum()
    return 1 - real / padded if padded else 0.0


def marked_text(tokenizer, ids, labels, limit: int = 600) -> str:
    """``ids`` decoded with the trained tokens (labels not -100) between ``[[`` and ``]]``, as a learner checks it."""
    pieces, run, trained = [], [], None
    for token, label in zip(ids, labels, strict=True):
        on = label != IGNORE_INDEX
        if trained is not None and on != trained:
            pieces.append((trained, run))
            run = []
        run.append(int(token))
        trained = on
    pieces.append((trained, run))
    text = "".join(f"[[{tokenizer.decode(r, skip_special_tokens=False)}]]" if on else
                   tokenizer.decode(r, skip_special_tokens=False) for on, r in pieces if r)
    return text if len(text) <= limit else text[:limit] + " ..."


def audit_examples(examples, tokenizer, seq_len: int, batch_size: int, loss_on: str, template: str | None = None,
                   eos_expected: bool = True) -> Audit:
    """Audit encoded examples (``[(ids, labels), ...]``, before truncation) as a run at ``seq_len`` and
    ``batch_size`` would train them (see the module).

    Args:
        examples: each example's token ids and labels (-100: no loss). tokenizer: labkit's interface (``decode``,
            ``eos_id``, ``pad_id``; ``backend`` for a transformers one). seq_len: the most tokens a row keeps.
        batch_size: rows per step (the pad share). loss_on: where the loss is. template: how chat turns were
            marked (`labkit.text.own_data`'s words; None: not chat data). eos_expected: the examples end with what
            is trained, so EOS should be trained.

    Example:
        >>> audit_examples([([5, 6, 2], [-100, 6, 2])], tok, seq_len=512, batch_size=1, loss_on="completion").faults
        []
    """
    lengths = np.array([len(ids) for ids, _ in examples])
    kept = [(ids[:seq_len], labels[:seq_len]) for ids, labels in examples]
    trained = np.array([sum(label != IGNORE_INDEX for label in labels) for _, labels in kept])
    tokens = int(np.minimum(lengths, seq_len).sum())
    rows = []
    quantiles = {k: int(np.ceil(np.percentile(lengths, q))) for k, q in LENGTH_QUANTILES.items()}
    rows.append(_row("token lengths", ", ".join(f"{k} {v}" for k, v in {**quantiles, "max": lengths.max()}.items()),
                     "ok", f"{len(examples)} examples, {int(lengths.sum())} tokens before truncation"))
    cut = float((lengths > seq_len).mean())
    rows.append(_row("truncated", f"{cut:.1%}", "fault" if cut > TRUNCATED_FAULT else "warning" if cut else "ok",
                     f"{int((lengths > seq_len).sum())} examples longer than seq_len={seq_len}"
                     + (f": raise seq_len to the p99 ({quantiles['p99']}) or shorten them" if cut else "")))
    pad = pad_share(np.minimum(lengths, seq_len), batch_size)
    rows.append(_row("padding", f"{pad:.1%}", "ok", f"of the tokens at batch {batch_size}, padded to each "
                     "batch's longest (packing='pad'); packing removes it"))
    share = trained.sum() / tokens if tokens else 0.0
    empty = int((trained == 0).sum())
    rows.append(_row("supervised", f"{share:.1%}", "fault" if share == 0 else "warning" if empty else "ok",
                     "no token is trained: the loss would fall while the model learns nothing" if share == 0 else
                     f"of the tokens carry a loss (loss_on={loss_on!r})"
                     + (f"; {empty} examples have none and would be dropped" if empty else "")))
    ends = [labels[-1] == tokenizer.eos_id for ids, labels in kept if len(ids) and ids[-1] == tokenizer.eos_id]
    eos = float(np.mean(ends)) if ends else 0.0
    whole = sum(len(ids) <= seq_len for ids, _ in examples)
    rows.append(_row("EOS trained", f"{eos:.0%}", "fault" if eos_expected and whole and eos == 0 else "ok",
                     "EOS is in no example's labels: the model would never learn to stop (a collator that masks the "
                     "pad id does this where pad equals EOS)" if eos_expected and whole and eos == 0 else
                     "of the examples ending in EOS train it" + (
                         "; pad equals EOS here, and labkit masks padding by position, never by id"
                         if getattr(tokenizer.backend, "pad_token_id", None) == tokenizer.eos_id else "")))
    if template is not None:
        unmarked = loss_on == "assistant" and "found by labkit" in template
        rows.append(_row("chat template", "no generation marks" if unmarked else "ok",
                         "warning" if unmarked else "ok",
                         "TRL's assistant_only_loss would train on nothing with this template; labkit found the "
                         "assistant turns itself" if unmarked else template))
    longest = int(lengths.argmax())
    rows.append(_row("longest example", int(lengths[longest]), "ok", f"example {longest}: measure() trains a batch "
                     "as long as it first, so an out-of-memory shows at step 1, not step 100"))
    ids, labels = kept[int(np.argmax(trained > 0))] if trained.any() else kept[0]
    return Audit(pd.DataFrame(rows), lengths=lengths, example=marked_text(tokenizer, ids, labels), longest=longest)


@torch.no_grad()
def packing_leak(model: torch.nn.Module, examples, seq_len: int) -> float:
    """The largest logit difference between documents packed in one row (labkit's ``pack``: restarting position ids,
    no cache) and each run alone, on ``model`` as this transformers version runs it (0: no leak).

    Example:
        >>> packing_leak(shrunk_copy, [([1, 5, 2], [-100, 5, 2]), ([1, 7, 2], [-100, 7, 2])], 64) < LEAK_TOLERANCE
        True
    """
    docs = [{"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)} for ids, labels in examples]
    batch = collate(docs, packing="pack", seq_len=seq_len)
    was = model.training
    model.eval()
    try:
        packed = model(**batch.model_inputs()).logits
        worst = 0.0
        for row in range(batch.input_ids.shape[0]):
            for doc in batch.document_ids[row].unique().tolist():
                if doc < 0:
                    continue
                where = (batch.document_ids[row] == doc).nonzero().flatten()
                alone = model(input_ids=batch.input_ids[row:row + 1, where], use_cache=False).logits[0]
                worst = max(worst, float((packed[row, where] - alone).abs().max()))
        return worst
    finally:
        model.train(was)

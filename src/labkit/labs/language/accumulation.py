"""Section 5 of notebook 10, the gradient-accumulation bug: does 4 micro-batches of 2 rows give the gradient of one
batch of 8? With the old rule (each micro-batch's MEAN token loss / grad_accum) not when the micro-batches hold
different numbers of label tokens; with labkit's (each micro-batch's SUMMED token loss / the step's label tokens,
`labkit.techniques.token_loss`) exactly, and a run's losses stop depending on ``grad_accum``."""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F

from ... import text
from ...display import number
from ...errors import ConfigError
from ...messages import worded
from ...models.language import build_llama
from ...techniques.token_loss import forward_inputs, micro_batch_loss, split_rows, token_loss_sum

RULES = {"old": "mean / grad_accum", "labkit": "sum / step tokens"}


def _old_micro_loss(model, micro: text.TokenBatch, grad_accum: int) -> torch.Tensor:
    """The old loop's rule: this micro-batch's mean token loss over its own label tokens, / grad_accum."""
    logits = model(**forward_inputs(micro)).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), micro.labels[:, 1:].flatten(),
                           ignore_index=text.IGNORE_INDEX) / grad_accum


def _backward(model, batch: text.TokenBatch, rule: str, grad_accum: int) -> None:
    """One step's backward passes over ``grad_accum`` micro-batches of ``batch`` with ``rule`` (`RULES`)."""
    micro_batches = split_rows(batch, grad_accum)
    step_tokens = sum(micro.counts().label_tokens for micro in micro_batches)
    for micro in micro_batches:
        loss = _old_micro_loss(model, micro, grad_accum) if rule == "old" else \
            micro_batch_loss(model, micro, step_tokens)
        loss.backward()


def _gradient(model) -> torch.Tensor:
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return grads


def _digits(rows: int, seed: int) -> tuple[text.TokenData, int]:
    train = text.load_text_splits("digits_sort", max(64, rows), 1, 1, seq_len=32, seed=seed)["train"]
    return train, train.tokenizer.vocab_size


def accumulation_gradients(rows: int = 8, grad_accum: int = 4, seed: int = 0, accumulate=None) -> dict:
    """The gradient of one batch of ``rows`` digits_sort examples against ``grad_accum`` micro-batches of it, each rule.

    The rows are sorted shortest first, so each micro-batch holds more answer tokens than the one before.

    Args:
        rows: examples in the batch. grad_accum: micro-batches (a divisor of ``rows``). seed: data and weights.
        accumulate: a learner's ``accumulate(model, micro_batches)`` (backward passes only), checked as a third rule.

    Returns:
        A dict: ``label_tokens`` (per micro-batch), ``old_error`` and ``labkit_error`` (each rule's accumulated
        gradient's relative error ``|g - g_batch| / |g_batch|``), ``yours_error`` with ``accumulate``, ``grad_accum``,
        ``rows``.

    Example:
        >>> accumulation_gradients()["old_error"] > 0.05
        True
    """
    if rows % grad_accum:
        raise ConfigError("grad_accum", grad_accum, f"a divisor of rows={rows} (micro-batches of equal rows)")
    train, vocab_size = _digits(rows, seed)
    batch = text.collate(sorted((train[i] for i in range(rows)), key=lambda e: len(e["input_ids"])))
    torch.manual_seed(seed)
    model = build_llama("tiny_llama", vocab_size)
    token_loss_sum(model(**forward_inputs(batch)).logits, batch.labels).div(batch.counts().label_tokens).backward()
    whole = _gradient(model)
    errors = {}
    for rule in RULES:
        _backward(model, batch, rule, grad_accum)
        errors[f"{rule}_error"] = float((_gradient(model) - whole).norm() / whole.norm())
    if accumulate is not None:
        accumulate(model, split_rows(batch, grad_accum))
        errors["yours_error"] = float((_gradient(model) - whole).norm() / whole.norm())
    return {"rows": rows, "grad_accum": grad_accum,
            "label_tokens": [m.counts().label_tokens for m in split_rows(batch, grad_accum)], **errors}


def accumulation_losses(grad_accums=(1, 4), steps: int = 6, rows: int = 8, lr: float = 3e-3,
                        seed: int = 0) -> pd.DataFrame:
    """Train the same model on the same batches once per rule and ``grad_accum``: the training loss at every step.

    Args:
        grad_accums: micro-batches per step to compare (the first is the reference). steps: optimizer steps (AdamW).
        rows: rows per step. lr: AdamW's learning rate. seed: data, order and weights.

    Returns:
        A long frame: ``rule`` (`RULES`' keys), ``grad_accum``, ``step``, ``loss`` (the step's mean token loss, before
        its update) and ``loss_change`` (against the same rule's run at ``grad_accums[0]``, same step).

    Example:
        >>> accumulation_losses().groupby(["rule", "grad_accum"])["loss_change"].max()
    """
    train, vocab_size = _digits(rows * steps, seed)
    loader = text.make_token_loader(train, rows, packing="pad", shuffle=True, seed=seed, drop_last=True)
    batches = [b for _, b in zip(range(steps), loader, strict=False)]
    torch.manual_seed(seed)
    start = build_llama("tiny_llama", vocab_size).state_dict()
    records = []
    for rule in RULES:
        for grad_accum in grad_accums:
            model = build_llama("tiny_llama", vocab_size)
            model.load_state_dict(start)
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
            for step, batch in enumerate(batches):
                with torch.no_grad():
                    loss = micro_batch_loss(model, batch, batch.counts().label_tokens)
                _backward(model, batch, rule, grad_accum)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                records.append({"rule": rule, "grad_accum": grad_accum, "step": step, "loss": float(loss)})
    frame = pd.DataFrame(records)
    reference = frame[frame["grad_accum"] == grad_accums[0]].set_index(["rule", "step"])["loss"]
    keys = list(zip(frame["rule"], frame["step"], strict=True))
    frame["loss_change"] = (frame["loss"] - reference.loc[keys].to_numpy()).abs()
    return frame


@worded
def accumulation_finding(grads: dict, losses: pd.DataFrame | None = None) -> str:
    """Does 4 x 2 equal 8? Each rule's gradient error and, given `accumulation_losses`, how far its losses move."""
    k, micro = grads["grad_accum"], grads["rows"] // grads["grad_accum"]
    old, new = grads["old_error"], grads["labkit_error"]
    verdict = "only with labkit's rule" if new < 1e-4 <= old else ("with both rules" if old < 1e-4 else "with neither")
    text = (f"Does {k} x {micro} equal {grads['rows']}? {verdict.capitalize()}: micro-batches of "
            f"{', '.join(map(str, grads['label_tokens']))} label tokens; the old rule's gradient is "
            f"{number(100 * old)} % off the whole batch's, labkit's {new:.1e} (float rounding).")
    if losses is not None:
        most = losses.groupby("rule")["loss_change"].max()
        text += (f" Changing only grad_accum moves the old rule's losses by up to {most['old']:.2g} and labkit's by "
                 f"{most['labkit']:.1g} over {losses['step'].nunique()} steps.")
    return text

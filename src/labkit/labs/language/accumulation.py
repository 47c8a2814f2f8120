"""Section 5 of notebook 10: gradient accumulation with the old rule (each micro-batch's mean token loss /
grad_accum) against labkit's (summed token losses / the step's label tokens, `labkit.techniques.token_loss`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from ... import text
from ...config import RunConfig
from ...display import number
from ...errors import ConfigError
from ...labresult import LabResult
from ...messages import worded
from ...runsetup import Setup, set_up
from ...techniques.token_loss import forward_inputs, micro_batch_loss, split_rows, token_loss_sum

RULES = {"old": "mean / grad_accum", "labkit": "sum / step tokens"}


def _backward(model, batch: text.TokenBatch, rule: str, grad_accum: int) -> None:
    micro_batches = split_rows(batch, grad_accum)
    step_tokens = sum(micro.counts().label_tokens for micro in micro_batches)
    for micro in micro_batches:
        if rule == "old":  # this micro-batch's mean token loss over its own label tokens, / grad_accum
            logits = model(**forward_inputs(micro)).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), micro.labels[:, 1:].flatten(),
                                   ignore_index=text.IGNORE_INDEX) / grad_accum
        else:
            loss = micro_batch_loss(model, micro, step_tokens)
        loss.backward()


def _gradient(model) -> torch.Tensor:
    grads = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return grads


def _digits(rows: int, seed: int) -> Setup:
    """The loop's set-up of a random tiny_llama (seeded by ``seed``) on digits_sort, on the CPU in fp32: only the
    grouping of the rows differs between the rules."""
    cfg = RunConfig(model="tiny_llama", dataset="digits_sort", seq_len=32, train_size=max(64, rows), pretrained=False,
                    precision="fp32", seed=seed, device="cpu")
    return set_up(cfg, training=False)


def gradient_errors(rows: int, grad_accum: int, seed: int, accumulate) -> tuple[dict, list[int]]:
    """Each rule's accumulated gradient's relative error against one batch's; the rows sorted shortest first, so
    each micro-batch holds more label tokens than the one before."""
    if rows % grad_accum:
        raise ConfigError("grad_accum", grad_accum, f"a divisor of rows={rows} (micro-batches of equal rows)")
    run = _digits(rows, seed)
    batch = text.collate(sorted((run.train[i] for i in range(rows)), key=lambda e: len(e["input_ids"])))
    model = run.model
    token_loss_sum(model(**forward_inputs(batch)).logits, batch.labels).div(batch.counts().label_tokens).backward()
    whole = _gradient(model)
    errors = {}
    for rule in [*RULES, "yours"] if accumulate else RULES:
        if rule == "yours":
            accumulate(model, split_rows(batch, grad_accum))
        else:
            _backward(model, batch, rule, grad_accum)
        errors[rule] = float((_gradient(model) - whole).norm() / whole.norm())
    return errors, [m.counts().label_tokens for m in split_rows(batch, grad_accum)]


def accumulation_losses(grad_accums=(1, 4), steps: int = 6, rows: int = 8, lr: float = 3e-3,
                        seed: int = 0) -> pd.DataFrame:
    """The same model trained on the same batches once per rule and ``grad_accum``: each step's loss, and
    ``loss_change`` against the same rule's run at ``grad_accums[0]``."""
    run = _digits(rows * steps, seed)
    loader = text.make_token_loader(run.train, rows, packing="pad", shuffle=True, seed=seed, drop_last=True)
    batches = [b for _, b in zip(range(steps), loader, strict=False)]
    records = []
    for rule in RULES:
        for grad_accum in grad_accums:
            model = copy.deepcopy(run.model)  # every run starts from the same weights
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


@dataclass
class Accumulation(LabResult):
    """Each rule's gradient error against one batch and how far changing only ``grad_accum`` moves its losses."""

    shown = ("rule", "divides", "gradient_error", "loss_change")
    rows: int = 8
    grad_accum: int = 4
    label_tokens: list = field(default_factory=list)
    losses: pd.DataFrame | None = None

    def error(self, rule: str) -> float:
        return float(self.frame.set_index("rule").loc[rule, "gradient_error"])

    @worded
    def finding(self) -> str:
        k, micro = self.grad_accum, self.rows // self.grad_accum
        old, new = self.error("old"), self.error("labkit")
        verdict = "only with labkit's rule" if new < 1e-4 <= old else ("with both rules" if old < 1e-4 else
                                                                       "with neither")
        most = self.frame.set_index("rule")["loss_change"]
        return (f"Does {k} x {micro} equal {self.rows}? {verdict.capitalize()}: micro-batches of "
                f"{', '.join(map(str, self.label_tokens))} label tokens; the old rule's gradient is "
                f"{number(100 * old)} % off the whole batch's, labkit's {new:.1e} (float rounding). Changing only "
                f"grad_accum moves the old rule's losses by up to {most['old']:.2g} and labkit's by "
                f"{most['labkit']:.1g} over {self.losses['step'].nunique()} steps.")


def accumulation_rules(rows: int = 8, grad_accum: int = 4, seed: int = 0, accumulate=None, grad_accums=(1, 4),
                       steps: int = 6) -> Accumulation:
    """Does ``grad_accum`` micro-batches of ``rows`` digits_sort rows give one batch's gradient, with each rule (and
    a learner's ``accumulate(model, micro_batches)``)? And `accumulation_losses` over ``steps``."""
    errors, label_tokens = gradient_errors(rows, grad_accum, seed, accumulate)
    losses = accumulation_losses(grad_accums, steps, rows, seed=seed)
    most = losses.groupby("rule")["loss_change"].max()
    frame = pd.DataFrame([{"rule": rule, "divides": RULES.get(rule, "your accumulate"), "gradient_error": error,
                           "loss_change": most.get(rule)} for rule, error in errors.items()])
    return Accumulation(frame, rows=rows, grad_accum=grad_accum, label_tokens=label_tokens, losses=losses)

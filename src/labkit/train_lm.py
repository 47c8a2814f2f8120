"""The language-model part of the one training loop (`labkit.train`): what a language model's run does that a
vision run does not, each step delegated to its technique.

- `prepare_language_model`: per-decoder-layer checkpointing (`techniques.layer_checkpointing`), then compiling the
  decoder layers once the model is on its device (`techniques.compiling`), with a loud fallback where this machine
  cannot compile;
- `accumulate_tokens`: one step's micro-batches, each loss the summed token loss over the step's total label tokens
  (`techniques.token_loss`), optionally the output layer and loss in slices (`techniques.chunked_loss`);
- `step_flops_extra`: the attention FLOPs torch's FLOP counter misses on a CPU;
- `text_splits`: the dataset's splits, tokenized by a hub model's own tokenizer where its weights need it.
"""

from __future__ import annotations

import functools

import torch

from . import models, text
from .config import RunConfig
from .messages import note
from .techniques.chunked_loss import chunked_loss_sum
from .techniques.compiling import compile_decoder, compile_problem
from .techniques.layer_checkpointing import checkpoint_decoder_layers
from .techniques.precision import autocast
from .techniques.token_loss import forward_inputs, micro_batch_loss, split_rows


def checkpoint_layers(model: torch.nn.Module, cfg: RunConfig) -> None:
    """``cfg.checkpointing=True`` on a language model: every decoder layer checkpointed (transformers' method)."""
    if cfg.checkpointing is True:
        checkpoint_decoder_layers(models.unwrap(model))


def compile_layers(model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> str | None:
    """``cfg.compile``: compile the decoder layers (after the model is on ``device``). Returns a warning, or None.

    Where this machine cannot compile (`compile_problem`: no C++ compiler on a CPU, no Triton on a GPU) the run goes
    on uncompiled and says so loudly, in a note and in ``RunResult.warnings``.
    """
    if not cfg.compile:
        return None
    problem = compile_problem(device)
    if problem is not None:
        warning = (f"NOT COMPILED: {problem}, so this run trains the model uncompiled (compile=True had no effect; "
                   "compile_time_s stays None)")
        note(warning)
        return warning
    compile_decoder(models.unwrap(model))
    return None


def token_micro_loss(model: torch.nn.Module, micro: text.TokenBatch, step_tokens: int,
                     loss_chunks: int | None) -> torch.Tensor:
    """One micro-batch's summed token loss over the step's label tokens; with ``loss_chunks`` the output layer and
    the loss run a slice of the sequence at a time, so the whole batch's logits never exist at once."""
    if loss_chunks is None:
        return micro_batch_loss(model, micro, step_tokens)
    lm = models.unwrap(model)
    hidden = lm.model(**forward_inputs(micro)).last_hidden_state
    return chunked_loss_sum(hidden, lm.lm_head, micro.labels, loss_chunks) / max(step_tokens, 1)


def accumulate_tokens(model: torch.nn.Module, batch: text.TokenBatch, cfg: RunConfig, precision, device,
                      scaler, new_micro_batch) -> torch.Tensor:
    """The backward passes of one step's ``cfg.grad_accum`` micro-batches of ``batch``; returns the step's loss.

    Args:
        model, batch: the language model and one step's `labkit.text.TokenBatch` (any device).
        cfg: the run (``grad_accum``, ``loss_chunks``).
        precision, device, scaler: the run's resolved precision, device and gradient scaler.
        new_micro_batch: called before each micro-batch after the first (the memory tracker's marker).
    """
    # counted where the loader made the batch (the host), before it moves: a count read back from the GPU would make
    # every timed step wait for the GPU to finish the steps queued before it
    step_tokens = int((batch.labels != text.IGNORE_INDEX).sum())
    micro_batches = split_rows(batch.to(device, non_blocking=True), cfg.grad_accum)
    step_loss = torch.zeros((), device=device)
    for index, micro in enumerate(micro_batches):
        if index:
            new_micro_batch()
        with autocast(precision, device):
            loss = token_micro_loss(model, micro, step_tokens, cfg.loss_chunks)
        scaler.scale(loss).backward()
        step_loss += loss.detach().float()
    return step_loss


def step_flops_extra(model: torch.nn.Module, batch: text.TokenBatch, device) -> int:
    """FLOPs of one training step on ``batch`` that torch's FLOP counter misses (the CPU SDPA kernel's)."""
    return models.uncounted_attention_flops(models.unwrap(model), *batch.input_ids.shape, device)


@functools.lru_cache(maxsize=4)
def text_splits(name: str, train_size: int, val_size: int, test_size: int, seq_len: int,
                 hub_model: str | None = None) -> dict:
    """A language-model dataset's splits, loaded once per session and size; for a hub model (``hub_model``, when its
    pretrained weights are asked for) every dataset (the digit tasks and pydoc_text) is tokenized by the model's own
    tokenizer, which its pretrained embeddings need. Offline, or when that download fails, labkit's own instead (the
    digits' characters, pydoc_text's BPE): the model then starts from random weights, and says so."""
    tokenizer = None
    if hub_model is not None:
        tokenizer, why = models.hub_tokenizer(hub_model)
        if tokenizer is None and models.is_online():
            own = "BPE" if name == "pydoc_text" else "character tokenizer"
            note(f"{name} is tokenized by labkit's {own}: {why}")
    return text.load_text_splits(name, train_size, val_size, test_size, seq_len, seed=0, tokenizer=tokenizer)

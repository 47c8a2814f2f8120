"""Causal language models on token batches: the language kind of the one loop (`labkit.kinds`), each of its steps
delegated to its technique.

- set-up: the splits tokenized by a hub model's own tokenizer where its weights need it (`text_splits`),
  per-decoder-layer checkpointing (`techniques.layer_checkpointing`), then compiling the decoder layers once the
  model is on its device (`techniques.compiling`), with a loud fallback where this machine cannot compile;
- the step: a micro-batch's summed token loss (`techniques.token_loss`), optionally the output layer and the loss in
  slices (`techniques.chunked_loss`); the loop divides it by the step's label tokens (`TokenBatch.loss_count`);
- the report: the attention FLOPs torch's FLOP counter misses on a CPU, the exact match or next-token accuracy.
"""

from __future__ import annotations

import functools

import torch

from .. import models, text
from ..config import RunConfig
from ..env import Profile
from ..errors import ConfigError
from ..evaluation import score_tokens
from ..fieldchecks import GIVEN, run_seq_len
from ..messages import note
from ..techniques.chunked_loss import chunked_loss_sum
from ..techniques.compiling import compile_decoder, compile_problem
from ..techniques.layer_checkpointing import checkpoint_decoder_layers
from ..techniques.token_loss import forward_inputs, token_loss_sum
from ..text.own_data import load_own_splits


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


def token_loss(model: torch.nn.Module, micro: text.TokenBatch, loss_chunks: int | None) -> torch.Tensor:
    """One micro-batch's SUMMED token loss; with ``loss_chunks`` the output layer and the loss run a slice of the
    sequence at a time, so the whole batch's logits never exist at once."""
    if loss_chunks is None:
        return token_loss_sum(model(**forward_inputs(micro)).logits, micro.labels)
    lm = models.unwrap(model)
    hidden = lm.base_model(**forward_inputs(micro)).last_hidden_state
    return chunked_loss_sum(hidden, lm.get_output_embeddings(), micro.labels, loss_chunks)


_TOKENIZERS: dict = {}  # tokenizers loaded this session, by model (a failure is not kept: it is retried)


def forget_tokenizers() -> None:
    """Load every model's tokenizer anew (a test that fakes one)."""
    _TOKENIZERS.clear()


def _hub_tokenizer(name: str, dataset: str):
    """A hub model's own tokenizer (None offline, said where it matters: online, when the download failed)."""
    if name not in _TOKENIZERS:
        tokenizer, why = models.hub_tokenizer(name)
        if tokenizer is None:
            if models.is_online():
                own = "BPE" if dataset == "pydoc_text" else "character tokenizer"
                note(f"{dataset} is tokenized by labkit's {own}: {why}")
            return None
        _TOKENIZERS[name] = tokenizer
    return _TOKENIZERS[name]


def _own_tokenizer(spec: str):
    """A learner's model's tokenizer; where there is none (an offline hub id), labkit's BPE, said loudly."""
    if spec not in _TOKENIZERS:
        tokenizer, why = models.own.own_tokenizer(spec)
        if tokenizer is None:
            note(f"NO TOKENIZER for {spec}: {why}. The data is tokenized by labkit's BPE (pydoc_bpe) instead, so "
                 "the model cannot start from its pretrained weights.")
            return None
        _TOKENIZERS[spec] = tokenizer
    return _TOKENIZERS[spec]


def softcapping_warning(model: torch.nn.Module, cfg: RunConfig) -> str | None:
    """Gemma 2 caps its logits (``final_logit_softcapping``) and its attention scores (``attn_logit_softcapping``).
    The chunked loss computes logits from the output layer itself, without the cap: refused. SDPA has no cap: said
    loudly, since the model then trains with attention it was not trained with (``eager`` applies it)."""
    config = getattr(models.unwrap(model), "config", None)
    if cfg.loss_chunks is not None and getattr(config, "final_logit_softcapping", None):
        raise ConfigError("loss_chunks", cfg.loss_chunks, f"None for {cfg.model}", "its config sets final_logit_"
                          f"softcapping={config.final_logit_softcapping}, which the chunked loss leaves out")
    if cfg.attn_implementation == "sdpa" and getattr(config, "attn_logit_softcapping", None):
        warning = (f"ATTENTION NOT CAPPED: {cfg.model}'s config sets attn_logit_softcapping="
                   f"{config.attn_logit_softcapping}, which PyTorch's SDPA kernel leaves out; set "
                   "attn_implementation='eager' to train it with the attention it was trained with")
        note(warning)
        return warning
    return None


@functools.lru_cache(maxsize=4)
def text_splits(name: str, train_size: int, val_size: int, test_size: int, seq_len: int, tokenizer=None) -> dict:
    """A labkit language-model dataset's splits, loaded once per session and size, tokenized by ``tokenizer`` (a
    model's own, which its pretrained embeddings need; None: labkit's own, the digits' characters, pydoc_text's
    BPE)."""
    return text.load_text_splits(name, train_size, val_size, test_size, seq_len, seed=0, tokenizer=tokenizer)


class LanguageKind:
    """A causal language model from `labkit.models.language_models()` on a dataset from `labkit.text.available()`."""

    name = "language"
    uneven_counts = True  # ranks' rows hold different numbers of label tokens: the loss divides by the job's sum

    def check_world(self, cfg: RunConfig, world_size: int, in_group: bool) -> None:
        if (world_size > 1 or in_group) and cfg.loss_chunks is not None:
            raise ConfigError("loss_chunks", cfg.loss_chunks, "None in a process group (DDP or FSDP2)",
                              "The chunked loss calls the decoder's body and its output layer apart, outside the "
                              "wrapped model's forward, where DDP prepares its gradient all-reduce and FSDP2 "
                              "gathers the output layer's weights")

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """Each decoder layer; the root's fully_shard takes the embeddings, the final norm and the output layer
        (tied to the embeddings or not, one unit)."""
        return list(models.decoder_layers(models.unwrap(model)))

    def __init__(self, data=None, tokenizer=None):
        """Args: data: records passed to fit (``dataset="given"``). tokenizer: the tokenizer of a model passed to fit
        (a transformers tokenizer)."""
        self.data = data
        self.tokenizer = None if tokenizer is None else text.HubTokenizer(tokenizer, "given")

    def split_sizes(self, cfg: RunConfig, prof: Profile) -> tuple[int, int, int]:
        # pydoc_text's 2,608 paragraphs cap a profile's sizes; a train_size asked for is kept (and checked on loading)
        if cfg.dataset not in text.available():  # a learner's own data: all of it, split 80/10/10
            return cfg.train_size or 0, 0, 0
        train, val, test = text.split_sizes(cfg.dataset, cfg.train_size or prof.train_size, prof.val_size,
                                            prof.test_size)
        return cfg.train_size or train, val, test

    def splits(self, cfg: RunConfig, sizes: tuple[int, int, int]) -> dict:
        if self.data is not None and cfg.dataset != GIVEN:  # never silently ignored
            raise ConfigError("dataset", cfg.dataset, f"{GIVEN!r} when data is passed to fit(cfg, data=...)")
        tokenizer = self.data_tokenizer(cfg)
        if cfg.dataset in text.available():
            return text_splits(cfg.dataset, *sizes, run_seq_len(cfg), tokenizer)
        spec = self.data if cfg.dataset == GIVEN else cfg.dataset
        if spec is None:
            raise ConfigError("data", None, f"records passed to fit(cfg, data=...) with dataset={GIVEN!r}")
        return load_own_splits(spec, tokenizer or text.pydoc_bpe(), run_seq_len(cfg), cfg.loss_on,
                               dict(cfg.data_columns), cfg.train_size, online=models.is_online())

    def data_tokenizer(self, cfg: RunConfig):
        """What tokenizes the data: a model's own tokenizer where its weights (or the learner) need it, else None
        (labkit's own: the digits' characters, pydoc_text's BPE, the BPE for a learner's data too)."""
        if self.tokenizer is not None:
            return self.tokenizer
        if cfg.model in models.HUB_MODELS and cfg.pretrained:
            return _hub_tokenizer(cfg.model, cfg.dataset)
        if models.own.is_own_language_model(cfg.model) and cfg.model not in models.HUB_MODELS:
            return _own_tokenizer(cfg.model)
        return None

    def build(self, cfg: RunConfig, split):
        return models.build_language_model(cfg.model, split.tokenizer.vocab_size, cfg.pretrained,
                                           cfg.attn_implementation, split.tokenizer)

    def checkpoint(self, model: torch.nn.Module, cfg: RunConfig) -> None:
        """``checkpointing=True``: every decoder layer checkpointed (transformers' own method)."""
        if cfg.checkpointing is True:
            checkpoint_decoder_layers(models.unwrap(model))

    def on_device(self, model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> str | None:
        warnings = [w for w in (softcapping_warning(model, cfg), compile_layers(model, cfg, device)) if w]
        return " ".join(warnings) or None

    def loader(self, split, rows: int, cfg: RunConfig, sampler, device: torch.device):
        """Rows of token ids, padded or packed (`labkit.text.batching`)."""
        loader = text.make_token_loader(split, rows, cfg.packing, shuffle=True, seed=cfg.seed, drop_last=True,
                                        sampler=sampler)
        if len(loader) == 0:
            raise ConfigError("batch_size", cfg.batch_size, f"at most {len(loader.dataset)}, the rows "
                              f"{cfg.dataset}'s training split makes with packing={cfg.packing!r}")
        return loader

    def batch(self, item, labels=None) -> text.TokenBatch:
        if labels is not None or not isinstance(item, text.TokenBatch):
            raise ConfigError("batch", type(item).__name__, "one labkit.text.TokenBatch (a language model's step)")
        return item

    def to_device(self, batch: text.TokenBatch, split, cfg: RunConfig, device: torch.device) -> text.TokenBatch:
        return batch.to(device, non_blocking=True)

    def loss_sum(self, model: torch.nn.Module, micro: text.TokenBatch, cfg: RunConfig) -> torch.Tensor:
        return token_loss(model, micro, cfg.loss_chunks)

    def extra_flops(self, model: torch.nn.Module, batch: text.TokenBatch, device: torch.device) -> int:
        """The CPU SDPA kernel's FLOPs, which torch's FLOP counter misses."""
        return models.uncounted_attention_flops(models.unwrap(model), *batch.input_ids.shape, device)

    def evaluate(self, model, splits: dict, cfg: RunConfig, device, precision, shard: bool) -> dict:
        """The test split's accuracy (None on a learner's own data), loss and perplexity."""
        return score_tokens(model, splits["test"], device, precision)

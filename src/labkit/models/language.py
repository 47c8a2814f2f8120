"""labkit's small decoder language models by name: transformers' Llama (RMSNorm, RoPE, SwiGLU), built from a config.

- ``tiny_llama``: about 1M parameters with the digit tasks' 16-token vocabulary (hidden 128, 4 layers, 4 heads,
  SwiGLU width 344): the workload at ``ci``. labkit pretrains it on ``digits_source`` (`labkit pretrain tiny_llama`)
  and ships the checkpoint; `build_language_model` loads it.
- ``tiny_llama_10m``: about 10M parameters (hidden 384, 6 layers, 6 heads, width 1024), random weights, never
  shipped: for speed and memory at ``quick``.

The vocabulary comes from the dataset's tokenizer, with ``<pad>`` at id 0 (`labkit.text.PAD_ID`). transformers is
imported when a model is built, so ``import labkit`` never needs it (the ``lm`` extra installs it). Stages for
freezing: ``embed`` (token embeddings), ``layer0`` ... (the decoder layers), ``head`` (final norm and output layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..choices import ATTN_IMPLEMENTATIONS, check_choice
from ..errors import ConfigError
from ..text import BOS_ID, EOS_ID, PAD_ID
from ..validate import is_int
from . import own
from .hub import HUB_MODELS, transformers_module
from .own import is_own_language_model


@dataclass(frozen=True)
class LanguageModelSpec:
    """The shape of one of labkit's Llama models (`LlamaConfig`'s fields of the same meaning)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 256


LANGUAGE_MODELS = {
    "tiny_llama": LanguageModelSpec(128, 4, 4, 344),
    "tiny_llama_10m": LanguageModelSpec(384, 6, 6, 1024),
}


def language_models() -> list[str]:
    """The language-model names `build_language_model` accepts: labkit's own, then the hub models (`hub_models`).

    Example:
        >>> labkit.models.language_models()
        ['tiny_llama', 'tiny_llama_10m', 'smollm2_135m', 'qwen2.5_0.5b', 'qwen2.5_1.5b']
    """
    return [*LANGUAGE_MODELS, *HUB_MODELS]


def is_language_model(name) -> bool:
    """A causal LM: labkit's, a hub model by name, or a learner's own (a hub id or a directory, `labkit.models.own`)."""
    return name in LANGUAGE_MODELS or name in HUB_MODELS or is_own_language_model(name)


def max_positions(name: str) -> int:
    """The longest sequence model ``name`` takes (its ``max_position_embeddings``)."""
    if is_own_language_model(name) and name not in HUB_MODELS:
        return own.max_positions(name)
    check_choice("model", name, language_models())
    if name in HUB_MODELS:
        return HUB_MODELS[name].shape.max_position_embeddings
    return LANGUAGE_MODELS[name].max_position_embeddings


def build_llama(name: str, vocab_size: int, attn_implementation: str = "sdpa") -> nn.Module:
    """Language model ``name``, a transformers ``LlamaForCausalLM`` with random weights, for ``vocab_size`` tokens.

    `labkit.models.build_language_model` calls it and says where the starting weights come from.

    Args:
        name: one of `language_models()`.
        vocab_size: the tokenizer's vocabulary size (``<pad>`` is id 0).
        attn_implementation: ``sdpa`` (PyTorch's fused attention) or ``eager`` (the softmax of Q K^T written out).

    Example:
        >>> build_llama("tiny_llama", vocab_size=16).num_parameters()
        795776
    """
    check_choice("model", name, LANGUAGE_MODELS)
    check_choice("attn_implementation", attn_implementation, ATTN_IMPLEMENTATIONS)
    if not is_int(vocab_size) or vocab_size < 3:
        raise ConfigError("vocab_size", vocab_size, "an integer >= 3 (<pad>, <bos>, <eos> and the tokens)")
    spec = LANGUAGE_MODELS[name]
    transformers = transformers_module(name)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads, max_position_embeddings=spec.max_position_embeddings,
        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=False,
        attn_implementation=attn_implementation)
    model = transformers.LlamaForCausalLM(config).train()
    model.labkit_name = name
    return model


def uncounted_attention_flops(model: nn.Module, rows: int, width: int, device) -> int:
    """The attention FLOPs of a training step (forward + backward) that torch's FLOP counter misses, else 0.

    The counter has no formula for the CPU SDPA kernel, so on a CPU an ``sdpa`` model's QK^T and PV products go
    uncounted: 2 products x 2 B L^2 hidden FLOPs per layer forward, twice that backward, as eager's are counted.

    Args:
        model: a model from `build_llama` (a wrapped one is fine if it has ``config``).
        rows, width: the step's token rows and their length (all micro-batches together).
        device: where the step ran.
    """
    config = model.config
    if config._attn_implementation != "sdpa" or torch.device(device).type != "cpu":
        return 0
    return 12 * rows * width**2 * config.hidden_size * config.num_hidden_layers


def output_layer_tied(model: nn.Module) -> bool:
    """Whether ``model``'s output layer is its token embeddings' matrix (``tie_word_embeddings``: SmolLM2, Qwen2.5,
    Llama 3.2 1B). Casting, quantizing or freezing one then acts on the other too.

    Example:
        >>> output_layer_tied(build_llama("tiny_llama", vocab_size=16))
        False
    """
    head = getattr(model, "get_output_embeddings", lambda: None)()
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    return head is not None and embed is not None and head.weight is embed.weight


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM, found from its module tree: the ModuleList of same-type blocks that holds
    the most parameters (``model.model.layers`` in Llama, Qwen, Mistral, Gemma and Phi)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)
             and len({type(layer) for layer in m}) == 1]
    if not lists:
        raise ConfigError("model", type(model).__name__, "a decoder whose layers are one nn.ModuleList")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def language_stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """A causal LM's stages: ``embed`` (token embeddings), ``layer0`` ... (the decoder layers), ``head`` (what comes
    after them: the final norm, and the output layer)."""
    layers, embed = decoder_layers(model), model.get_input_embeddings()
    body = getattr(model, "base_model", model)
    after = [m for m in body.children() if m is not layers and m is not embed and any(True for _ in m.parameters())]
    return [("embed", embed), *((f"layer{i}", layer) for i, layer in enumerate(layers)),
            ("head", nn.ModuleList([*after, model.get_output_embeddings()]))]

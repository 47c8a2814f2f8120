"""Hub language models by name: the ``full`` profile's workload (SmolLM2-135M) and the 0.5-1.5B models QLoRA and the
memory estimates are about. Each name carries its Hugging Face repo id and its architecture written out here.

Where the weights come from (`build_hub_model`): online, ``AutoModelForCausalLM.from_pretrained(repo)``, but only when
the data was tokenized by the repo's own tokenizer (`hub_tokenizer`; pretrained embeddings on another tokenizer's ids
would be noise). Offline (``LABKIT_OFFLINE=1``), when a download fails or the data uses labkit's BPE: the same
architecture built from the config below with RANDOM weights, and a loud warning. labkit's BPE and digit ids lie
below every hub vocabulary, so such a model trains on labkit's datasets as is.

The numbers are the repos' ``config.json`` fields, as printed by transformers and quoted by their model cards
(checked against public copies of those files; SmolLM2-135M's ``max_position_embeddings`` reads 8192 in the
current file and 2048 in an early revision, which changes nothing here). Licences: Apache-2.0, none gated.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..choices import ATTN_IMPLEMENTATIONS, check_choice
from ..downloads import PROBE_TIMEOUT_S, download_timeout, host_answers
from ..env import OFFLINE_ENV, SHRINK_ENV, is_online, shrink_requested
from ..errors import ConfigError, UnsupportedError
from ..messages import note
from ..text import HubTokenizer


def transformers_module(name: str = "tiny_llama"):
    """Import transformers, or raise `UnsupportedError` naming model ``name`` and saying how to install it."""
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise UnsupportedError("model", name, f"transformers is not installed ({exc})",
                               "the vision models; `pip install 'labkit-finetune[lm]'` adds the language models") \
            from exc


@dataclass(frozen=True)
class DecoderShape:
    """A decoder-only transformer's shape, in `LlamaConfig`'s names: what memory and FLOPs depend on.

    ``attention_bias``: biases on the q, k, v projections (Qwen2). ``tie_word_embeddings``: the output layer is the
    token embedding's matrix (one copy of vocab x hidden weights). ``explicit_head_dim``: a config's own ``head_dim``
    where it is not hidden / heads (Qwen3, Gemma; 0: hidden / heads).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool = False
    explicit_head_dim: int = 0

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_width(self) -> int:
        """The queries' width (heads x head dim): q_proj's outputs, o_proj's inputs."""
        return self.num_attention_heads * self.head_dim

    def layer_linear_params(self) -> dict:
        """One decoder layer's linear weights (biases included) by projection: q, k, v, o, gate, up, down."""
        h, kv, i = self.hidden_size, self.num_key_value_heads * self.head_dim, self.intermediate_size
        q, bias = self.q_width, int(self.attention_bias)
        return {"q_proj": h * q + bias * q, "k_proj": h * kv + bias * kv, "v_proj": h * kv + bias * kv,
                "o_proj": q * h, "gate_proj": h * i, "up_proj": h * i, "down_proj": i * h}

    def num_parameters(self) -> int:
        """All parameters: embeddings, layers (linear weights and two RMSNorm gains each), final norm, output layer.

        Example:
            >>> HUB_MODELS["smollm2_135m"].shape.num_parameters()
            134515008
        """
        layer = sum(self.layer_linear_params().values()) + 2 * self.hidden_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.vocab_size * self.hidden_size + self.num_hidden_layers * layer + self.hidden_size + head


@dataclass(frozen=True)
class HubModel:
    """A hub model labkit knows by name: its repo, transformers' ``model_type``, its `DecoderShape` and the commit
    its weights and tokenizer are downloaded at (``revision``: a later push to the repo changes nothing here)."""

    repo: str
    model_type: str  # transformers' name for the architecture: "llama", "qwen2"
    shape: DecoderShape
    rope_theta: float
    rms_norm_eps: float
    revision: str = "main"


HUB_MODELS = {
    # HuggingFaceTB/SmolLM2-135M (LlamaForCausalLM, Apache-2.0): 134.5M parameters, tied embeddings.
    "smollm2_135m": HubModel("HuggingFaceTB/SmolLM2-135M", "llama",
                             DecoderShape(576, 1536, 30, 9, 3, 49152, True, 8192), 100000.0, 1e-5,
                             revision="93efa2f097d58c2a74874c7e644dbc9b0cee75a2"),
    # Qwen/Qwen2.5-0.5B (Qwen2ForCausalLM, Apache-2.0): 494M parameters, q/k/v biases, tied embeddings.
    "qwen2.5_0.5b": HubModel("Qwen/Qwen2.5-0.5B", "qwen2",
                             DecoderShape(896, 4864, 24, 14, 2, 151936, True, 32768, attention_bias=True),
                             1000000.0, 1e-6, revision="060db6499f32faf8b98477b0a26969ef7d8b9987"),
    # Qwen/Qwen2.5-1.5B (Qwen2ForCausalLM, Apache-2.0): 1.54B parameters.
    "qwen2.5_1.5b": HubModel("Qwen/Qwen2.5-1.5B", "qwen2",
                             DecoderShape(1536, 8960, 28, 12, 2, 151936, True, 32768, attention_bias=True),
                             1000000.0, 1e-6, revision="8faed761d45a263340a0528343f099c05c9a4323"),
}
HUB_HOST = "huggingface.co"  # asked first (`labkit.downloads.host_answers`): offline, labkit gives up in seconds


def hub_models() -> list[str]:
    """The hub model names labkit builds (`build_hub_model`).

    Example:
        >>> labkit.models.hub_models()
        ['smollm2_135m', 'qwen2.5_0.5b', 'qwen2.5_1.5b']
    """
    return list(HUB_MODELS)


# `shrunk_shape`: widths a CPU trains in seconds.
# head_dim 32: a GQA v_proj stays >= 64 wide (rank 64); the vocabulary holds pydoc_text's 2,048-token BPE
SHRUNK_LAYERS, SHRUNK_HEAD_DIM, SHRUNK_VOCAB = 2, 32, 2304


def shrunk_shape(shape: DecoderShape) -> DecoderShape:
    """``shape``'s architecture at CPU size: `SHRUNK_LAYERS` decoder layers, the same heads and key-value heads (GQA)
    `SHRUNK_HEAD_DIM` wide, the SwiGLU width in the same proportion (a multiple of 64), a vocabulary of at most
    `SHRUNK_VOCAB` tokens; tied embeddings, q/k/v biases and positions kept.

    Example:
        >>> shrunk_shape(HUB_MODELS["qwen2.5_1.5b"].shape).hidden_size   # 12 heads x 32
        384
    """
    hidden = shape.num_attention_heads * SHRUNK_HEAD_DIM
    intermediate = max(64, round(shape.intermediate_size / shape.hidden_size * hidden / 64) * 64)
    return replace(shape, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=SHRUNK_LAYERS,
                   vocab_size=min(shape.vocab_size, SHRUNK_VOCAB))


def built_shape(name: str) -> DecoderShape:
    """The shape `build_hub_model` builds for ``name`` here: the model's own, or `shrunk_shape` of it under
    ``$LABKIT_SHRINK`` (`labkit.env.FULL_SHRUNK`, `make test`'s full-shapes part)."""
    check_choice("model", name, HUB_MODELS)
    shape = HUB_MODELS[name].shape
    return shrunk_shape(shape) if shrink_requested() else shape


def hub_config(name: str, attn_implementation: str = "sdpa", **overrides):
    """transformers' config for hub model ``name``, from labkit's copy of its architecture (no download).

    Args:
        name: one of `hub_models()`. attn_implementation: ``sdpa`` or ``eager``.
        overrides: config fields to change, e.g. ``num_hidden_layers=2`` for a quick test of the same code path.
    """
    check_choice("model", name, HUB_MODELS)
    check_choice("attn_implementation", attn_implementation, ATTN_IMPLEMENTATIONS)
    spec, transformers = HUB_MODELS[name], transformers_module(name)
    s = built_shape(name)
    fields = {"hidden_size": s.hidden_size, "intermediate_size": s.intermediate_size,
              "num_hidden_layers": s.num_hidden_layers, "num_attention_heads": s.num_attention_heads,
              "num_key_value_heads": s.num_key_value_heads, "vocab_size": s.vocab_size,
              "tie_word_embeddings": s.tie_word_embeddings, "max_position_embeddings": s.max_position_embeddings,
              "rope_theta": spec.rope_theta, "rms_norm_eps": spec.rms_norm_eps}
    return transformers.AutoConfig.for_model(spec.model_type, **{**fields, **overrides},
                                             attn_implementation=attn_implementation)


def hub_tokenizer(name: str) -> tuple[HubTokenizer | None, str | None]:
    """Hub model ``name``'s own tokenizer (``AutoTokenizer.from_pretrained``), or None and why not (offline, failed).

    Example:
        >>> tokenizer, why = hub_tokenizer("smollm2_135m")
    """
    check_choice("model", name, HUB_MODELS)
    spec = HUB_MODELS[name]
    repo = spec.repo
    if not is_online():
        return None, f"${OFFLINE_ENV} is set, so {repo}'s tokenizer and weights were not downloaded"
    if shrink_requested():  # its vocabulary would not fit the shrunk model's
        return None, f"${SHRINK_ENV} is set, so {repo} is built shrunk, without its tokenizer and weights"
    if not host_answers(HUB_HOST):  # Kaggle with Internet off: seconds, not the hub client's retries
        return None, (f"{HUB_HOST} did not answer within {PROBE_TIMEOUT_S:g} s (no internet here?), so {repo}'s "
                      "tokenizer and weights were not downloaded")
    try:
        with download_timeout():
            backend = transformers_module(name).AutoTokenizer.from_pretrained(repo, revision=spec.revision)
    except Exception as exc:  # no network, a timeout, a proxy page instead of the file
        return None, f"{repo}'s tokenizer could not be downloaded ({type(exc).__name__}: {exc})"
    return HubTokenizer(backend, repo), None


def dtype_argument(transformers_version: str) -> str:
    """``from_pretrained``'s name for the weights' dtype: ``dtype`` from transformers 4.56 on (which warns that
    ``torch_dtype`` is deprecated, a stderr box in a notebook), ``torch_dtype`` before.

    Example:
        >>> dtype_argument("4.55.4"), dtype_argument("4.57.1")
        ('torch_dtype', 'dtype')
    """
    release = tuple(int(part) for part in re.findall(r"\d+", transformers_version)[:2])
    return "dtype" if release >= (4, 56) else "torch_dtype"


def _from_pretrained(name: str, attn_implementation: str, overrides: dict) -> nn.Module:
    transformers, spec = transformers_module(name), HUB_MODELS[name]
    # transformers 5 loads in the checkpoint's dtype (bf16) unless told; labkit trains fp32 weights under autocast.
    with download_timeout():
        return transformers.AutoModelForCausalLM.from_pretrained(
            spec.repo, revision=spec.revision, attn_implementation=attn_implementation,
            **{dtype_argument(transformers.__version__): torch.float32}, **overrides)


def build_hub_model(name: str, data_vocab_size: int | None = None, tokenizer_name: str | None = None,
                    pretrained: bool = True, attn_implementation: str = "sdpa",
                    **overrides) -> tuple[nn.Module, str, str | None]:
    """Hub model ``name`` with its weights, where they came from (``hub:<repo>`` or ``random``) and a warning.

    Args:
        name: one of `hub_models()`.
        data_vocab_size: the data's tokenizer's vocabulary (None: unknown); the model keeps its own, which must hold it.
        tokenizer_name: what tokenized the data; pretrained weights load only with the repo's own tokenizer.
        pretrained: False builds random weights on purpose (no warning).
        attn_implementation: ``sdpa`` or ``eager``.
        overrides: config fields to change, also for downloaded weights (tests shrink the model this way).

    Example:
        >>> model, source, warning = build_hub_model("smollm2_135m", pretrained=False)
    """
    config = hub_config(name, attn_implementation, **overrides)
    if data_vocab_size is not None and data_vocab_size > config.vocab_size:
        raise ConfigError("dataset", tokenizer_name, f"data whose tokenizer has at most {config.vocab_size} tokens "
                          f"for {name} (this one has {data_vocab_size})")
    repo = HUB_MODELS[name].repo
    if pretrained:
        why = (f"the data was tokenized by {tokenizer_name!r}, not {repo}'s tokenizer, and pretrained embeddings "
               "would read its ids as other tokens")
        if shrink_requested():
            why = f"${SHRINK_ENV} is set: {repo}'s architecture is built shrunk (`labkit.models.hub.shrunk_shape`)"
        elif tokenizer_name == repo:
            try:
                model = _from_pretrained(name, attn_implementation, overrides)
            except Exception as exc:  # no network, a timeout, a missing file
                why = f"{repo}'s weights could not be downloaded ({type(exc).__name__}: {exc})"
            else:
                model.train().labkit_name = name
                return model, f"hub:{repo}", None
        elif not is_online():
            why = f"${OFFLINE_ENV} is set, so neither {repo}'s tokenizer nor its weights were downloaded"
    model = transformers_module(name).AutoModelForCausalLM.from_config(config).train()
    model.labkit_name = name
    if not pretrained:
        return model, "random", None
    warning = (f"NO PRETRAINED WEIGHTS for {name}: {why}. It is {repo}'s architecture built from labkit's copy of "
               "its config, with RANDOM weights: speed and memory are the real model's, accuracy and loss are not. "
               f"To fix: connect to the internet and unset ${OFFLINE_ENV} (the data is then tokenized by {repo}'s "
               "tokenizer); or pass pretrained=False to train from scratch on purpose.")
    note(warning)
    return model, "random", warning

"""A learner's own language model: a Hugging Face causal-LM id or a local directory, by the conventions they know.

- ``"Qwen/Qwen2.5-0.5B"`` (``@REVISION`` optional): online, ``from_pretrained`` downloads the weights and tokenizer;
  offline, a model whose public ``config.json`` labkit ships (`SHIPPED_CONFIGS`) is built from it with RANDOM
  weights, and says so;
- a local directory holding ``config.json`` and tokenizer files: its weights (``*.safetensors``, ``*.bin``) load when
  it has them, else it is built from its config with RANDOM weights, and says so.

No table per model: dense decoders (Llama, Qwen2/2.5/3, Mistral, Gemma, Phi, SmolLM) are found from their config and
module tree (`decoder_layers`). A mixture of experts, a multimodal or an encoder config is refused, naming the config
field that says so (`check_decoder`). transformers is imported when a model is built.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from pathlib import Path

import torch
from torch import nn

from ..downloads import download_timeout
from ..env import OFFLINE_ENV, is_online
from ..errors import ConfigError
from ..messages import note
from ..text import HubTokenizer
from .hub import DecoderShape, dtype_argument, transformers_module

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "assets" / "configs"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w.-]+)?$")
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# Config fields that make a model something other than a dense decoder, with what it is.
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_MULTIMODAL_FIELDS = ("vision_config", "audio_config", "text_config")


def shipped_configs() -> list[str]:
    """The hub ids whose public ``config.json`` labkit ships (built offline from it, with random weights).

    Example:
        >>> "Qwen/Qwen2.5-0.5B" in labkit.models.own.shipped_configs()
        True
    """
    return sorted(p.stem.replace("--", "/") for p in CONFIGS_DIR.glob("*.json"))


def shipped_config(repo: str) -> dict | None:
    path = CONFIGS_DIR / f"{repo.replace('/', '--')}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def is_model_dir(spec) -> bool:
    return isinstance(spec, str) and (Path(spec).expanduser() / "config.json").is_file()


def is_own_language_model(spec) -> bool:
    """Whether ``spec`` names a learner's own causal LM: a directory with ``config.json`` or a hub id."""
    return is_model_dir(spec) or (isinstance(spec, str) and HUB_ID.match(spec) is not None
                                  and not Path(spec).expanduser().exists())


def parse_hub_id(spec: str) -> tuple[str, str | None]:
    """``ORG/NAME[@REVISION]`` -> (repo, revision)."""
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def write_config_dir(repo: str, path: str | Path, **overrides) -> Path:
    """A model directory holding hub model ``repo``'s shipped ``config.json`` (fields changed by ``overrides``, e.g.
    ``num_hidden_layers=2`` for a CPU): a model labkit builds offline, with random weights.

    Example:
        >>> write_config_dir("Qwen/Qwen2.5-0.5B", "qwen-small", num_hidden_layers=2)
    """
    config = shipped_config(repo)
    if config is None:
        raise ConfigError("repo", repo, f"one of {shipped_configs()} (labkit ships their config.json)")
    config = {**config, **overrides}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids a smaller vocabulary no longer holds
        if isinstance(config.get(name), int) and config[name] >= config["vocab_size"]:
            config[name] = None
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    return path


@functools.lru_cache(maxsize=16)
def model_config(spec: str):
    """transformers' config of own model ``spec`` (a directory's, a shipped one offline, else downloaded), checked
    to be a dense decoder (`check_decoder`)."""
    transformers = transformers_module(spec)
    with quiet(transformers):
        config = _load_config(transformers, spec)
    check_decoder(config, spec)
    return config


@contextlib.contextmanager
def quiet(transformers):
    """transformers' logging at errors only: a published config.json still says ``torch_dtype``, which transformers 5
    reads with a deprecation warning that would be a stderr box in every notebook cell that loads one."""
    logging = transformers.utils.logging
    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


def _load_config(transformers, spec: str):
    if is_model_dir(spec):
        config = transformers.AutoConfig.from_pretrained(str(Path(spec).expanduser()))
    else:
        repo, revision = parse_hub_id(spec)
        shipped = shipped_config(repo)
        if shipped is not None and (revision is None or not is_online()):
            fields = dict(shipped)
            config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        elif not is_online():
            raise ConfigError("model", spec, f"a local directory with config.json, or a hub id labkit ships the config "
                              f"of ({', '.join(shipped_configs())}), since this machine is offline (${OFFLINE_ENV} "
                              "or no network)", "download the model on a machine that is online and pass its folder")
        else:
            with download_timeout():
                config = transformers.AutoConfig.from_pretrained(repo, revision=revision)
    return config


def check_decoder(config, spec: str) -> None:
    """`ConfigError` unless ``config`` is a dense decoder-only causal LM, naming the config field that says not."""
    for field in _MOE_FIELDS:
        if getattr(config, field, None):
            raise ConfigError("model", spec, "a dense decoder-only causal LM", f"its config sets {field}="
                              f"{getattr(config, field)}: a mixture of experts, which labkit does not train")
    for field in _MULTIMODAL_FIELDS:
        if getattr(config, field, None) is not None:
            raise ConfigError("model", spec, "a text-only decoder-only causal LM", f"its config has {field}: a "
                              "multimodal model; fine-tune its language model on its own, if it is published apart")
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError("model", spec, "a decoder-only causal LM", "its config sets is_encoder_decoder=True")
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        raise ConfigError("model", spec, "a causal LM (architectures ending in ForCausalLM)",
                          f"its config's architectures={architectures}: an encoder or another task's model")
    mapping = getattr(transformers_module(spec), "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", {})
    if mapping and config.model_type not in mapping:
        raise ConfigError("model", spec, "a model type transformers builds as a causal LM",
                          f"its config's model_type={config.model_type!r} has no causal-LM class")


def max_positions(spec: str) -> int:
    return int(getattr(model_config(spec), "max_position_embeddings", 2**31 - 1))


def own_tokenizer(spec: str) -> tuple[HubTokenizer | None, str | None]:
    """Own model ``spec``'s tokenizer, or None and why not (offline hub id, no tokenizer files in the directory)."""
    transformers = transformers_module(spec)
    if is_model_dir(spec):
        source, kwargs = str(Path(spec).expanduser()), {}
        if not any((Path(source) / name).is_file() for name in TOKENIZER_FILES):
            # transformers 5 then builds an EMPTY tokenizer (1 token) instead of failing: every label would be lost
            return None, f"{source} holds no tokenizer files ({', '.join(TOKENIZER_FILES)})"
    else:
        repo, revision = parse_hub_id(spec)
        if not is_online():
            return None, f"${OFFLINE_ENV} is set (or there is no network), so {repo}'s tokenizer was not downloaded"
        source, kwargs = repo, {"revision": revision}
    try:
        with download_timeout():
            backend = transformers.AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception as exc:  # no tokenizer files, no network, a timeout
        return None, f"{spec}'s tokenizer could not be loaded ({type(exc).__name__}: {str(exc)[:200]})"
    if len(backend) < 3 or backend.eos_token_id is None:
        return None, (f"{spec}'s tokenizer has {len(backend)} tokens and eos_token={backend.eos_token!r}: a "
                      "tokenizer labkit can train with needs a vocabulary and an end-of-sequence token")
    return HubTokenizer(backend, spec), None


def _weights_here(spec: str) -> bool:
    folder = Path(spec).expanduser()
    return any(any(folder.glob(pattern)) for pattern in WEIGHT_FILES)


def build_own_language_model(spec: str, vocab_size: int | None, tokenizer_name: str | None, pretrained: bool = True,
                             attn_implementation: str = "sdpa") -> tuple[nn.Module, str, str | None]:
    """Own causal LM ``spec`` with its weights, where they came from (``hub:<repo>``, ``dir:<path>``, ``random``) and
    a warning when they are random against the wish for pretrained ones.

    Args:
        spec: a hub id or a model directory. vocab_size: the data's tokenizer's size (None: unknown).
        tokenizer_name: what tokenized the data; pretrained weights load only on the model's own tokenizer's ids.
        pretrained: False builds random weights on purpose. attn_implementation: ``sdpa`` or ``eager``.
    """
    config = model_config(spec)
    transformers = transformers_module(spec)
    model_class = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    if attn_implementation == "sdpa" and not getattr(model_class, "_supports_sdpa", True):
        capped = getattr(config, "attn_logit_softcapping", None)
        raise ConfigError("attn_implementation", attn_implementation, f"'eager' for {spec}",
                          f"transformers {transformers.__version__} has no SDPA attention for {model_class.__name__}"
                          + (f" (its attention caps its scores: attn_logit_softcapping={capped})" if capped else ""))
    config._attn_implementation = attn_implementation
    if vocab_size is not None and vocab_size > config.vocab_size:
        raise ConfigError("model", spec, f"a model whose vocabulary holds the data's tokenizer ({vocab_size} tokens)",
                          f"its config has vocab_size={config.vocab_size}; resize its embeddings first")
    why = None
    if pretrained:
        where = str(Path(spec).expanduser()) if is_model_dir(spec) else parse_hub_id(spec)[0]
        if tokenizer_name != spec:
            why = f"the data was tokenized by {tokenizer_name!r}, not {spec}'s own tokenizer"
        elif is_model_dir(spec) and not _weights_here(spec):
            why = f"{where} holds no weight files ({', '.join(WEIGHT_FILES)})"
        elif not is_model_dir(spec) and not is_online():
            why = f"${OFFLINE_ENV} is set (or there is no network), so {where}'s weights were not downloaded"
        else:
            revision = None if is_model_dir(spec) else parse_hub_id(spec)[1]
            with download_timeout():
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    where, revision=revision, attn_implementation=attn_implementation,
                    **{dtype_argument(transformers.__version__): torch.float32})
            model.train().labkit_name = spec
            return model, f"{'dir' if is_model_dir(spec) else 'hub'}:{where}", None
    # float32 weights, as every labkit run trains them (autocast does the rest): transformers 5 would build the
    # config's own dtype (a published config.json says bfloat16) and train a "fp32" run on bfloat16 weights
    model = transformers.AutoModelForCausalLM.from_config(
        config, **{dtype_argument(transformers.__version__): torch.float32}).train()
    model.labkit_name = spec
    if not pretrained:
        return model, "random", None
    warning = (f"NO PRETRAINED WEIGHTS for {spec}: {why}. It is built from its config.json with RANDOM weights: "
               "speed and memory are the real model's, the loss and accuracy are not. Pass pretrained=False to "
               "train from scratch on purpose.")
    note(warning)
    return model, "random", warning


def config_shape(config) -> DecoderShape:
    """The `DecoderShape` of a transformers decoder config (what a plan needs: no weights are built).

    Example:
        >>> config_shape(model_config("Qwen/Qwen2.5-7B")).num_parameters()
        7615616512
    """
    head_dim = getattr(config, "head_dim", None) or 0
    heads = config.num_attention_heads
    return DecoderShape(config.hidden_size, config.intermediate_size, config.num_hidden_layers, heads,
                        getattr(config, "num_key_value_heads", None) or heads, config.vocab_size,
                        bool(getattr(config, "tie_word_embeddings", False)),
                        int(getattr(config, "max_position_embeddings", 0) or 2**31 - 1),
                        bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2",
                        0 if head_dim * heads == config.hidden_size else head_dim)

"""The checks `RunConfig`'s fields declare (`labkit.fieldspec.option`): what each value may be on its own, what a
field depends on (`Needs`: where it does not hold, the field must keep its default) and its relations to other fields.

They read the catalogs (`labkit.models`, `labkit.data`, `labkit.text`) and a learner's own sources: a model folder or
hub id, ``torchvision:NAME``/``timm:NAME``, a data file, a ``hf:`` id, an image folder, or data passed to fit
(`GIVEN`).
"""

from __future__ import annotations

from collections.abc import Callable

from . import data, models, text
from .choices import EIGHT_BIT_OPTIMIZERS, LORA_ALL_LINEAR, check_lora, lora_targets
from .errors import ConfigError
from .fieldspec import Needs, int_at_least, one_of
from .imagefolder import is_image_folder
from .models.own_vision import check_name, is_own_vision_model
from .text.own_data import DEFAULT_OWN_SEQ_LEN
from .text.records import FILE_SUFFIXES, is_data_file, is_hf_dataset
from .validate import is_int, is_number

GIVEN = "given"  # the dataset passed to fit(cfg, data=...): a datasets.Dataset, a list of strings or records


def is_language(cfg) -> bool:
    return models.is_language_model(cfg.model)


# What a field depends on (`labkit.fieldspec.Needs`): where it does not hold, the field keeps its default.
LANGUAGE = Needs(is_language, "(the default) for {model}, a vision model",
                 f"it applies to the language models {models.language_models()}")
VISION = Needs(lambda cfg: not is_language(cfg), "for the language model {model}",
               "labkit prunes and quantizes the vision models only, for now")
LORA = Needs(lambda cfg: cfg.lora_rank is not None, "(the default) unless lora_rank is set",
             "without lora_rank there are no LoRA adapters for it to change")
SGD = Needs(lambda cfg: cfg.optimizer == "sgd", "(the default) unless optimizer='sgd'",
            "{optimizer} has no momentum setting")
EPOCHS = Needs(lambda cfg: cfg.max_steps is None, "(the default) when max_steps is set",
               "max_steps={max_steps} decides the length of the run; set one of the two")
PRUNED = Needs(lambda cfg: cfg.prune_amount is not None, "(the default) unless prune_amount is set",
               "prune_amount says how many channels to remove")
OWN_TEXT = Needs(lambda cfg: is_text_data(cfg.dataset) and cfg.dataset not in text.available(),
                 "(the default) for {dataset}", "it applies to a learner's own text data (a file, hf:, or given)")
QUANTIZED = Needs(lambda cfg: cfg.quantize is not None, "(the default) unless quantize is set",
                  "without quantize nothing is quantized, so nothing is kept in float")


LORA_RANK = int_at_least(1, "None (no LoRA) or a positive integer (1, 2, 4, 8, ...)", optional=True)
IMAGE_SIZE = int_at_least(16, "None (the dataset's own size) or an integer >= 16 (images are resized to it)",
                           optional=True)
SEQ_LEN = int_at_least(2, "None (the dataset's default) or an integer >= 2 (tokens per row)", optional=True)


def model(name: str, value):
    """A catalog name, ``torchvision:NAME``/``timm:NAME``, a hub causal-LM id or a directory with config.json."""
    if is_own_vision_model(value):
        return check_name(value)
    if models.is_language_model(value):
        return value
    return one_of(models.available() + models.language_models(), note="(or torchvision:NAME, timm:NAME, a Hugging "
                  "Face causal-LM id such as 'Qwen/Qwen2.5-0.5B', or a folder holding config.json)")(name, value)


def is_text_data(dataset) -> bool:
    """labkit's text datasets, or a learner's own: a data file, a ``hf:`` id, or data passed to fit (`GIVEN`)."""
    return dataset in text.available() or is_data_file(dataset) or is_hf_dataset(dataset) or dataset == GIVEN


def is_own_data(dataset) -> bool:
    return is_data_file(dataset) or is_hf_dataset(dataset) or dataset == GIVEN or is_image_folder(dataset)


def dataset(name: str, value):
    if isinstance(value, str) and (is_text_data(value) or is_image_folder(value)):
        return value
    return one_of(data.available() + text.available(), note=f"(or a {'/'.join(FILE_SUFFIXES)} file, hf:ORG/NAME, a "
                  f"folder with a subfolder of images per class, or {GIVEN!r} for fit(cfg, data=...))")(name, value)


def dataset_fits_model(name: str, cfg) -> None:
    language = is_language(cfg)
    if language != is_text_data(cfg.dataset):
        allowed = (f"one of {text.available()} or a text data file" if language else
                   f"one of {data.available()} or an image folder")
        kind = "a language model" if language else "a vision model"
        raise ConfigError(name, cfg.dataset, f"{allowed}: {cfg.model} is {kind}")


def run_seq_len(cfg) -> int:
    """The tokens per row a language-model run uses: ``seq_len``, else its dataset's default (a learner's own data:
    `DEFAULT_OWN_SEQ_LEN`, at most the model's ``max_position_embeddings``)."""
    if cfg.dataset in text.available():
        return text.resolve_seq_len(cfg.dataset, cfg.seq_len)
    return cfg.seq_len or min(DEFAULT_OWN_SEQ_LEN, models.max_positions(cfg.model))


def divides_batch(name: str, cfg) -> None:
    if cfg.batch_size % cfg.grad_accum:
        raise ConfigError(name, cfg.grad_accum, f"a divisor of batch_size={cfg.batch_size} (each micro-batch is "
                          "batch_size / grad_accum samples)")


def device(name: str, value):
    if not isinstance(value, str) or not (value in ("auto", "cpu", "cuda") or value.startswith("cuda:")):
        raise ConfigError(name, value, "'auto', 'cpu', 'cuda' or 'cuda:N'")
    return value


def checkpointing(name: str, value):
    if not isinstance(value, bool) and not (is_int(value) and value >= 1):
        raise ConfigError(name, value, "False, True (every block its own segment) or an integer >= 1 (the number of "
                          "checkpointed segments)", "checkpointing=False turns it off")
    return value


def segments_fit(name: str, cfg) -> None:
    """A vision model's segments, at most its blocks; a language model's: every decoder layer or none."""
    value = cfg.checkpointing
    if is_language(cfg) and value not in (False, True):
        raise ConfigError(name, value, f"False or True for the language model {cfg.model}", "True checkpoints every "
                          "decoder layer (transformers' own per-layer checkpointing); it has no segments to count")
    if is_int(value) and cfg.model in models.available() and value > len(blocks := models.block_names(cfg.model)):
        raise ConfigError(name, value, f"False, True or 1 to {len(blocks)}: {cfg.model} has {len(blocks)} blocks "
                          f"({', '.join(blocks)}), and a segment holds at least one")


def not_with_lora(name: str, cfg) -> None:
    if cfg.freeze not in (None, "none") and cfg.lora_rank is not None:
        raise ConfigError(name, cfg.freeze, "None when lora_rank is set",
                          "LoRA already freezes everything but its adapters and the head")


def columns(name: str, value):
    """A mapping of column names, kept as sorted (key, value) pairs (a frozen config is hashable)."""
    pairs = value.items() if isinstance(value, dict) else () if value is None else value
    try:
        kept = tuple(sorted((str(k), v) for k, v in pairs))
    except (TypeError, ValueError):
        kept = None
    if kept is None or not all(isinstance(v, str) and v for _, v in kept):
        raise ConfigError(name, value, "a mapping of the shape's column names to the data's, e.g. "
                          "{'prompt': 'question', 'completion': 'answer'}")
    return kept


def lora_target_names(name: str, value):
    targets = lora_targets(value, name)
    return value if isinstance(value, str) else targets  # YAML gives a list; a frozen config keeps a tuple


def lora_part(part: int) -> Callable:
    """LoRA's own check (`labkit.choices.check_lora`) of one of its settings: 1 alpha, 2 dropout."""
    def check(name: str, value):
        settings = [1, 16.0, 0.0, LORA_ALL_LINEAR]
        settings[part] = value
        check_lora(*settings, fields=("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"))
        return value
    return check


def share(name: str, value):
    if value is not None and (not is_number(value) or not 0 < value < 1):
        raise ConfigError(name, value, "None (no pruning) or a share in (0, 1), e.g. 0.5")
    return value


def not_eight_bit(name: str, cfg) -> None:
    if cfg.optimizer_impl is not None and cfg.optimizer in EIGHT_BIT_OPTIMIZERS:
        raise ConfigError(name, cfg.optimizer_impl, f"None with optimizer={cfg.optimizer!r}",
                          "bitsandbytes' 8-bit optimizers have their own kernels")


def seq_len_fits(name: str, cfg) -> None:
    seq_len = run_seq_len(cfg)
    if seq_len > models.max_positions(cfg.model):
        raise ConfigError(name, cfg.seq_len, f"at most {models.max_positions(cfg.model)}, the longest sequence "
                          f"{cfg.model} takes (max_position_embeddings)")

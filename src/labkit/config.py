"""`RunConfig`: one frozen dataclass describing a run, validated on creation (YAML files: `labkit.configfile`).

Each field is declared once with its default, its check and what it depends on (`labkit.fieldspec.option`); a field
that would have no effect (``lora_alpha`` without ``lora_rank``, ``seq_len`` on a vision model) must keep its
default. The technique a field switches on is documented where it is carried out:

- ``optimizer``, ``optimizer_impl``, ``lr_warmup_steps``: `labkit.techniques.optimizers` (the 8-bit AdamWs need
  ``bitsandbytes``; ``paged_adamw8bit`` is CUDA only; step ``s`` of a warm-up uses ``lr * s / lr_warmup_steps``);
- ``checkpointing``: `labkit.techniques.checkpointing` (segments of a vision model's blocks), and on a language model
  `labkit.techniques.layer_checkpointing` (every decoder layer);
- ``freeze``: `labkit.techniques.freezing`; ``lora_*``: `labkit.techniques.lora`;
- ``prune_amount``, ``prune_structured``, ``quantize``: the copy for inference, scored in ``RunResult.inference``
  (`labkit.techniques.pruning`, `labkit.techniques.quantization`), vision models only for now;
- language models: ``seq_len`` and ``packing`` (`labkit.text.batching`), ``attn_implementation``, ``loss_chunks``
  (`labkit.techniques.chunked_loss`), ``compile`` (`labkit.techniques.compiling`).

The names users bring from the Hugging Face Trainer, TRL and PEFT are aliases (`ALIASES`, `OPTIM_NAMES`).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, fields

from . import downloads
from . import fieldchecks as checks
from .choices import (
    ATTN_IMPLEMENTATIONS,
    FREEZE_LEVELS,
    LORA_ALL_LINEAR,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PACKINGS,
    PRECISIONS,
    QUANTIZE_METHODS,
    SIMULATED_METHODS,
    check_compile,
    check_loss_chunks,
)
from .env import profile
from .errors import ConfigError
from .fieldspec import (
    apply,
    defaults,
    flag,
    int_at_least,
    names,
    number_above,
    number_at_least,
    one_of,
    option,
    optional_positive_int,
    positive_int,
)
from .messages import note
from .text.records import LOSS_ON
from .validate import is_int

# Each choice's values and check live in `labkit.choices`, which the techniques import too.
__all__ = ["ALIASES", "FREEZE_LEVELS", "LORA_ALL_LINEAR", "LORA_DEFAULTS", "OPTIMIZERS", "PRECISIONS", "RunConfig",
           "baseline", "canonical", "check_keys", "field_names", "workload"]


# transformers' ``optim`` names -> (optimizer, optimizer_impl); labkit's own names stand for themselves
OPTIM_NAMES = {"adamw_torch": ("adamw", None), "adamw_torch_fused": ("adamw", "fused"),
               "adamw_8bit": ("adamw8bit", None), "adamw_bnb_8bit": ("adamw8bit", None),
               "paged_adamw_8bit": ("paged_adamw8bit", None)}


@dataclass(frozen=True, init=False)
class RunConfig:
    """Everything that defines one training run. Override by keyword; invalid values raise `ConfigError`.

    Each field is declared with its default, its check and what it depends on (`labkit.fieldspec.option`); the
    module docstring has the details of the techniques' fields. The names users bring from the Hugging Face Trainer,
    TRL and PEFT are accepted too (`ALIASES`, `OPTIM_NAMES`).

    Example:
        >>> cfg = RunConfig(model="small_cnn", batch_size=128).replace(precision="bf16")
        >>> RunConfig(model="tiny_llama", dataset="digits_sort", max_length=64, optim="adamw_torch_fused").seq_len
        64
    """

    model: str = option("small_cnn", checks.model)  # a name from ``labkit.models.available()`` (or language_models())
    # ``labkit.data/text.available()``, a data file, hf:ORG/NAME, an image folder or "given" (fit(cfg, data=...))
    dataset: str = option("shapes10", checks.dataset, relation=checks.dataset_fits_model)
    batch_size: int = option(64, positive_int)  # samples per optimizer step (split into ``grad_accum`` micro-batches)
    precision: str = option("fp32", one_of(PRECISIONS))  # fp32, fp16 (autocast + GradScaler), bf16 (autocast), auto
    # adamw, sgd, adamw8bit or paged_adamw8bit (see the module), or transformers' name for one (`OPTIM_NAMES`)
    optimizer: str = option("adamw", one_of(OPTIMIZERS, note=f"(or transformers' optim names {list(OPTIM_NAMES)})"))
    lr: float = option(1e-3, number_above(0))  # the optimizer's learning rate
    # linear learning-rate warm-up over this many optimizer steps; 0: none
    lr_warmup_steps: int = option(0, int_at_least(0, "an integer >= 0 (0: no warm-up)"))
    weight_decay: float = option(0.0, number_at_least(0))  # the optimizer's weight decay
    momentum: float = option(0.9, number_at_least(0), needs=checks.SGD)  # SGD's momentum (the only optimizer with one)
    epochs: int = option(1, positive_int, needs=checks.EPOCHS)  # passes over the training set, unless max_steps
    max_steps: int | None = option(None, optional_positive_int)  # train exactly this many optimizer steps
    grad_accum: int = option(1, positive_int, relation=checks.divides_batch)  # micro-batches per optimizer step
    grad_clip: float | None = option(None, number_above(0, optional=True))  # clip the gradient norm (None: no)
    # gradient checkpointing: False, True (every block) or a number of segments (vision models)
    checkpointing: bool | int = option(False, checks.checkpointing, relation=checks.segments_fit)
    # None/``none``, ``light``, ``medium``, ``heavy`` or ``head_only``
    freeze: str | None = option(None, one_of(FREEZE_LEVELS, optional=True, note="('head_only': only the head trains)"),
                                relation=checks.not_with_lora)
    lora_rank: int | None = option(None, checks.LORA_RANK)  # train LoRA adapters of this rank instead of the model
    lora_alpha: float = option(16.0, checks.lora_part(1), needs=checks.LORA)  # the update's scale: lora_alpha / rank
    # the Linear layers LoRA adapts: name suffixes (``["qkv"]`` on ``tiny_vit``) or ``"all-linear"`` (all but the head)
    lora_targets: tuple[str, ...] | str = option(LORA_ALL_LINEAR, checks.lora_target_names, needs=checks.LORA)
    lora_dropout: float = option(0.0, checks.lora_part(2), needs=checks.LORA)  # dropout on the LoRA path's input
    # after training, prune this share of the weights for inference (None: no)
    prune_amount: float | None = option(None, checks.share, needs=checks.VISION)
    # remove whole conv output channels instead of zeroing single weights
    prune_structured: bool = option(False, flag, needs=checks.PRUNED)
    # after training (and pruning), quantize a copy for inference with this method
    quantize: str | None = option(None, one_of([*QUANTIZE_METHODS, *SIMULATED_METHODS], optional=True,
                                               what="None (no quantization) or one of"), needs=checks.VISION)
    # module names (``"stem"``, ``"head"``) or layer types (``"LayerNorm"``) that quantization leaves in float
    quantize_keep_float: tuple[str, ...] = option(
        (), names("a list of module names or layer types (e.g. ['head'])"), needs=checks.QUANTIZED, shown="[]")
    seed: int = option(0, int_at_least(0, "an integer >= 0"))  # seeds data order, initialisation and augmentation
    device: str = option("auto", checks.device)  # ``auto``, ``cpu``, ``cuda`` or ``cuda:N``
    pretrained: bool = option(True, flag)  # start from pretrained weights (ImageNet online, labkit's own offline)
    train_size: int | None = option(None, optional_positive_int)  # training samples; None takes the profile's size
    tf32: bool = option(False, flag)  # allow TF32 for float32 matmuls/convolutions on Ampere+ (always set explicitly)
    channels_last: bool = option(False, flag, needs=checks.VISION)  # the channels_last memory format, model and inputs
    evaluate: bool = option(True, flag)  # measure test accuracy after training
    # resize the inputs to this size on the device (None: the dataset's own)
    image_size: int | None = option(None, checks.IMAGE_SIZE, needs=checks.VISION)
    # torch.optim's kernels: ``forloop``, ``foreach``, ``fused`` (None: torch's pick)
    optimizer_impl: str | None = option(None, one_of(OPTIMIZER_IMPLS, optional=True,
                                                     what="None (torch's default) or one of"),
                                    relation=checks.not_eight_bit)
    # language models only (a `labkit.models.language_models()` model on a `labkit.text.available()` dataset):
    # the most tokens per row (None: the dataset's, `labkit.text.DEFAULT_SEQ_LENS`)
    seq_len: int | None = option(None, checks.SEQ_LEN, needs=checks.LANGUAGE, relation=checks.seq_len_fits)
    # ``pad`` (to the batch's longest row), ``pad_max`` (to seq_len), ``pack`` (end to end)
    packing: str = option("pad", one_of(PACKINGS), needs=checks.LANGUAGE)
    # ``sdpa`` (PyTorch's fused attention) or ``eager`` (softmax(QK^T) written out)
    attn_implementation: str = option("sdpa", one_of(ATTN_IMPLEMENTATIONS), needs=checks.LANGUAGE)
    # the output layer and the loss over this many slices of the sequence (None: one)
    loss_chunks: int | None = option(None, needs=checks.LANGUAGE, relation=lambda name, cfg: check_loss_chunks(
        cfg.loss_chunks, checks.run_seq_len(cfg)))
    # torch.compile the decoder layers (compile time reported apart: RunResult.compile_time_s)
    compile: bool = option(False, flag, needs=checks.LANGUAGE,
                           relation=lambda name, cfg: check_compile(cfg.compile, cfg.packing))
    # a learner's own text data: the loss on the ``completion``, the ``assistant`` turns or ``all`` tokens (None: the
    # data's shape decides: completion for prompt/completion and Alpaca, assistant for chats, all for text)
    loss_on: str | None = option(None, one_of(LOSS_ON, optional=True), needs=checks.OWN_TEXT)
    # a learner's own text data: {shape's column: the data's}, e.g. {"prompt": "question", "completion": "answer"}
    data_columns: tuple = option((), checks.columns, needs=checks.OWN_TEXT, shown="{}")

    def __init__(self, **values):
        for name, value in {**defaults(type(self)), **canonical(values, "RunConfig")}.items():
            object.__setattr__(self, name, value)
        apply(self)

    def replace(self, **changes) -> RunConfig:
        """A copy with ``changes`` applied (and validated). Unknown names raise `ConfigError`."""
        return dataclasses.replace(self, **canonical(changes, "RunConfig", self.grad_accum))

    def to_dict(self) -> dict:
        """The fields as plain values (a tuple as a list, column pairs as a mapping, as JSON and YAML give it back)."""
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        return {**values, "data_columns": dict(self.data_columns)}

    @classmethod
    def from_dict(cls, values: dict, source: str = "RunConfig") -> RunConfig:
        """Build from a mapping; unknown keys are an error, never ignored."""
        if not isinstance(values, dict):
            raise ConfigError(source, values, "a mapping of RunConfig fields (key: value)")
        return cls(**canonical(values, source))


LORA_DEFAULTS = defaults(RunConfig, checks.LORA)  # what lora_alpha, lora_targets and lora_dropout are without lora_rank
# The names the Hugging Face Trainer, TRL and PEFT give RunConfig's fields. ``per_device_train_batch_size`` is a
# micro-batch there (`canonical`); ``optim`` takes their optimizer names (`OPTIM_NAMES`).
ALIASES = {"max_length": "seq_len", "max_seq_length": "seq_len", "gradient_accumulation_steps": "grad_accum",
           "gradient_checkpointing": "checkpointing", "target_modules": "lora_targets", "optim": "optimizer",
           "learning_rate": "lr", "num_train_epochs": "epochs", "max_grad_norm": "grad_clip",
           "warmup_steps": "lr_warmup_steps", "r": "lora_rank", "per_device_train_batch_size": "batch_size"}
PRECISION_FLAGS = ("bf16", "fp16")  # the HF Trainer's ``bf16: true`` / ``fp16: true``


def workload(prof=None) -> dict:
    """The model, dataset, image size and batch size of the profile's main experiments (see `Profile`).

    ``full`` needs CIFAR-10 (downloaded once into `labkit.data.cache_dir`): when it is neither on disk nor
    downloadable (``$LABKIT_OFFLINE``, or its host does not answer within a few seconds: Kaggle with Internet
    off) it falls back to the small workload and says so loudly, once.

    Example:
        >>> workload(labkit.profile("quick"))
        {'model': 'small_cnn', 'dataset': 'shapes10', 'image_size': None, 'batch_size': 64}
    """
    prof = prof or profile()
    wanted = {"model": prof.model, "dataset": prof.dataset, "image_size": prof.image_size,
              "batch_size": prof.batch_size}
    # the small workload's data is generated here (`ci` runs it at a smaller batch); any other is downloaded
    problem = None if prof.dataset == SMALL_WORKLOAD["dataset"] else downloads.fetch_problem(prof.dataset)
    if problem is None:
        return wanted
    size = f" at {prof.image_size}x{prof.image_size}" if prof.image_size else ""
    note(f"WARNING: the {prof.name} profile's workload ({prof.model} on {prof.dataset}{size}) needs the network "
         f"for its data, and {problem}: falling back to small_cnn on shapes10. "
         "On a GPU that small model is bound by kernel launches, so the techniques show smaller effects "
         "than they would on the real workload.")
    return dict(SMALL_WORKLOAD)


def baseline(prof=None, **overrides) -> RunConfig:
    """Notebook 00's baseline: fine-tune the profile's pretrained `workload` for the profile's steps.

    Example:
        >>> cfg = baseline(labkit.profile("ci"), batch_size=32)
    """
    prof = prof or profile()
    values = {**workload(prof), "lr": 1e-3, "max_steps": prof.max_steps, "pretrained": True}
    check_keys(overrides, "baseline")
    values.update(overrides)
    return RunConfig(**values)


SMALL_WORKLOAD = {"model": "small_cnn", "dataset": "shapes10", "image_size": None, "batch_size": 64}


def field_names() -> list[str]:
    return [f.name for f in fields(RunConfig)]


def check_keys(values, source: str) -> None:
    """Raise `ConfigError` naming each key of ``values`` that is neither a `RunConfig` field nor an alias of one."""
    names = field_names()
    known = [*names, *ALIASES, *PRECISION_FLAGS]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source} key", key, f"a RunConfig field ({', '.join(names)}) or an alias of one "
                              f"({', '.join(ALIASES)}, bf16, fp16)", hint)


def canonical(values: dict, source: str, grad_accum: int = 1) -> dict:
    """``values`` in RunConfig's own names: every alias (`ALIASES`) renamed, transformers' ``optim`` names and
    ``bf16``/``fp16`` flags turned into ``optimizer``/``optimizer_impl`` and ``precision``, and
    ``per_device_train_batch_size`` (a micro-batch) into ``batch_size`` = it x ``grad_accum`` (``grad_accum``: the
    value when ``values`` has none). Two names for one field are an error.

    Example:
        >>> canonical({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 8, "optim": "adamw_8bit"}, "x")
        {'batch_size': 32, 'grad_accum': 8, 'optimizer': 'adamw8bit'}
    """
    check_keys(values, source)
    kept, named = {}, {}
    for key, value in values.items():
        name = ALIASES.get(key, "precision" if key in PRECISION_FLAGS else key)
        if key in PRECISION_FLAGS:
            if not isinstance(value, bool):
                raise ConfigError(key, value, f"True or False (True: precision='{key}')")
            if not value:
                continue
            value = key
        if name in kept:
            raise ConfigError(f"{source} key", key, f"one name for {name}: {named[name]!r} names it too")
        kept[name], named[name] = value, key
    if named.get("batch_size") == "per_device_train_batch_size" and is_int(kept["batch_size"]):
        kept["batch_size"] *= kept.get("grad_accum", grad_accum) if is_int(kept.get("grad_accum", 1)) else 1
    optimizer = kept.get("optimizer")
    if isinstance(optimizer, str) and optimizer in OPTIM_NAMES:
        kept["optimizer"], impl = OPTIM_NAMES[optimizer]
        if impl is not None and kept.setdefault("optimizer_impl", impl) != impl:
            raise ConfigError("optimizer_impl", kept["optimizer_impl"], f"{impl!r} or unset with "
                              f"{named['optimizer']}={optimizer!r}, which names the {impl} kernel")
    return kept

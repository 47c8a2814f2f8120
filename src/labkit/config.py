"""`RunConfig`: one frozen dataclass describing a run, validated on creation, loadable from YAML.

Details of the `RunConfig` fields that switch a technique on:

- ``optimizer``, ``lr``, ``weight_decay``, ``momentum``: ``adamw``, ``sgd`` (the only one with a ``momentum``),
  or bitsandbytes' 8-bit AdamW, ``adamw8bit`` (CPU and GPU) or ``paged_adamw8bit`` (CUDA only: its state can
  spill to CPU memory); the 8-bit ones need the ``bitsandbytes`` package (see `labkit.techniques.optimizers`).
- ``lr_warmup_steps``: raise the learning rate linearly over the first this-many optimizer steps (step ``s``
  uses ``lr * s / lr_warmup_steps``), then keep ``lr``; 0 (the default) means no warm-up. Large batches with a
  scaled-up ``lr`` need it (Goyal et al. 2017). Must be fewer than the run's optimizer steps (checked when the
  run starts).
- ``checkpointing``: gradient (activation) checkpointing of the model's blocks, recomputed in the backward pass
  instead of stored: False (off), True (every block its own segment) or an int, the number of checkpointed
  segments the blocks are split into (1 to the model's number of blocks, see
  `labkit.techniques.checkpointing.checkpoint_blocks`).
- ``freeze``: freeze the model's first stages: None or ``none`` (nothing), ``light``, ``medium``, ``heavy`` or
  ``head_only`` (only the head trains). Frozen parameters get no gradient and no optimizer state, and frozen
  BatchNorm layers stay in eval mode (see `labkit.techniques.freezing`, which has the table of what each level
  freezes per model).
- ``lora_rank``: every Linear layer that ``lora_targets`` names gets a frozen weight plus a trainable update
  ``(lora_alpha / rank) B A``, and everything else is frozen but the head (see `labkit.techniques.lora`).
- ``prune_amount``: after training, prune this share of every Conv/Linear weight by magnitude for inference. The
  pruned copy is scored and sized in ``RunResult.inference``; the trained model itself is left alone. With
  ``prune_structured`` that share of each convolution's output channels is removed and the layers rebuilt
  smaller (`labkit.techniques.pruning.prune_channels`) instead of single weights zeroed.
- ``optimizer_impl``: which of torch.optim's kernels AdamW/SGD use: ``forloop`` (a Python loop over the tensors),
  ``foreach`` (one multi-tensor kernel per operation) or ``fused`` (one kernel for the whole update); None lets
  torch pick (foreach on CUDA). Not for the 8-bit optimizers.
- Language models (``model`` in `labkit.models.language_models()`, ``dataset`` in `labkit.text.available()`):
  ``seq_len`` caps the tokens per row, ``packing`` says how rows are made (`labkit.text.batching`),
  ``attn_implementation`` picks the attention kernel, ``loss_chunks`` computes the output layer and the loss a
  slice of the sequence at a time (`labkit.techniques.chunked_loss`), ``compile`` compiles the decoder layers
  (`labkit.techniques.compiling`; needs ``packing`` ``pad_max`` or ``pack``). ``checkpointing=True`` checkpoints
  each decoder layer (`labkit.techniques.layer_checkpointing`); LoRA and freezing work as on the vision models.
  Pruning and quantization stay vision-only for now.
- ``quantize``: one of `labkit.choices.QUANTIZE_METHODS` or `SIMULATED_METHODS`; ``RunResult.inference`` holds
  the quantized copy's accuracy and serialised size. ``int8_static`` calibrates on training batches.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from . import data, downloads, models, text
from .choices import (
    ATTN_IMPLEMENTATIONS,
    EIGHT_BIT_OPTIMIZERS,
    FREEZE_LEVELS,
    LORA_ALL_LINEAR,
    LORA_DEFAULTS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PACKINGS,
    PRECISIONS,
    QUANTIZE_METHODS,
    SIMULATED_METHODS,
    check_choice,
    check_compile,
    check_lora,
    check_loss_chunks,
    lora_targets,
)
from .env import profile
from .errors import ConfigError
from .messages import note
from .validate import is_int, is_number

DEVICES_HINT = "'auto', 'cpu', 'cuda' or 'cuda:N'"
# Each choice's values and check live in `labkit.choices`, which the techniques import too.
__all__ = ["FREEZE_LEVELS", "LORA_ALL_LINEAR", "LORA_DEFAULTS", "OPTIMIZERS", "PRECISIONS", "RunConfig",
           "baseline", "check_keys", "field_names", "load_config", "parse_yaml", "save_config", "workload"]


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run. Override by keyword; invalid values raise `ConfigError`.

    Each field's comment says what it holds; the module docstring has the details of the techniques' fields.

    Example:
        >>> cfg = RunConfig(model="small_cnn", batch_size=128).replace(precision="bf16")
    """

    model: str = "small_cnn"  # a name from ``labkit.models.available()``
    dataset: str = "shapes10"  # a name from ``labkit.data.available()``
    batch_size: int = 64  # samples per optimizer step (split into ``grad_accum`` micro-batches)
    precision: str = "fp32"  # ``fp32``, ``fp16`` (autocast + GradScaler), ``bf16`` (autocast) or ``auto``
    optimizer: str = "adamw"  # ``adamw``, ``sgd``, ``adamw8bit`` or ``paged_adamw8bit`` (see the module docstring)
    lr: float = 1e-3  # the optimizer's learning rate
    lr_warmup_steps: int = 0  # linear learning-rate warm-up over this many optimizer steps; 0: none
    weight_decay: float = 0.0  # the optimizer's weight decay
    momentum: float = 0.9  # SGD's momentum (``sgd`` is the only optimizer with one)
    epochs: int = 1  # passes over the training set, unless ``max_steps`` is set
    max_steps: int | None = None  # train exactly this many optimizer steps (None: ``epochs`` decides)
    grad_accum: int = 1  # micro-batches per optimizer step; must divide ``batch_size``
    grad_clip: float | None = None  # clip the gradient norm to this value (None: no clipping)
    checkpointing: bool | int = False  # gradient checkpointing: False, True (every block) or a number of segments
    freeze: str | None = None  # None/``none``, ``light``, ``medium``, ``heavy`` or ``head_only``
    lora_rank: int | None = None  # train LoRA adapters of this rank instead of the model (None: no LoRA)
    lora_alpha: float = 16.0  # the LoRA update's scale is ``lora_alpha / lora_rank``
    # the Linear layers LoRA adapts: name suffixes (``["qkv"]`` on ``tiny_vit``) or ``"all-linear"`` (all but the head)
    lora_targets: tuple[str, ...] | str = LORA_ALL_LINEAR
    lora_dropout: float = 0.0  # dropout on the LoRA path's input
    prune_amount: float | None = None  # after training, prune this share of the weights for inference (None: no)
    prune_structured: bool = False  # remove whole conv output channels instead of zeroing single weights
    quantize: str | None = None  # after training (and pruning), quantize a copy for inference with this method
    # module names (``"stem"``, ``"head"``) or layer types (``"LayerNorm"``) that quantization leaves in float
    quantize_keep_float: tuple[str, ...] = ()
    seed: int = 0  # seeds data order, initialisation and augmentation
    device: str = "auto"  # ``auto``, ``cpu``, ``cuda`` or ``cuda:N``
    pretrained: bool = True  # start from pretrained weights (ImageNet online, labkit's own checkpoints offline)
    train_size: int | None = None  # training samples; None takes the profile's size
    tf32: bool = False  # allow TF32 for float32 matmuls/convolutions on Ampere+ (always set explicitly)
    channels_last: bool = False  # use the channels_last memory format for model and inputs
    evaluate: bool = True  # measure test accuracy after training
    image_size: int | None = None  # resize the inputs to this size on the device (None: the dataset's own)
    optimizer_impl: str | None = None  # torch.optim's kernels: ``forloop``, ``foreach``, ``fused`` (None: torch's pick)
    # language models only (a `labkit.models.language_models()` model on a `labkit.text.available()` dataset):
    seq_len: int | None = None  # the most tokens per row (None: the dataset's, `labkit.text.DEFAULT_SEQ_LENS`)
    packing: str = "pad"  # ``pad`` (to the batch's longest row), ``pad_max`` (to seq_len), ``pack`` (end to end)
    attn_implementation: str = "sdpa"  # ``sdpa`` (PyTorch's fused attention) or ``eager`` (softmax(QK^T) written out)
    loss_chunks: int | None = None  # the output layer and the loss over this many slices of the sequence (None: one)
    compile: bool = False  # torch.compile the decoder layers (compile time reported apart: RunResult.compile_time_s)

    def __post_init__(self):
        if self.model not in models.available() + models.language_models():
            raise ConfigError("model", self.model, f"one of {models.available() + models.language_models()}")
        if self.dataset not in data.available() + text.available():
            raise ConfigError("dataset", self.dataset, f"one of {data.available() + text.available()}")
        for name in ("batch_size", "epochs", "grad_accum"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(name, value, "a positive integer (1, 2, 3, ...)")
        for name in ("max_steps", "train_size"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise ConfigError(name, value, "None or a positive integer")
        if self.image_size is not None and (not is_int(self.image_size) or self.image_size < 16):
            raise ConfigError("image_size", self.image_size,
                              "None (the dataset's own size) or an integer >= 16 (images are resized to it)")
        if self.batch_size % self.grad_accum:
            raise ConfigError("grad_accum", self.grad_accum,
                              f"a divisor of batch_size={self.batch_size} (each micro-batch is "
                              "batch_size / grad_accum samples)")
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if not is_number(self.lr) or not self.lr > 0:
            raise ConfigError("lr", self.lr, "a finite number > 0")
        if not is_int(self.lr_warmup_steps) or self.lr_warmup_steps < 0:
            raise ConfigError("lr_warmup_steps", self.lr_warmup_steps, "an integer >= 0 (0: no warm-up)")
        for name in ("weight_decay", "momentum"):
            value = getattr(self, name)
            if not is_number(value) or value < 0:
                raise ConfigError(name, value, "a finite number >= 0")
        if self.grad_clip is not None and (not is_number(self.grad_clip) or not self.grad_clip > 0):
            raise ConfigError("grad_clip", self.grad_clip, "None or a finite number > 0")
        if not is_int(self.seed) or self.seed < 0:
            raise ConfigError("seed", self.seed, "an integer >= 0")
        if not isinstance(self.device, str) or not (
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")
        ):
            raise ConfigError("device", self.device, DEVICES_HINT)
        for name in ("pretrained", "tf32", "channels_last", "evaluate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")
        # Nothing is silently ignored: a field that would have no effect is an error.
        if self.max_steps is not None and self.epochs != 1:
            raise ConfigError("epochs", self.epochs, "1 (the default) when max_steps is set",
                              f"max_steps={self.max_steps} decides the length of the run; set one of the two")
        if self.optimizer != "sgd" and self.momentum != 0.9:
            raise ConfigError("momentum", self.momentum, "0.9 (the default) unless optimizer='sgd'",
                              f"{self.optimizer} has no momentum setting")
        if not isinstance(self.checkpointing, bool) and not (is_int(self.checkpointing) and self.checkpointing >= 1):
            raise ConfigError("checkpointing", self.checkpointing,
                              "False, True (every block its own segment) or an integer >= 1 (the number of "
                              "checkpointed segments)", "checkpointing=False turns it off")
        if is_int(self.checkpointing) and not models.is_language_model(self.model):  # the LM's: _check_language
            blocks = models.block_names(self.model)
            if self.checkpointing > len(blocks):
                raise ConfigError("checkpointing", self.checkpointing,
                                  f"False, True or 1 to {len(blocks)}: {self.model} has {len(blocks)} blocks "
                                  f"({', '.join(blocks)}), and a segment holds at least one")
        if self.freeze is not None:
            check_choice("freeze", self.freeze, FREEZE_LEVELS, "None or one of", "('head_only': only the head trains)")
        self._check_lora()
        self._check_inference()
        self._check_language()

    def _check_language(self) -> None:
        """The language-model fields; on a vision run they must keep their defaults (they would do nothing)."""
        if self.optimizer_impl is not None:
            check_choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS, "None (torch's default) or one of")
            if self.optimizer in EIGHT_BIT_OPTIMIZERS:
                raise ConfigError("optimizer_impl", self.optimizer_impl, f"None with optimizer={self.optimizer!r}",
                                  "bitsandbytes' 8-bit optimizers have their own kernels")
        language = models.is_language_model(self.model)
        if language != (self.dataset in text.available()):
            allowed = text.available() if language else data.available()
            kind = "a language model" if language else "a vision model"
            raise ConfigError("dataset", self.dataset, f"one of {allowed}: {self.model} is {kind}")
        defaults = {"seq_len": None, "packing": "pad", "attn_implementation": "sdpa", "loss_chunks": None,
                    "compile": False}
        if not language:
            for name, default in defaults.items():
                if getattr(self, name) != default:
                    raise ConfigError(name, getattr(self, name), f"{default!r} (the default) for {self.model}, a "
                                      f"vision model", f"it applies to the language models {models.language_models()}")
            return
        check_choice("packing", self.packing, PACKINGS)
        check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        seq_len = text.resolve_seq_len(self.dataset, self.seq_len)
        if seq_len > models.max_positions(self.model):
            raise ConfigError("seq_len", self.seq_len, f"at most {models.max_positions(self.model)}, the longest "
                              f"sequence {self.model} takes (max_position_embeddings)")
        check_loss_chunks(self.loss_chunks, seq_len)
        check_compile(self.compile, self.packing)
        if self.checkpointing not in (False, True):
            raise ConfigError("checkpointing", self.checkpointing, f"False or True for the language model "
                              f"{self.model}", "True checkpoints every decoder layer (transformers' own "
                              "per-layer checkpointing); it has no segments to count")
        # Not on language models yet: refused rather than silently ignored.
        for name, default in {"prune_amount": None, "quantize": None, "channels_last": False,
                              "image_size": None}.items():
            if getattr(self, name) != default:
                raise ConfigError(name, getattr(self, name), f"{default!r} for the language model {self.model}",
                                  "labkit prunes and quantizes the vision models only, for now")

    def _check_inference(self) -> None:
        """The fields that turn the trained model into the one deployed (pruned, quantized)."""
        if self.prune_amount is not None and (not is_number(self.prune_amount) or not 0 < self.prune_amount < 1):
            raise ConfigError("prune_amount", self.prune_amount, "None (no pruning) or a share in (0, 1), e.g. 0.5")
        if not isinstance(self.prune_structured, bool):
            raise ConfigError("prune_structured", self.prune_structured, "True or False")
        if self.prune_structured and self.prune_amount is None:
            raise ConfigError("prune_structured", self.prune_structured, "False (the default) unless prune_amount "
                              "is set", "prune_amount says how many channels to remove")
        if self.quantize is not None:
            check_choice("quantize", self.quantize, [*QUANTIZE_METHODS, *SIMULATED_METHODS],
                         "None (no quantization) or one of")
        keep = self.quantize_keep_float
        if isinstance(keep, str):
            keep = (keep,)
        if not isinstance(keep, (list, tuple)) or not all(isinstance(k, str) and k for k in keep):
            raise ConfigError("quantize_keep_float", keep, "a list of module names or layer types (e.g. ['head'])")
        object.__setattr__(self, "quantize_keep_float", tuple(keep))
        if keep and self.quantize is None:
            raise ConfigError("quantize_keep_float", list(keep), "[] (the default) unless quantize is set",
                              "without quantize nothing is quantized, so nothing is kept in float")

    def _check_lora(self) -> None:
        targets = lora_targets(self.lora_targets, "lora_targets")
        if not isinstance(self.lora_targets, str):  # YAML gives a list; a frozen config keeps a tuple
            object.__setattr__(self, "lora_targets", targets)
        if self.lora_rank is None:
            for name, default in LORA_DEFAULTS.items():
                if getattr(self, name) != default:
                    raise ConfigError(name, getattr(self, name), f"{default!r} (the default) unless lora_rank is set",
                                      "without lora_rank there are no LoRA adapters for it to change")
            return
        if not is_int(self.lora_rank) or self.lora_rank < 1:
            raise ConfigError("lora_rank", self.lora_rank, "None (no LoRA) or a positive integer (1, 2, 4, 8, ...)")
        check_lora(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets,
                   fields=("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"))
        if self.freeze not in (None, "none"):
            raise ConfigError("freeze", self.freeze, "None when lora_rank is set",
                              "LoRA already freezes everything but its adapters and the head")

    def replace(self, **changes) -> RunConfig:
        """A copy with ``changes`` applied (and validated). Unknown names raise `ConfigError`."""
        check_keys(changes, "RunConfig")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields as plain values (a tuple as a list, as JSON and YAML give it back)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict, source: str = "RunConfig") -> RunConfig:
        """Build from a mapping; unknown keys are an error, never ignored."""
        if not isinstance(values, dict):
            raise ConfigError(source, values, "a mapping of RunConfig fields (key: value)")
        check_keys(values, source)
        return cls(**values)


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
    """Raise `ConfigError` naming each key of ``values`` that is not a `RunConfig` field."""
    names = field_names()
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source} key", key, f"a RunConfig field ({', '.join(names)})", hint)


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; a lab config means the number."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$|" r"^[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?$|"
               r"^[-+]?[0-9][0-9_]*\.[0-9_]*$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, source: str):
    """Parse YAML text, reading ``1e-3`` as a float; a syntax error becomes a `ConfigError` naming ``source``."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(source, text if len(text) < 60 else text[:57] + "...", "valid YAML", str(exc)) from exc


def load_config(path: str | Path) -> RunConfig:
    """Load a `RunConfig` from a YAML mapping; unknown keys and non-mappings raise `ConfigError`.

    Example:
        >>> cfg = labkit.load_config("recipe.yaml")
    """
    path = Path(path)
    loaded = parse_yaml(path.read_text(), path.name)
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path.name}", type(loaded).__name__,
                          "a YAML mapping of RunConfig fields (e.g. 'batch_size: 64')")
    return RunConfig.from_dict(loaded, source=path.name)


def save_config(cfg: RunConfig, path: str | Path) -> Path:
    """Write ``cfg`` as YAML; `load_config` reads it back unchanged."""
    path = Path(path)
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return path

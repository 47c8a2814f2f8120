"""LoRA (low-rank adaptation), the mechanism: what ``RunConfig(lora_rank=...)`` does to a model.

A fine-tune changes a pretrained weight ``W`` (out x in) by some ``ΔW``. LoRA (Hu et al. 2021) keeps ``W``
frozen and learns that change as a product of two thin matrices, ``ΔW = (alpha / rank) * B @ A`` with
``A`` (rank x in) and ``B`` (out x rank):

    y = W x + b + (alpha / rank) * B (A dropout(x))

- ``A`` starts Kaiming-uniform (as ``nn.Linear`` initialises a weight) and ``B`` at zeros, so the adapted
  layer starts out exactly equal to the pretrained one, and ``B`` receives the first gradients.
- ``alpha / rank`` keeps the update's size roughly independent of the rank: with alpha fixed, doubling the
  rank does not call for a new learning rate (the paper sets alpha once and leaves it).
- A layer of ``in`` inputs and ``out`` outputs trains ``rank * (in + out)`` numbers instead of ``in * out``.
- ``merge()`` adds ``ΔW`` into ``W`` for inference (no extra matmul, the base model's latency);
  ``unmerge()`` subtracts it again to go on training.

- `LoRALinear`: one adapted Linear (any ``nn.Linear``, bitsandbytes' 4-bit ``Linear4bit`` included: QLoRA).
- `add_lora`: adapt every Linear whose qualified name ends with one of ``targets``; freeze everything else
  but a labkit vision model's head. It works on any ``nn.Module`` (labkit's models, transformers models). After it,
  the parameters that train are the adapters (names contain ``lora_``) and, for a model from
  ``labkit.models.build``, its head (a new task's classifier has to learn from scratch); everything else has
  ``requires_grad=False``. A language model's output layer is pretrained for the vocabulary it keeps, so it
  stays frozen, as PEFT leaves it.
- `lora_layers`, `merge_lora`, `unmerge_lora`, `merge_and_unload`, `lora_state_dict`, `linear_names`,
  `matching_linears`, `adapter_numel`: inspect, merge, save.

Names follow PEFT's (``lora_A``, ``lora_B``, ``lora_dropout``, target suffixes matched on whole name parts,
``all-linear``), so that a labkit LoRA model and ``peft.get_peft_model`` with the same targets train the same
parameters (`labkit.labs.lora` checks it). Notebook 08's measurements are in `labkit.labs.lora`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import models
from ..choices import LORA_ALL_LINEAR, check_lora, lora_targets
from ..errors import ConfigError, UnsupportedError

ALL_LINEAR = LORA_ALL_LINEAR  # PEFT's name for "every Linear layer but the output layer"


def _is_float_weight(weight: torch.Tensor) -> bool:
    return weight.dtype.is_floating_point and type(weight) in (nn.Parameter, torch.Tensor)


class LoRALinear(nn.Module):
    """A frozen Linear layer plus a trainable low-rank update: ``base(x) + (alpha / rank) * B A dropout(x)``.

    Args:
        base: the Linear layer to adapt (an ``nn.Linear``, e.g. ``Linear4bit``); its weight and bias are frozen.
        rank: the inner size of the update, 1 to ``min(in_features, out_features)``.
        alpha: the update is scaled by ``alpha / rank``.
        dropout: dropout on the LoRA path's input (the frozen path sees the input unchanged).
        dtype: the adapters' dtype; by default the base weight's, or float32 over a quantized base (as QLoRA does).

    Example:
        >>> layer = LoRALinear(nn.Linear(128, 384), rank=8, alpha=16)
        >>> layer.lora_A.shape, layer.lora_B.shape
        (torch.Size([8, 128]), torch.Size([384, 8]))
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ConfigError("base", type(base).__name__,
                              "an nn.Linear (or a subclass such as bitsandbytes' Linear4bit)")
        check_lora(rank, alpha, dropout, ALL_LINEAR)
        in_features, out_features = base.in_features, base.out_features
        if rank > min(in_features, out_features):
            raise ConfigError("rank", rank, f"at most min(in, out) = {min(in_features, out_features)} for a Linear "
                                            f"{in_features} -> {out_features} (a higher rank is no longer low-rank)")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.scaling = int(rank), float(alpha), float(alpha) / int(rank)
        weight = base.weight
        if dtype is None:
            dtype = weight.dtype if _is_float_weight(weight) else torch.float32
        device = weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's own initialisation (and PEFT's)
        self.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if self.merged:  # the update is inside base.weight
            return out
        h = self.lora_dropout(x).to(self.lora_A.dtype)
        update = (h @ self.lora_A.t()) @ self.lora_B.t()  # two thin matmuls; B @ A is never formed
        return out + (update * self.scaling).to(out.dtype)

    def delta_weight(self) -> torch.Tensor:
        """The update as a full matrix: ``(alpha / rank) * B @ A`` (out x in)."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def _check_mergeable(self, action: str) -> None:
        if not _is_float_weight(self.base.weight):
            raise UnsupportedError(action, type(self.base).__name__,
                                   f"the base weight is stored as {self.base.weight.dtype} "
                                   f"({type(self.base.weight).__name__}), "
                                   "not a float tensor the update can be added to",
                                   "keep the adapters unmerged (QLoRA does), or dequantize the base first")

    @torch.no_grad()
    def merge(self) -> LoRALinear:
        """Add the update into the base weight, so that the layer runs at the base layer's cost."""
        if not self.merged:
            self._check_mergeable("merge")
            self.base.weight += self.delta_weight().to(self.base.weight.dtype)
            self.merged = True
        return self

    @torch.no_grad()
    def unmerge(self) -> LoRALinear:
        """Subtract the update from the base weight again (to go on training the adapters)."""
        if self.merged:
            self._check_mergeable("unmerge")
            self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
            self.merged = False
        return self

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, scaling={self.scaling:g}, merged={self.merged}"


def adapter_numel(in_features: int, out_features: int, rank: int) -> int:
    """How many numbers LoRA trains on one Linear layer: ``rank * (in + out)`` (A is rank x in, B out x rank)."""
    return rank * (in_features + out_features)


def linear_names(model: nn.Module) -> list[str]:
    """The qualified names of the model's Linear layers, in module order (what ``targets`` can name)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def _name_matches(name: str, target: str) -> bool:
    # Whole name parts only, as PEFT matches: "v" names "attn.v" but not "attn.qkv".
    return name == target or name.endswith("." + target)


def _head_names(model: nn.Module) -> set[str]:
    """Module names inside the output layer: a labkit model's head stage, a transformers model's classifier."""
    inner = models.unwrap(model)
    if _labkit_head(inner) is not None:
        ids = {id(m) for m in _labkit_head(inner).modules()}
    else:
        getter = getattr(inner, "get_output_embeddings", None)
        output = getter() if callable(getter) else None
        ids = {id(m) for m in output.modules()} if isinstance(output, nn.Module) else set()
        for attribute in ("classifier", "score", "lm_head", "head"):  # transformers' classification heads
            module = getattr(inner, attribute, None)
            if isinstance(module, nn.Module):
                ids |= {id(m) for m in module.modules()}
    return {name for name, module in model.named_modules() if id(module) in ids}


def _labkit_head(model: nn.Module) -> nn.Module | None:
    """A labkit model's head stage (``labkit.models.named_stages``), None for any other model."""
    try:
        return models.named_stages(model)[-1][1]
    except ConfigError:
        return None


def trained_head(model: nn.Module) -> nn.Module | None:
    """The stage `add_lora` trains in full beside the adapters: a labkit vision model's head, else None.

    A new task's classifier learns from scratch; a language model's output layer is pretrained for the vocabulary
    it keeps and stays frozen, as PEFT leaves it (its ``modules_to_save`` names what else to train).
    """
    inner = models.unwrap(model)
    return None if models.is_language_model(getattr(inner, "labkit_name", None)) else _labkit_head(inner)


def matching_linears(model: nn.Module, targets) -> list[str]:
    """The Linear layers ``targets`` names; raises `ConfigError` for a target that names no Linear layer.

    Each qualified name equal to a target or ending with ``.target``; ``"all-linear"`` names every Linear but
    the output layer (a labkit model's head, a transformers model's classifier or output embeddings).

    Example:
        >>> matching_linears(tiny_vit, ["qkv"])
        ['block1.attn.qkv', 'block2.attn.qkv', 'block3.attn.qkv', 'block4.attn.qkv']
    """
    targets = lora_targets(targets)
    linears = linear_names(model)
    if ALL_LINEAR in targets:  # alone: `lora_targets` refuses it beside other names
        head = _head_names(model)
        return [name for name in linears if name not in head]
    modules = dict(model.named_modules())
    chosen = []
    for target in targets:
        hits = [name for name in modules if name and _name_matches(name, target)]
        linear_hits = [name for name in hits if name in linears]
        if not linear_hits:
            found = (f"it names {', '.join(f'{n} ({type(modules[n]).__name__})' for n in hits[:4])}, which "
                     "are not Linear layers" if hits else "it matches no module")
            raise ConfigError("targets", target,
                              f"the end of a Linear layer's name ({found}); this model's Linear layers: "
                              f"{_shorten(linears)}")
        chosen += [name for name in linear_hits if name not in chosen]
    return [name for name in linears if name in chosen]  # module order


def _shorten(names: list[str], keep: int = 12) -> str:
    shown = ", ".join(names[:keep])
    return shown + (f", ... ({len(names)} in all)" if len(names) > keep else "")


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's `LoRALinear` layers by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def add_lora(model: nn.Module, rank: int, alpha: float, targets, dropout: float = 0.0,
             dtype: torch.dtype | None = None) -> nn.Module:
    """Replace each Linear that ``targets`` names by a `LoRALinear`; freeze the rest but `trained_head`.

    Args:
        model: changed in place and returned.
        rank: the adapters' inner size, 1 to the smallest ``min(in, out)`` of the chosen layers.
        alpha: the update is scaled by ``alpha / rank``.
        targets: name suffixes (``["qkv"]``) matched on whole name parts, or ``"all-linear"``; see `matching_linears`.
        dropout: dropout on the LoRA path.
        dtype: the adapters' dtype (default: each base weight's; float32 over a quantized base).

    Example:
        >>> model = add_lora(models.build("tiny_vit", 10)[0], rank=8, alpha=16, targets=["qkv"])
        >>> labkit.measure.count_parameters(model)  # (total, trainable)
    """
    check_lora(rank, alpha, dropout, targets)
    if lora_layers(model):
        raise ConfigError("model", type(model).__name__,
                          f"a model without LoRA layers (it has {len(lora_layers(model))}: merge and keep them, or "
                          "build the model again)")
    names = matching_linears(model, targets)
    modules = dict(model.named_modules())
    too_small = [f"{n} ({modules[n].in_features} -> {modules[n].out_features})" for n in names
                 if rank > min(modules[n].in_features, modules[n].out_features)]
    if too_small:
        raise ConfigError("rank", rank,
                          f"at most min(in, out) of every chosen layer; too small for {_shorten(too_small, 4)}")
    for p in model.parameters():
        p.requires_grad_(False)
    head = trained_head(model)
    if head is not None:
        head.requires_grad_(True)
    for name in names:
        _set_submodule(model, name, LoRALinear(modules[name], rank, alpha, dropout, dtype=dtype))
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge every `LoRALinear` of the model (see `LoRALinear.merge`); returns the model."""
    for layer in lora_layers(model).values():
        layer.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Undo `merge_lora`; returns the model."""
    for layer in lora_layers(model).values():
        layer.unmerge()
    return model


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only what a LoRA fine-tune changed: the adapters and any other trainable tensor (a head).

    This is what to save per task: a few hundred kB beside one shared copy of the base model.
    """
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach() for k, v in model.state_dict().items() if "lora_" in k or k in trainable}


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Merge every `LoRALinear` and put its base Linear back in its place: a plain model, as fast as the base.

    Changes ``model`` in place and returns it (copy it first to keep the adapters).
    """
    for name, layer in lora_layers(model).items():
        layer.merge()
        _set_submodule(model, name, layer.base)
    return model

"""Layer freezing, the mechanism: what ``RunConfig(freeze=...)`` does to a model.

Freezing a stage is two things, and both are needed:

1. ``p.requires_grad_(False)`` on each of its parameters: autograd computes no gradient for them, the
   optimizer (built over the parameters that still require one) keeps no state for them, and, when the
   frozen stages come first, autograd records nothing for them at all: no saved activations, no backward.
2. its BatchNorm layers normalise with their running statistics and stop updating them, whatever
   ``model.train()`` says: in training mode they would normalise with each batch's statistics and keep
   updating their running statistics, so a "frozen" stage would still change what it computes. In your own
   loop, ``layer.eval()`` after every ``model.train()``; `freeze` makes that automatic with a forward pre-hook
   (`eval_before_forward`); torchvision's ``FrozenBatchNorm2d`` replaces the layer by one with no training mode.

Levels map onto every model's named stages (`labkit.models.named_stages`: stem ... head). The body is
every stage before the head; a level says how many of the body's **last** stages keep training:

=============  ===========================  ==========================  ================================
level          small_cnn                    resnet18 / resnet50         shufflenet_v2_x0_5 / _x1_0
=============  ===========================  ==========================  ================================
``none``       nothing frozen               nothing frozen              nothing frozen
``light``      stem (3 blocks train)        stem, layer1                stem, stage2
``medium``     stem, block1                 stem, layer1, layer2        stem, stage2, stage3
``heavy``      stem, block1, block2         stem, layer1-3              stem, stage2-4 (conv5 trains)
``head_only``  stem, block1-3               stem, layer1-4              stem, stage2-4, conv5
=============  ===========================  ==========================  ================================

(``light`` trains the last 3 body stages, ``medium`` the last 2, ``heavy`` the last 1, ``head_only`` none;
at least the stem is frozen from ``light`` on.) Early stages hold generic features (edges, textures) and
few parameters; late stages hold task-specific features and most parameters.

- `frozen_stages`: a level (or a list of stage names) -> the stage names it freezes.
- `freeze`, `unfreeze`, `frozen_stage_names`, `is_frozen_batchnorm`: apply and inspect.
- `gradual_unfreeze`: unfreeze the body from the top, one stage every ``every`` steps (ULMFiT).
- `discriminative_param_groups`: optimizer parameter groups with a learning rate per stage.
- `cache_features`: with the whole body frozen, compute its output once and train the head on it.

`freeze` keeps the stages frozen before frozen (use `unfreeze` to thaw). Build the optimizer afterwards over
the parameters that still require a gradient (labkit's `labkit.techniques.optimizers.build_optimizer` does), or
over all of them: a parameter without a gradient gets no update and no state either. Its
``batchnorm_eval=False`` freezes the parameters only, as ``requires_grad_(False)`` alone does: the layers then
normalise each batch with its own statistics and their running statistics keep moving (notebook 05 shows what
that does).

Notebook 05's measurements of what freezing saves and costs are in `labkit.labs.freezing`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from .. import models
from ..choices import FREEZE_LEVELS
from ..errors import ConfigError
from ..messages import note
from ..validate import is_int, is_number

LEVELS = FREEZE_LEVELS  # ("none", "light", "medium", "heavy", "head_only")
# How many of the body's last stages keep training at each level (the rest of the body is frozen).
TRAINABLE_BODY_STAGES = {"light": 3, "medium": 2, "heavy": 1, "head_only": 0}


def _stage_names(model_or_name) -> list[str]:
    if isinstance(model_or_name, str):
        return [*models.block_names(model_or_name), "head"]
    return [name for name, _ in models.named_stages(model_or_name)]


def frozen_stages(model_or_name: nn.Module | str, level) -> list[str]:
    """The stages ``level`` freezes, in forward order (see the module's table).

    Args:
        model_or_name: a model from `labkit.models.build` (wrappers are removed) or a model name.
        level: ``None``/``"none"``, ``"light"``, ``"medium"``, ``"heavy"``, ``"head_only"``, or a list of stage names.

    Example:
        >>> frozen_stages("resnet18", "heavy")
        ['stem', 'layer1', 'layer2', 'layer3']
    """
    names = _stage_names(model_or_name)
    if level is None or level == "none":
        return []
    if isinstance(level, str):
        if level not in TRAINABLE_BODY_STAGES:
            raise ConfigError("freeze", level, f"None, one of {list(LEVELS)} or a list of stage names from "
                                               f"{names}")
        body = names[:-1]
        return body[:max(1, len(body) - TRAINABLE_BODY_STAGES[level])]
    if isinstance(level, Iterable) and not isinstance(level, (bytes, dict)):
        wanted = list(level)
        unknown = [n for n in wanted if n not in names]
        if not wanted or unknown:
            raise ConfigError("freeze", level, f"a level ({', '.join(LEVELS)}) or a non-empty list of stage names "
                                               f"from {names}" + (f"; not stages: {unknown}" if unknown else ""))
        return [n for n in names if n in wanted]
    raise ConfigError("freeze", level, f"None, one of {list(LEVELS)} or a list of stage names from {names}")


FROZEN = "labkit_frozen_batchnorm"  # marks a BatchNorm layer that `freeze` keeps in eval mode


def eval_before_forward(module: nn.Module, args) -> None:
    """A frozen BatchNorm layer's forward pre-hook: ``module.eval()`` before every forward.

    The layer then normalises with its running statistics and leaves them alone, whatever ``model.train()``
    said before. A hook is plain data on the module: ``copy.deepcopy``, pickling, ``.to(device)`` and
    ``load_state_dict`` keep it, and the state_dict has no extra key.
    """
    module.eval()


def is_frozen_batchnorm(module: nn.Module) -> bool:
    """Whether ``module`` is a BatchNorm layer that `freeze` keeps in eval mode (`eval_before_forward`).

    Example:
        >>> freeze(model, "heavy")
        >>> sum(map(is_frozen_batchnorm, model.modules()))
    """
    return bool(getattr(module, FROZEN, None))


def _batchnorms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def freeze(model: nn.Module, level, batchnorm_eval: bool = True) -> nn.Module:
    """Freeze the stages ``level`` names: no gradient, hence no optimizer state, and BatchNorm in eval mode.

    Args:
        model: a model from `labkit.models.build` (a wrapped one is unwrapped); changed in place and returned.
        level: a level from `LEVELS` or a list of stage names (see `frozen_stages`).
        batchnorm_eval: keep the frozen BatchNorm layers in eval mode (`eval_before_forward`; True, the right thing).

    A parameter a training stage shares with a frozen one (a tied output layer and its embeddings) is untied first
    (`untie_from_frozen`): the output layer trains a copy of its own, the embeddings stay frozen.

    Raises:
        ConfigError: an unknown level or stage, or a choice that leaves no parameter to train.

    Example:
        >>> model = freeze(labkit.models.build("resnet18", 10)[0], "heavy")
        >>> [p.requires_grad for p in model.layer3.parameters()][0], model.layer4.conv1.weight.requires_grad
        (False, True)
    """
    m = models.unwrap(model)
    names = frozen_stages(m, level)
    untied = untie_from_frozen(m, names)
    if untied:
        note(f"{', '.join(untied)} was tied to the weights of a frozen stage (the token embeddings): it now trains as "
             "a copy of its own, untied, as PEFT's modules_to_save does (its parameters counted as trainable); the "
             "embeddings stay frozen")
    stages = dict(models.named_stages(m))
    frozen = {id(p) for name in names for p in stages[name].parameters()}
    if names and not any(p.requires_grad and id(p) not in frozen for p in m.parameters()):
        name = getattr(m, "labkit_name", type(m).__name__)
        raise ConfigError("freeze", level, f"a level or stages that leave at least one parameter to train (this "
                                           f"freezes every parameter of {name}: nothing would learn)",
                          "'head_only' freezes everything but the head")
    for name in names:
        for p in stages[name].parameters():
            p.requires_grad_(False)
        if batchnorm_eval:
            for bn in _batchnorms(stages[name]):
                if not is_frozen_batchnorm(bn):
                    bn.register_forward_pre_hook(eval_before_forward)
                    setattr(bn, FROZEN, True)
                bn.eval()
    return model


def untie_from_frozen(model: nn.Module, frozen: Sequence[str]) -> list[str]:
    """Give each training stage its own copy of a parameter it shares with a ``frozen`` stage; returns their names.

    A tied output layer (SmolLM2, Qwen2.5: ``lm_head.weight is embed_tokens.weight``) is one matrix in two stages:
    freezing the embeddings would freeze the output layer the head is meant to train, and training the shared matrix
    would train the embeddings too, through a backward pass down the whole frozen body. A copy of its own trains
    alone (PEFT's ``modules_to_save`` does the same), at the cost of one more vocab x hidden matrix. A transformers
    model's ``config.tie_word_embeddings`` is set False, so that nothing ties them again.

    Args:
        model: a model from `labkit.models` (changed in place). frozen: the stage names `freeze` freezes.
    """
    stages = models.named_stages(model)
    frozen_ids = {id(p) for name, stage in stages if name in frozen for p in stage.parameters()}
    untied = []
    for name, stage in stages:
        if name in frozen:
            continue
        for key, p in list(stage.named_parameters()):
            if id(p) in frozen_ids:
                owner, attr = stage.get_submodule(key.rpartition(".")[0]), key.rpartition(".")[2]
                setattr(owner, attr, nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
                untied.append(_qualified_name(model, owner, attr))
    if untied and hasattr(getattr(model, "config", None), "tie_word_embeddings"):
        model.config.tie_word_embeddings = False
    return untied


def _qualified_name(model: nn.Module, owner: nn.Module, attr: str) -> str:
    return next((f"{name}.{attr}" if name else attr for name, module in model.named_modules() if module is owner), attr)


def unfreeze(model: nn.Module, stages: Sequence[str] | None = None) -> list[str]:
    """Let the named stages (default: all) train again; their BatchNorm layers follow the model's mode.

    Returns:
        The stage names unfrozen, in forward order.

    Example:
        >>> unfreeze(model, ["layer4"])
        ['layer4']
    """
    m = models.unwrap(model)
    named = dict(models.named_stages(m))
    names = list(named) if stages is None else frozen_stages(m, list(stages))
    for name in names:
        for p in named[name].parameters():
            p.requires_grad_(True)
        for bn in _batchnorms(named[name]):
            if is_frozen_batchnorm(bn):
                for key in [k for k, hook in bn._forward_pre_hooks.items() if hook is eval_before_forward]:
                    del bn._forward_pre_hooks[key]
                delattr(bn, FROZEN)
            bn.train(m.training)
    return names


def frozen_stage_names(model: nn.Module) -> list[str]:
    """The stages none of whose parameters require a gradient, in forward order."""
    return [name for name, stage in models.named_stages(model)
            if any(True for _ in stage.parameters()) and not any(p.requires_grad for p in stage.parameters())]


def gradual_unfreeze(model: nn.Module, step: int, every: int) -> list[str]:
    """Gradual unfreezing (Howard & Ruder 2018, ULMFiT): one more body stage trains every ``every`` steps.

    At optimizer step ``step`` (0-based) the last ``step // every`` body stages train, unfrozen from the top
    down. Call it before each step of a model frozen at ``head_only``; build the optimizer over **all**
    parameters once, at the start: a frozen parameter has no gradient, so AdamW skips it and keeps no state
    for it until it thaws. Stages are only ever unfrozen here, never frozen again.

    Returns:
        The stage names unfrozen by this call (usually none).

    Example:
        >>> freeze(model, "head_only"); optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> for step, (x, y) in enumerate(batches):
        ...     gradual_unfreeze(model, step, every=20); train_step(model, x, y, optimizer)
    """
    if not is_int(step) or step < 0:
        raise ConfigError("step", step, "an integer >= 0 (the 0-based optimizer step)")
    if not is_int(every) or every < 1:
        raise ConfigError("every", every, "a positive integer (optimizer steps between two unfreezings)")
    body = models.block_names(model)
    thawed = body[len(body) - min(len(body), step // every):]
    frozen = set(frozen_stage_names(model))
    due = [name for name in thawed if name in frozen]
    return unfreeze(model, due) if due else []


def discriminative_param_groups(model: nn.Module, lr: float, decay: float = 1 / 2.6,
                                trainable_only: bool = True) -> list[dict]:
    """Optimizer parameter groups, one per stage: ``lr`` for the head, ``lr * decay**k`` for the k-th stage before it.

    Discriminative learning rates (Howard & Ruder 2018 use ``decay = 1/2.6``): early stages, whose generic
    features need little change, move slowly; the new head moves at the full rate. Each group carries its
    ``stage`` name.

    Args:
        model: a model from `labkit.models.build`.
        lr: the head's learning rate.
        decay: the factor per stage towards the stem, in (0, 1].
        trainable_only: leave out parameters that need no gradient (False: keep them for a `gradual_unfreeze`).

    Example:
        >>> torch.optim.AdamW(discriminative_param_groups(model, lr=1e-3, decay=0.5))
    """
    if not is_number(lr) or lr <= 0:
        raise ConfigError("lr", lr, "a finite number > 0")
    if not is_number(decay) or not 0 < decay <= 1:
        raise ConfigError("decay", decay, "a number in (0, 1] (1: the same lr everywhere)")
    stages = models.named_stages(model)
    groups = []
    for depth, (name, stage) in enumerate(reversed(stages)):
        params = [p for p in stage.parameters() if p.requires_grad or not trainable_only]
        if params:
            groups.append({"params": params, "lr": lr * decay**depth, "stage": name})
    groups.reverse()  # forward order, stem first
    if not groups:
        raise ConfigError("model", type(models.unwrap(model)).__name__, "a model with trainable parameters")
    return groups


@torch.no_grad()
def cache_features(model: nn.Module, inputs: Iterable[torch.Tensor]) -> torch.Tensor:
    """The frozen body's output for each batch of model ``inputs``, concatenated along the batch.

    Computed once, so that the head can train on it for any number of epochs (`labkit.models.forward_head`).
    The body must be frozen with its BatchNorm layers in eval mode (``freeze(model, "head_only")``):
    then it computes the same features every epoch, and training the head on the cache is the same
    training as through the whole network.

    Example:
        >>> features = cache_features(model, (x for x, _ in batches))
        >>> logits = labkit.models.forward_head(model, features[:64])
    """
    m = models.unwrap(model)
    stages = dict(models.named_stages(m))
    body = models.block_names(m)
    moving = [name for name in body if any(p.requires_grad for p in stages[name].parameters())
              or any(bn.training and not is_frozen_batchnorm(bn) for bn in _batchnorms(stages[name]))]
    if moving:
        raise ConfigError("model", f"trainable or train-mode stages {moving}",
                          "a model whose whole body is frozen with BatchNorm in eval mode "
                          "(freeze(model, 'head_only')): otherwise the features change as it trains")
    out = []
    for x in inputs:
        for name in body:
            x = stages[name](x)
        out.append(x)
    if not out:
        raise ConfigError("inputs", "no batches", "at least one batch of model inputs")
    return torch.cat(out)

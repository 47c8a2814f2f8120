"""Models by name (`available`, `build`), where their starting weights come from (`WeightsInfo`), and their
stages stem ... head for freezing, blocks for checkpointing and the head for a new task."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..downloads import download_timeout
from ..env import OFFLINE_ENV, SHRINK_ENV, is_online, shrink_requested  # noqa: F401 - is_online: this module's API
from ..errors import ConfigError, LabkitError
from ..messages import note
from .architectures import RESNET_LAYOUTS, SmallCNN, TinyViT, shrunk_resnet
from .checkpoints import (
    SHIPPED_CHECKPOINTS,
    _read_manifest,
    checkpoint_dir,
    load_checkpoint,
    write_checkpoint,
)
from .hub import HUB_MODELS, build_hub_model
from .language import LANGUAGE_MODELS, build_llama, is_language_model, language_stages
from .own import build_own_language_model, is_own_language_model
from .own_vision import build_own_vision_model, is_own_vision_model

_VOCAB_KEYS = ("model.embed_tokens.weight", "lm_head.weight")  # a Llama's vocabulary-sized weights

# Model name -> family; a family decides the stage layout.
_FAMILIES = {
    "small_cnn": "small_cnn",
    "resnet18": "resnet",
    "resnet50": "resnet",
    "shufflenet_v2_x0_5": "shufflenet",
    "shufflenet_v2_x1_0": "shufflenet",
    "tiny_vit": "tiny_vit",  # labkit's own Linear-heavy model (notebook 06: quantization)
}


def available() -> list[str]:
    """The model names `build` accepts.

    Example:
        >>> labkit.models.available()[0]
        'small_cnn'
    """
    return list(_FAMILIES)


@dataclass
class WeightsInfo:
    """Where a model's starting weights came from.

    Attributes:
        source: ``imagenet``, ``labkit:<checkpoint file>`` or ``random``.
        warning: why the weights are not what was asked for (None when they are).
    """

    source: str
    warning: str | None = None


def _construct(name: str, num_classes: int) -> nn.Module:
    if name == "small_cnn":
        return SmallCNN(num_classes)
    if name == "tiny_vit":
        return TinyViT(num_classes)
    if name in RESNET_LAYOUTS and shrink_requested():  # `full`'s ResNet at CPU size ($LABKIT_SHRINK)
        return shrunk_resnet(name, num_classes)
    import torchvision

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if name.startswith("shufflenet"):
        # Small-input stem, as CIFAR adaptations do: ImageNet's stem shrinks 32x32 images 4x before the
        # first stage (to 1x1 at stage4) and the network then barely learns (measured: ~25 % on
        # shapes_source after 1500 steps, vs ~93 % after 500 with this stem). Every ImageNet weight still
        # loads: only the stride changes and the max-pool (no weights) goes.
        model.conv1[0].stride = (1, 1)
        model.maxpool = nn.Identity()
    # ResNets keep ImageNet's stem: cheap on a CPU at 32x32 (layer4 sees 1x1), at some cost in accuracy.
    return model


def build_language_model(name: str, vocab_size: int, pretrained: bool = True, attn_implementation: str = "sdpa",
                         tokenizer=None) -> tuple[nn.Module, WeightsInfo]:
    """Build language model ``name`` (`labkit.models.language`, `labkit.models.hub`) for ``vocab_size`` tokens, with
    where its weights came from.

    Args:
        name: one of `labkit.models.language_models()`.
        vocab_size: the tokenizer's vocabulary size (``<pad>`` is id 0); a hub model keeps its own, which must hold it.
        pretrained: True loads labkit's checkpoint (`labkit pretrain`: ``tiny_llama`` pretrained on ``digits_source``;
            with another vocabulary its embeddings and output layer start new) or a hub model's weights (online, on
            data its own tokenizer made), else random weights with a warning.
        attn_implementation: ``sdpa`` or ``eager``.
        tokenizer: what tokenized the data (a hub model's weights load only with its own tokenizer).

    Example:
        >>> model, weights = build_language_model("tiny_llama", vocab_size=16, pretrained=False)
    """
    if not isinstance(pretrained, bool):
        raise ConfigError("pretrained", pretrained, "True or False")
    if is_own_language_model(name) and name not in HUB_MODELS:  # a hub id or a directory
        model, source, warning = build_own_language_model(name, vocab_size, getattr(tokenizer, "name", None),
                                                          pretrained, attn_implementation)
        return model, WeightsInfo(source, warning)
    if name in HUB_MODELS:
        model, source, warning = build_hub_model(name, vocab_size, getattr(tokenizer, "name", None), pretrained,
                                                 attn_implementation)
        return model, WeightsInfo(source, warning)
    model = build_llama(name, vocab_size, attn_implementation)
    if not pretrained:
        return model, WeightsInfo("random")
    entry = _read_manifest().get(name)
    if entry is not None and (checkpoint_dir() / entry["file"]).is_file():
        origin = str(checkpoint_dir() / entry["file"])
        state = load_checkpoint(name)
        # Another tokenizer (pydoc_text's BPE against the digits' characters): the decoder layers transfer,
        # the token embeddings and the output layer start new for the new vocabulary.
        new = [key for key in _VOCAB_KEYS if key in state and state[key].shape != model.state_dict()[key].shape]
        missing, unexpected = model.load_state_dict({k: v for k, v in state.items() if k not in new}, strict=False)
        if [k for k in missing if k not in new] or unexpected:
            raise LabkitError(f"the weights in {origin} do not fit {name}: missing {missing[:5]}, unexpected "
                              f"{unexpected[:5]}. The checkpoint was made for another architecture: re-run "
                              "`labkit pretrain`.")
        if new:
            note(f"{name} starts from labkit's checkpoint {entry['file']} (pretrained on "
                 f"{entry.get('source_dataset')}); its token embeddings and output layer are new, sized for this "
                 f"dataset's {vocab_size}-token vocabulary")
        return model, WeightsInfo(f"labkit:{entry['file']}")
    if name in SHIPPED_CHECKPOINTS:
        why, fix = (f"its checkpoint is missing from {checkpoint_dir()}",
                    f"create it with `labkit pretrain {name}`")
    else:
        why, fix = (f"labkit ships weights only for {[n for n in SHIPPED_CHECKPOINTS if n in LANGUAGE_MODELS]}, and "
                    f"{name} is for speed and memory measurements", "use tiny_llama for a pretrained start")
    warning = (f"NO PRETRAINED WEIGHTS for {name}: {why}, so it starts from RANDOM weights. To fix: {fix}; or pass "
               "pretrained=False to train from scratch on purpose.")
    note(warning)
    return model, WeightsInfo("random", warning)


def build_for_split(name: str, split, pretrained: bool,
                    attn_implementation: str = "sdpa") -> tuple[nn.Module, WeightsInfo]:
    """Model ``name`` sized for ``split``: a language model for its tokenizer, a classifier for its classes.

    Args:
        name: a vision or language model's name. split: its training split (``TokenData`` or ``ImageData``).
        pretrained: start weights. attn_implementation: a language model's attention.
    """
    if is_language_model(name):
        return build_language_model(name, split.tokenizer.vocab_size, pretrained, attn_implementation, split.tokenizer)
    return build(name, split.num_classes, pretrained=pretrained)


def _imagenet_weights(name: str):
    """torchvision's default ImageNet weights for ``name``, or None (labkit's own models have none)."""
    if name in ("small_cnn", "tiny_vit"):
        return None
    import torchvision

    return torchvision.models.get_model_weights(name).DEFAULT


def build(name: str, num_classes: int, pretrained: bool = True) -> tuple[nn.Module, WeightsInfo]:
    """Build model ``name`` with a new ``num_classes`` head, starting from the best weights available.

    Pretrained weights, in order: ImageNet (online only), labkit's offline checkpoint, else random with a
    warning. The head is always freshly initialised (seed torch before calling for a repeatable head).
    The returned model keeps torchvision's module structure and records its name as ``model.labkit_name``.

    Args:
        name: one of `available()`.
        num_classes: outputs of the classification head.
        pretrained: False starts from random weights on purpose (no warning).

    Example:
        >>> model, weights = labkit.models.build("resnet18", num_classes=10)
        >>> weights.source
        'imagenet'
    """
    if is_own_vision_model(name):  # torchvision:NAME, timm:NAME
        model, source, warning = build_own_vision_model(name, num_classes, pretrained)
        return model, WeightsInfo(source, warning)
    if name not in _FAMILIES:
        raise ConfigError("model", name, f"one of {available()}, torchvision:NAME or timm:NAME")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ConfigError("num_classes", num_classes, "a positive integer (1, 2, 3, ...)")
    if not isinstance(pretrained, bool):
        raise ConfigError("pretrained", pretrained, "True or False")
    model = _construct(name, num_classes)
    model.labkit_name = name
    if not pretrained:
        return model, WeightsInfo("random")

    reasons = []
    imagenet = _imagenet_weights(name)
    if imagenet is None:
        reasons.append(f"torchvision has no ImageNet weights for {name}")
    elif name in RESNET_LAYOUTS and shrink_requested():
        reasons.append(f"${SHRINK_ENV} is set: {name} is built at half its width, which ImageNet weights do not fit")
    elif not is_online():
        reasons.append(f"${OFFLINE_ENV} is set, so ImageNet weights were not downloaded")
    else:
        try:
            with download_timeout():
                state = imagenet.get_state_dict(progress=False, check_hash=True)
        except Exception as exc:  # no network, a timeout, a proxy page instead of the file, a bad hash
            reasons.append(f"the ImageNet weights could not be downloaded ({type(exc).__name__}: {exc})")
        else:
            _load_backbone(model, state, f"torchvision's {imagenet}")
            return model, WeightsInfo("imagenet")

    entry = _read_manifest().get(name)
    if entry is not None and (checkpoint_dir() / entry["file"]).is_file():
        _load_backbone(model, load_checkpoint(name), str(checkpoint_dir() / entry["file"]))
        warning = None
        if imagenet is not None and is_online():
            warning = (f"NO IMAGENET WEIGHTS for {name}: {reasons[-1]}; it starts from labkit's offline checkpoint "
                       f"{entry['file']} (pretrained on the shapes_source task, not ImageNet).")
            note(warning)
        return model, WeightsInfo(f"labkit:{entry['file']}", warning)

    reasons.append(f"labkit has no offline checkpoint for it in {checkpoint_dir()}")
    fixes = []
    if imagenet is not None:
        fixes.append(f"connect to the internet and unset ${OFFLINE_ENV} for ImageNet weights")
    if name in SHIPPED_CHECKPOINTS:
        fixes.append(f"create one with `labkit pretrain {name}`")
    else:
        vision = [n for n in SHIPPED_CHECKPOINTS if n not in LANGUAGE_MODELS]
        fixes.append(f"offline, use a model labkit ships weights for ({', '.join(vision)})")
    fixes = ", or ".join(fixes)
    warning = (f"NO PRETRAINED WEIGHTS for {name}: {'; and '.join(reasons)}. Fine-tuning will start "
               f"from RANDOM weights, so expect lower accuracy and slower progress than from a pretrained "
               f"start. To fix: {fixes}; or pass pretrained=False to train from scratch on purpose.")
    note(warning)
    return model, WeightsInfo("random", warning)


def _load_backbone(model: nn.Module, state: dict, origin: str) -> None:
    """Load every weight of ``state`` except the head's; the model's own (new) head is kept."""
    head = _head_keys(model)
    missing, unexpected = model.load_state_dict({k: v for k, v in state.items() if k not in head}, strict=False)
    missing = [k for k in missing if k not in head]
    if missing or unexpected:
        raise LabkitError(
            f"the weights in {origin} do not fit {model.labkit_name}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}. The checkpoint was made for another architecture: re-run `labkit pretrain`."
        )


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel / DataParallel wrapper or a torch.compile result."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer (which needs at least 2 samples per batch in training)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _family(model: nn.Module) -> str | None:
    if is_language_model(getattr(model, "labkit_name", None)):
        return "llama"  # labkit's Llamas and the hub models (Llama, Qwen2) share the stage layout
    family = _FAMILIES.get(getattr(model, "labkit_name", None))
    if family is not None:
        return family
    if isinstance(model, SmallCNN):
        return "small_cnn"
    if isinstance(model, TinyViT):
        return "tiny_vit"
    import torchvision

    if isinstance(model, torchvision.models.ResNet):
        return "resnet"
    if isinstance(model, torchvision.models.ShuffleNetV2):
        return "shufflenet"
    return None


def named_stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's stages in order, stem first and head last; together they hold every parameter once.

    A stage groups parameters (to freeze or inspect); calling the stages in a row is not the model's
    forward for torchvision models (e.g. the ResNet head skips the flatten). The list is rebuilt on each
    call, so it follows model surgery. Wrapped models (DDP, ``torch.compile``) are unwrapped.

    Example:
        >>> [name for name, _ in named_stages(build("resnet18", 10, pretrained=False)[0])]
        ['stem', 'layer1', 'layer2', 'layer3', 'layer4', 'head']
    """
    m = unwrap(model)
    family = _family(m)
    if family in ("small_cnn", "tiny_vit"):
        return list(m.named_children())
    if family == "resnet":
        return [("stem", nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool)),
                ("layer1", m.layer1), ("layer2", m.layer2), ("layer3", m.layer3), ("layer4", m.layer4),
                ("head", nn.Sequential(m.avgpool, m.fc))]
    if family == "llama":
        return language_stages(m)
    if family == "shufflenet":
        return [("stem", nn.Sequential(m.conv1, m.maxpool)), ("stage2", m.stage2), ("stage3", m.stage3),
                ("stage4", m.stage4), ("conv5", m.conv5), ("head", m.fc)]
    raise ConfigError("model", type(m).__name__,
                      f"a model built by labkit.models.build (one of {available()}) to have named stages")


# The stages before the head, by family: the blocks gradient checkpointing wraps (every stage but the
# head; `block_names` is tested against `named_stages`). The stem is a block too: in a CNN the stem works
# at full resolution and often holds the largest activations of all.
_BLOCKS = {
    "small_cnn": ("stem", "block1", "block2", "block3"),
    "tiny_vit": ("stem", "block1", "block2", "block3", "block4"),
    "resnet": ("stem", "layer1", "layer2", "layer3", "layer4"),
    "shufflenet": ("stem", "stage2", "stage3", "stage4", "conv5"),
}


def block_names(model: nn.Module | str) -> list[str]:
    """The names of a model's blocks: its stages before the head, in forward order.

    The model's forward is exactly its blocks in a row followed by `forward_head`, which is what lets
    `labkit.techniques.checkpointing.apply_checkpointing` run the blocks in checkpointed segments.

    Args:
        model: a model from `build` (wrappers are removed), or a model name.

    Example:
        >>> block_names("resnet18")
        ['stem', 'layer1', 'layer2', 'layer3', 'layer4']
    """
    if isinstance(model, str):
        if model not in _FAMILIES:
            raise ConfigError("model", model, f"one of {available()}")
        family = _FAMILIES[model]
    else:
        family = _family(unwrap(model))
    if family not in _BLOCKS:
        raise ConfigError("model", type(unwrap(model)).__name__,
                          f"a model built by labkit.models.build (one of {available()}) to have blocks")
    return list(_BLOCKS[family])


def forward_head(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the model's forward does after its last block (see `block_names`): pool, flatten, classify.

    Example:
        >>> stages = dict(named_stages(model))
        >>> x = images
        >>> for name in block_names(model): x = stages[name](x)
        >>> logits = forward_head(model, x)  # == model(images)
    """
    m = unwrap(model)
    family = _family(m)
    if family in ("small_cnn", "tiny_vit"):
        return m.head(x)
    if family == "resnet":  # torchvision's ResNet._forward_impl
        return m.fc(torch.flatten(m.avgpool(x), 1))
    if family == "shufflenet":  # torchvision's ShuffleNetV2._forward_impl (conv5 is a block)
        return m.fc(x.mean([2, 3]))
    raise ConfigError("model", type(m).__name__,
                      f"a model built by labkit.models.build (one of {available()}) to have a known head")


def _head_keys(model: nn.Module) -> set[str]:
    m = unwrap(model)
    head = named_stages(m)[-1][1]
    head_tensors = {id(t) for t in [*head.parameters(), *head.buffers()]}
    return {k for k, t in [*m.named_parameters(), *m.named_buffers()] if id(t) in head_tensors}


def save_checkpoint(model: nn.Module, name: str, meta: dict) -> Path:
    """Save ``model``'s weights without its head as ``<name>.pt`` and record its sha256 in ``manifest.json``.

    A language model keeps its output layer: its vocabulary is the fine-tuning task's too.

    Args:
        model: a model from `build` (any wrapper is removed).
        name: the checkpoint name; `build` looks a checkpoint up by the model name, e.g. ``small_cnn``.
        meta: JSON-serialisable facts to record with it (task, steps, accuracy, ...).

    Returns:
        The path of the written ``.pt`` file.

    Example:
        >>> save_checkpoint(model, "small_cnn", {"task": "shapes_source", "val_accuracy": 0.97})
    """
    m = unwrap(model)
    head = set() if is_language_model(getattr(m, "labkit_name", None)) else _head_keys(m)
    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in m.state_dict().items() if k not in head}
    return write_checkpoint(state, name, meta)

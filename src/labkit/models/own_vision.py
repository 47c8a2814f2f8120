"""A learner's own image model by the names torchvision and timm give it: ``torchvision:NAME``, ``timm:NAME``.

The classification head (the model's last ``nn.Linear``) is replaced by a new one sized for the data's classes.
ImageNet weights download online (torchvision's ``DEFAULT`` weights, timm's ``pretrained=True``); offline, or when the
download fails, the model starts from RANDOM weights and says so.
"""

from __future__ import annotations

import importlib

from torch import nn

from ..downloads import download_timeout
from ..env import OFFLINE_ENV, is_online
from ..errors import ConfigError, UnsupportedError
from ..messages import note

PREFIXES = ("torchvision:", "timm:")


def is_own_vision_model(spec) -> bool:
    return isinstance(spec, str) and any(spec.startswith(p) and len(spec) > len(p) for p in PREFIXES)


def check_name(spec: str) -> str:
    """``spec`` if its library knows the model, else `ConfigError` listing a few of the names it knows."""
    library, name = spec.split(":", 1)
    known = _library(library, spec).list_models()
    if name not in known:
        close = [k for k in known if name.split("_")[0] in k][:8] or list(known)[:8]
        raise ConfigError("model", spec, f"{library}:NAME with a model {library} knows (e.g. {close})")
    return spec


def _library(library: str, spec: str):
    try:
        return importlib.import_module("torchvision.models" if library == "torchvision" else "timm")
    except ImportError as exc:
        raise UnsupportedError("model", spec, f"{library} is not installed", f"`pip install {library}`, or "
                               "a torchvision:NAME model") from exc


def replace_head(model: nn.Module, num_classes: int) -> nn.Module:
    """Replace ``model``'s last ``nn.Linear`` (its classifier) by a new one with ``num_classes`` outputs."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError("model", type(model).__name__, "an image classifier whose head is an nn.Linear")
    name, old = linears[-1]
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    setattr(parent, name.rpartition(".")[2], nn.Linear(old.in_features, num_classes))
    return model


def build_own_vision_model(spec: str, num_classes: int, pretrained: bool = True) -> tuple[nn.Module, str, str | None]:
    """Image model ``spec`` for ``num_classes`` classes, where its weights came from (``imagenet``, ``random``) and a
    warning when they are random against the wish for pretrained ones."""
    library, name = check_name(spec).split(":", 1)
    module, why = _library(library, spec), None
    if pretrained and not is_online():
        why = f"${OFFLINE_ENV} is set (or there is no network), so its ImageNet weights were not downloaded"
    elif pretrained:
        try:
            with download_timeout():
                model = (module.get_model(name, weights="DEFAULT") if library == "torchvision"
                         else module.create_model(name, pretrained=True))
            model = replace_head(model, num_classes)
            model.labkit_name = spec
            return model, "imagenet", None
        except Exception as exc:  # no weights for this model, no network, a timeout
            why = f"its weights could not be downloaded ({type(exc).__name__}: {str(exc)[:160]})"
    model = module.get_model(name, weights=None) if library == "torchvision" else module.create_model(name)
    model = replace_head(model, num_classes)
    model.labkit_name = spec
    if why is None:
        return model, "random", None
    warning = f"NO PRETRAINED WEIGHTS for {spec}: {why}; it starts from RANDOM weights (a new head either way)."
    note(warning)
    return model, "random", warning

"""The GPU suite's workloads by key, and the label each file written from them carries (``workload``, ``fallback``).

- ``cnn`` (`suite_vision_workload`): the profile's vision fine-tune where its data can be had. At ``full`` offline
  (CIFAR-10, 170 MB, and ImageNet weights cannot travel with the suite to a GPU without network) it is a stand-in:
  the same model, input size and batch from random weights on the generated ``shapes10`` upsampled to that size.
  A step then costs what the real workload's does, so step time and memory hold and accuracy does not.
  `labkit.config.baseline`'s own offline fallback, ``small_cnn`` at 32x32, is a different model, bound by kernel
  launches on a GPU: its rows would stand under ``full``'s name.
- ``vit``: notebook 06's ``tiny_vit`` on the same data and batch. ``ddp``: notebook 07's workload.
- ``lm``: notebook 08's fine-tune; offline its QLoRA model is built from its config with random weights.
- ``lm_speed``: `labkit.workloads.lm_speed_config`, random weights by design (speed and memory need none).

Every run is cut to `SUITE_STEPS` steps. A stand-in says so in ``fallback``: in each file and in the summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..config import SMALL_WORKLOAD, RunConfig, baseline
from ..downloads import fetch_problem, host_answers
from ..env import Profile, is_online
from ..labs import distributed, lora
from ..messages import note
from ..models import HUB_MODELS, is_language_model
from ..models.hub import HUB_HOST
from ..text import DEFAULT_SEQ_LENS
from ..workloads import lm_speed_config
from .common import SUITE_STEPS


@dataclasses.dataclass(frozen=True)
class Workload:
    """A run the suite's parts take, and ``fallback``: why it is a stand-in and which of its numbers hold (None:
    the profile's own workload)."""

    cfg: RunConfig
    fallback: str | None = None

    def label(self) -> dict:
        """``{"workload": describe(cfg), "fallback": fallback}``: what a file says it was measured on."""
        return {"workload": describe(self.cfg), "fallback": self.fallback}


def describe(cfg: RunConfig) -> str:
    """One line naming a run's model, weights, data, input size and batch.

    Args:
        cfg: a vision or language-model run.

    Example:
        >>> describe(RunConfig(model="resnet18", pretrained=False, image_size=128, batch_size=128))
        'resnet18 (random weights) on shapes10 at 128x128, batch 128'
    """
    weights = "pretrained" if cfg.pretrained else "random weights"
    if is_language_model(cfg.model):
        size = f", {cfg.packing} rows of {cfg.seq_len or DEFAULT_SEQ_LENS.get(cfg.dataset)} tokens"
    else:
        size = f" at {cfg.image_size}x{cfg.image_size}" if cfg.image_size else " at its own size"
    return f"{cfg.model} ({weights}) on {cfg.dataset}{size}, batch {cfg.batch_size}"


def suite_vision_workload(prof: Profile) -> Workload:
    """The profile's vision fine-tune (`labkit.config.baseline`) where its data is on disk or can be fetched; else
    the same model, input size and batch from random weights on ``shapes10``, labelled as a stand-in.

    Args:
        prof: the profile (``full``: ResNet-18 on CIFAR-10 at 128x128, batch 128).

    Example:
        >>> suite_vision_workload(labkit.profile("full")).fallback  # offline, CIFAR-10 not on disk
        'resnet18 (random weights) on shapes10 at 128x128, batch 128: offline stand-in for cifar10 and ...'
    """
    generated = SMALL_WORKLOAD["dataset"]
    problem = None if prof.dataset == generated else fetch_problem(prof.dataset)
    if problem is None:
        return Workload(baseline(prof))
    stand_in = baseline(dataclasses.replace(prof, dataset=generated), pretrained=False)
    fallback = (f"{describe(stand_in)}: offline stand-in for {prof.dataset} and ImageNet weights ({problem}); "
                f"speed and memory as {prof.name}'s, accuracy not")
    note(f"GPU suite: {fallback}")
    return Workload(stand_in, fallback)


def _vit(cnn: Workload, prof: Profile) -> Workload:
    cfg = cnn.cfg.replace(model="tiny_vit", image_size=None, pretrained=True)
    if cnn.fallback is None:
        return Workload(cfg)
    return Workload(cfg, f"{describe(cfg)}: offline stand-in for {prof.dataset}; speed and memory as on "
                         f"{prof.dataset} at that size and batch, accuracy not")


def _hub_fallback(cfg: RunConfig, model: str) -> str | None:
    """Why hub model ``model`` trains from random weights here (offline), with what still holds; None otherwise."""
    if model not in HUB_MODELS or (is_online() and host_answers(HUB_HOST)):
        return None
    return (f"{describe(cfg.replace(model=model, pretrained=False))}: {HUB_MODELS[model].repo}'s weights need the "
            "network, so the model is built from its config with random weights; speed and memory as the real "
            "model's, accuracy and loss not")


def _capped(workload: Workload, steps: int = SUITE_STEPS) -> Workload:
    cfg = workload.cfg
    return dataclasses.replace(workload, cfg=cfg.replace(max_steps=min(cfg.max_steps or steps, steps)))


def suite_workloads(prof: Profile, cfg: RunConfig | None = None) -> dict[str, Callable[[], Workload]]:
    """The suite's workloads by key (``cnn``, ``vit``, ``ddp``, ``lm``, ``lm_speed``), as functions that build each.

    The suite builds each when a part first asks for it, so a failure fails only the parts that need it.

    Args:
        prof: the profile.
        cfg: a CNN run to use instead of the profile's vision workload (tests pass a tiny one).

    Example:
        >>> suite_workloads(labkit.profile("ci"))["lm_speed"]().cfg.model
        'tiny_llama'
    """

    def cnn() -> Workload:
        return _capped(Workload(cfg) if cfg else suite_vision_workload(prof))

    def ddp() -> Workload:
        if cfg:
            return _vit(cnn(), prof)
        run = distributed.workload(prof)
        stand_in = None if run.dataset == prof.dataset else (
            f"{describe(run)}: notebook 07's own fallback (not {prof.model} on {prof.dataset}); its numbers are this "
            "run's only")
        return _capped(Workload(run, stand_in))

    def lm() -> Workload:
        run = lora.workload(prof)
        return _capped(Workload(run, _hub_fallback(run, lora.QLORA_MODELS[prof.name][0])))

    return {"cnn": cnn, "vit": lambda: _vit(cnn(), prof), "ddp": ddp, "lm": lm,
            "lm_speed": lambda: _capped(Workload(lm_speed_config()))}

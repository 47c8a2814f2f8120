"""A run's set-up without its loop: the device, the splits, the seeded model and its first batch.

The loop (`labkit.train.Trainer`) and every side experiment that needs a model and a batch of ``cfg`` (a gradient
comparison, a forward under a profiler, a copy of the model to prune) get them from here, so both see the same
device, data and weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import RunConfig
from .env import Profile, profile, resolve_device, set_tf32
from .errors import ConfigError
from .kinds import Kind, kind_for, prepare_model
from .models import WeightsInfo


def run_splits(cfg: RunConfig, prof: Profile | None = None, training: bool = True, kind: Kind | None = None) -> dict:
    """The train/val/test splits a run of ``cfg`` uses (``cfg.train_size`` or the profile's sizes), loaded once per
    session and size; with ``training``, checks that one batch of ``cfg`` fits in the training set."""
    kind = kind or kind_for(cfg)
    sizes = kind.split_sizes(cfg, prof or profile())
    if training and sizes[0] and cfg.batch_size > sizes[0]:
        raise ConfigError("batch_size", cfg.batch_size, f"at most train_size={sizes[0]} (the training set's size)")
    splits = kind.splits(cfg, sizes)
    if training and cfg.batch_size > len(splits["train"]):
        raise ConfigError("batch_size", cfg.batch_size, f"at most {len(splits['train'])}, the training examples of "
                          f"{cfg.dataset}")
    return splits


def build_model(cfg: RunConfig, kind: Kind, split) -> tuple[torch.nn.Module, WeightsInfo]:
    """``cfg.model`` for ``split``, its weights drawn from ``cfg.seed`` (the loop's and every side experiment's)."""
    torch.manual_seed(cfg.seed)
    return kind.build(cfg, split)


@dataclass
class Setup:
    """What `set_up` gives: ``cfg``, its ``device``, ``kind``, ``splits``, and (unless asked not to) its ``model``
    on the device with ``weights`` saying where they came from."""

    cfg: RunConfig
    device: torch.device
    kind: Kind
    splits: dict
    model: torch.nn.Module | None = None
    weights: WeightsInfo | None = None

    @property
    def train(self):
        return self.splits["train"]

    @property
    def num_classes(self) -> int:
        return self.train.num_classes

    def batch(self, rows: int | None = None):
        """The run's first training batch (``rows`` samples or token rows, default ``cfg.batch_size``) on the
        device: an `labkit.kinds.ImageBatch` (``.images``, ``.labels``) or a `labkit.text.TokenBatch`."""
        loader = self.kind.loader(self.train, rows or self.cfg.batch_size, self.cfg, None, self.device)
        return self.kind.to_device(self.kind.batch(next(iter(loader))), self.train, self.cfg, self.device)


def set_up(cfg: RunConfig, model: bool = True, techniques: bool = False, training: bool = True) -> Setup:
    """``cfg``'s device (TF32 as ``cfg.tf32`` says), splits and seeded model, as the loop sets them up.

    Args:
        cfg: the run.
        model: build the model and move it to the device (False: device and data only).
        techniques: apply ``cfg``'s model techniques (freezing, LoRA, checkpointing...) as the loop does.
        training: check that one batch fits in the training set (False: only the test split is used).

    Example:
        >>> s = set_up(RunConfig(model="small_cnn", dataset="shapes10", batch_size=32))
        >>> s.model(s.batch().images).shape
        torch.Size([32, 10])
    """
    device = resolve_device(cfg.device)
    set_tf32(cfg.tf32)
    kind = kind_for(cfg)
    splits = run_splits(cfg, training=training, kind=kind)
    setup = Setup(cfg, device, kind, splits)
    if model:
        built, setup.weights = build_model(cfg, kind, splits["train"])
        if techniques:
            prepare_model(built, cfg)
        setup.model = built.to(device)
    return setup

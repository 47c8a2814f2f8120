"""Image classifiers on image batches: the vision kind of the one loop (`labkit.kinds`)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import data, models
from ..config import RunConfig
from ..env import Profile
from ..errors import ConfigError
from ..evaluation import evaluate
from ..imagefolder import is_image_folder, load_folder_splits
from ..techniques.checkpointing import apply_checkpointing
from ..text import TokenCounts


@dataclass
class ImageBatch:
    """Images (uint8 on the host, normalised floats on the device) and their class labels, one row per sample."""

    images: torch.Tensor
    labels: torch.Tensor

    def split(self, chunks: int) -> list[ImageBatch]:
        """Micro-batches of consecutive samples (``torch.chunk``: the last may be smaller)."""
        parts = zip(self.images.chunk(chunks), self.labels.chunk(chunks), strict=True)
        return [ImageBatch(images, labels) for images, labels in parts]

    def loss_count(self) -> int:
        """Samples: the cross-entropy sum divided by it is the per-sample mean."""
        return int(self.labels.shape[0])

    def counts(self) -> TokenCounts:
        return TokenCounts()


@functools.lru_cache(maxsize=4)
def _image_splits(name: str, train_size: int, val_size: int, test_size: int) -> dict:
    # Data is generated/loaded with a fixed seed so that runs with different seeds see the same data;
    # cfg.seed changes initialisation of new layers and the order of batches.
    return data.load_splits(name, train_size=train_size, val_size=val_size, test_size=test_size, seed=0)


class VisionKind:
    """A classifier from `labkit.models.available()` on an image dataset from `labkit.data.available()`."""

    name = "vision"
    uneven_counts = False  # every rank's share of a batch holds batch_size / N samples

    def check_world(self, cfg: RunConfig, world_size: int, in_group: bool) -> None:
        return None

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """Each stage that is a child module of its own (a ResNet's stem is four children, not one); the root's
        fully_shard takes the rest."""
        children = list(model.children())
        return [stage for _, stage in models.named_stages(model)[:-1] if any(stage is child for child in children)]

    def split_sizes(self, cfg: RunConfig, prof: Profile) -> tuple[int, int, int]:
        if is_image_folder(cfg.dataset):  # a learner's own folder: all of it
            return cfg.train_size or 0, 0, 0
        return cfg.train_size or prof.train_size, prof.val_size, prof.test_size

    def splits(self, cfg: RunConfig, sizes: tuple[int, int, int]) -> dict:
        if not is_image_folder(cfg.dataset):
            return _image_splits(cfg.dataset, *sizes)
        splits = load_folder_splits(cfg.dataset)
        if cfg.train_size is None:
            return splits
        if cfg.train_size > len(splits["train"]):
            raise ConfigError("train_size", cfg.train_size, f"at most {len(splits['train'])}, the training images of "
                              f"{cfg.dataset}")
        train = splits["train"]
        return {**splits, "train": dataclasses.replace(train, images=train.images[:cfg.train_size],
                                                       labels=train.labels[:cfg.train_size])}

    def build(self, cfg: RunConfig, split):
        return models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)

    def checkpoint(self, model: torch.nn.Module, cfg: RunConfig) -> None:
        apply_checkpointing(model, cfg.checkpointing)

    def on_device(self, model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> None:
        return None

    def loader(self, split, rows: int, cfg: RunConfig, sampler, device: torch.device):
        return data.make_loader(split, batch_size=rows, shuffle=True, seed=cfg.seed, drop_last=True,
                                sampler=sampler, pin_memory=device.type == "cuda")

    def batch(self, item, labels=None) -> ImageBatch:
        if isinstance(item, ImageBatch):
            return item
        return ImageBatch(*item) if labels is None else ImageBatch(item, labels)

    def to_device(self, batch: ImageBatch, split, cfg: RunConfig, device: torch.device) -> ImageBatch:
        return ImageBatch(data.to_model_input(batch.images, split, device, cfg.channels_last, cfg.image_size),
                          batch.labels.to(device, non_blocking=True))

    def loss_sum(self, model: torch.nn.Module, micro: ImageBatch, cfg: RunConfig) -> torch.Tensor:
        return F.cross_entropy(model(micro.images), micro.labels, reduction="sum")

    def extra_flops(self, model: torch.nn.Module, batch: ImageBatch, device: torch.device) -> int:
        return 0

    def evaluate(self, model, splits: dict, cfg: RunConfig, device, precision, shard: bool) -> dict:
        return {"accuracy": evaluate(model, splits["test"], cfg, device, precision, shard=shard)}

"""The two questions-and-answers types of the loop: `Batch` (one step's data) and `Kind` (a model family and its
data, from set-up to report). Both are protocols: `labkit.kinds.vision` and `labkit.kinds.language` implement them."""

from __future__ import annotations

from typing import Protocol

import torch

from ..config import RunConfig
from ..env import Profile
from ..models import WeightsInfo
from ..text import TokenCounts


class Batch(Protocol):
    """One optimizer step's data, as the loop sees it."""

    def split(self, chunks: int) -> list[Batch]:
        """The batch in ``chunks`` micro-batches, in order."""

    def loss_count(self) -> int:
        """What the step's summed loss divides by: samples (images) or label tokens (text), counted on the host."""

    def counts(self) -> TokenCounts:
        """Tokens, real tokens and label tokens (all zero for images)."""


class Kind(Protocol):
    """A model family and its data: how a run of it is set up, stepped and reported."""

    name: str
    uneven_counts: bool  # whether ranks' batches hold different loss counts (label tokens), to be summed over them

    def check_world(self, cfg: RunConfig, world_size: int, in_group: bool) -> None:
        """Raise `ConfigError` when ``cfg`` cannot run in this process group."""

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The blocks FSDP2 shards one by one (all-gathered just before each one's forward and backward)."""

    def split_sizes(self, cfg: RunConfig, prof: Profile) -> tuple[int, int, int]:
        """The run's train, val and test sizes (``cfg.train_size`` or the profile's, as the data allows)."""

    def splits(self, cfg: RunConfig, sizes: tuple[int, int, int]) -> dict:
        """The run's train/val/test splits of those sizes."""

    def build(self, cfg: RunConfig, split) -> tuple[torch.nn.Module, WeightsInfo]:
        """The model ``cfg`` names, sized for ``split``, and where its weights came from."""

    def checkpoint(self, model: torch.nn.Module, cfg: RunConfig) -> None:
        """``cfg.checkpointing`` on ``model``."""

    def on_device(self, model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> str | None:
        """What happens once the model is on its device (compiling); returns a warning or None."""

    def loader(self, split, rows: int, cfg: RunConfig, sampler, device: torch.device):
        """The training loader: ``rows`` samples or token rows per step."""

    def batch(self, item, labels=None) -> Batch:
        """A loader item (or images and labels) as a `Batch`."""

    def to_device(self, batch: Batch, split, cfg: RunConfig, device: torch.device) -> Batch:
        """``batch`` on ``device``, ready for the model."""

    def loss_sum(self, model: torch.nn.Module, micro: Batch, cfg: RunConfig) -> torch.Tensor:
        """The SUM of ``micro``'s losses (never a mean: the loop divides by the step's `Batch.loss_count`)."""

    def extra_flops(self, model: torch.nn.Module, batch: Batch, device: torch.device) -> int:
        """FLOPs of a step that torch's FLOP counter misses."""

    def evaluate(self, model: torch.nn.Module, splits: dict, cfg: RunConfig, device: torch.device, precision,
                 shard: bool) -> dict:
        """The test split's scores: ``accuracy`` (or exact match), and a language model's ``test_loss`` and
        ``perplexity``."""

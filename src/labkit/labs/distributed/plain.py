"""Notebook 07, section 2: what the notebook's plain DDP script needs from labkit."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from ... import data, models, results
from ...config import RunConfig
from ...launcher import VIT
from ...runsetup import set_up
from ...techniques import distributed


def mechanism_config() -> RunConfig:
    """The small CPU run that the plain DDP script and labkit's engine both train."""
    return RunConfig(model=VIT, dataset="shapes10", batch_size=32, max_steps=8, train_size=512, device="cpu")


def plain_setup(config_path: str, device: torch.device | str = "cpu"):
    """``(cfg, split, model, to_input)`` for a plain DDP script, the model built as `fit` builds it."""
    cfg = RunConfig.from_dict(json.loads(Path(config_path).read_text()), source=config_path)
    s = set_up(cfg)
    return cfg, s.train, s.model.to(device), lambda images: data.to_model_input(images, s.train, device)


def plain_summary(losses: list, model: torch.nn.Module) -> dict:
    """On every rank: the losses averaged over the ranks, and every rank's weight digest."""
    mean = distributed.all_reduce_mean(torch.stack(losses))
    return {"losses": mean.tolist(),
            "weights_sha256": distributed.all_gather(distributed.weights_sha256(models.unwrap(model)))}


def plain_write(summary: dict, out: str) -> None:
    """On rank 0: `plain_summary`'s record to ``out/result.json``."""
    results.write_json_atomic(Path(out) / "result.json", summary)


def plain_exit() -> None:
    """Leave at once, after ``destroy_process_group``: gloo's threads can abort Python's own shutdown, which torchrun
    would report as a crashed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""`labkit pretrain`: the small offline checkpoints, trained by labkit itself on a *source* task.

Fine-tuning must mean fine-tuning a pretrained model, offline too. The source task
(``shapes_source``: ten shape classes) differs from the fine-tuning task (``shapes10``: ten other
shapes), as ImageNet differs from CIFAR-10: the features transfer, the classes do not.
"""

from __future__ import annotations

import torch

from . import models
from .config import RunConfig
from .errors import ConfigError
from .train import fit

# Per-model recipe (one for each of models.SHIPPED_CHECKPOINTS): enough steps to learn the source task well on a
# 2-core CPU in a few minutes.
RECIPES = {
    "small_cnn": {"batch_size": 128, "lr": 1e-3, "max_steps": 1500, "train_size": 16000},
    "shufflenet_v2_x0_5": {"batch_size": 128, "lr": 2e-3, "max_steps": 1000, "train_size": 16000},
    # A transformer trained from scratch wants a warm-up and weight decay (about 23 minutes on 2 cores).
    "tiny_vit": {"batch_size": 128, "lr": 1e-3, "lr_warmup_steps": 100, "weight_decay": 0.05, "max_steps": 3000,
                 "train_size": 16000},
}
SOURCE_DATASET = "shapes_source"


def pretrain(name: str, steps: int | None = None, seed: int = 0) -> dict:
    """Train ``name`` from random weights on the source task and save it as a labkit checkpoint.

    Returns the manifest entry (file, sha256, source task, steps, source-task accuracy, torch version).

    Example:
        >>> pretrain("small_cnn")["accuracy"]
    """
    if name not in models.SHIPPED_CHECKPOINTS:
        raise ConfigError("model", name, f"one of {list(models.SHIPPED_CHECKPOINTS)} (models small enough to ship)")
    recipe = dict(RECIPES[name])
    if steps is not None:
        recipe["max_steps"] = steps
    cfg = RunConfig(model=name, dataset=SOURCE_DATASET, pretrained=False, seed=seed, **recipe)
    result = fit(cfg)
    meta = {"source_dataset": SOURCE_DATASET, "steps": cfg.max_steps, "batch_size": cfg.batch_size,
            "source_accuracy": result.accuracy, "torch": torch.__version__, "seed": seed}
    path = models.save_checkpoint(result.model, name, meta)
    return {"model": name, "file": path.name, **meta}

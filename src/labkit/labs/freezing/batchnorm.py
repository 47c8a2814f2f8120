"""Section 4 of notebook 05: frozen stages whose BatchNorm layers stay in training mode are not frozen."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import data, models, results, train
from ...config import RunConfig
from ...env import env_report, profile
from ...errors import ConfigError
from ...measure import accuracy_noise
from ...messages import worded
from ...result import RunResult
from ...techniques.freezing import LEVELS, freeze, frozen_stages, is_frozen_batchnorm
from .common import _points


@dataclass
class BatchNormDemo:
    """`batchnorm_demo`'s rows (one per way of freezing) and what they show."""

    frame: pd.DataFrame
    level: str

    @worded
    def finding(self) -> str:
        """One line: how far the "frozen" statistics and features moved without eval mode, and the accuracy."""
        good, bad = self.frame.iloc[0], self.frame.iloc[1]
        noise = accuracy_noise((good["accuracy"] + bad["accuracy"]) / 2, int(good["test_size"]))
        difference = bad["accuracy"] - good["accuracy"]
        text = (f"With requires_grad_(False) alone the frozen BatchNorm running means moved by up to "
                f"{bad['running_mean_change']:.3g} and the frozen body's output by "
                f"{bad['feature_change_fraction']:.1%} (kept in eval mode: {good['running_mean_change']:g} and "
                f"{good['feature_change_fraction']:.1%}); "
                f"accuracy {bad['accuracy']:.1%} against {good['accuracy']:.1%}, ")
        if abs(difference) <= noise:
            return text + f"within the test noise ({noise * 100:.1f} points)."
        return text + f"{_points(difference)}, beyond the test noise ({noise * 100:.1f} points)."


def _frozen_batchnorms(model: nn.Module, names: list[str]) -> list[nn.Module]:
    stages = dict(models.named_stages(model))
    return [m for name in names for m in stages[name].modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _bn_demo_run(cfg: RunConfig, level: str, batchnorm_eval: bool, progress: bool) -> dict:
    split = train.run_splits(cfg)["train"]
    torch.manual_seed(cfg.seed)
    model, _ = models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)
    freeze(model, level, batchnorm_eval=batchnorm_eval)
    names = frozen_stages(model, level)
    batchnorms = _frozen_batchnorms(model, names)
    means = [bn.running_mean.clone() for bn in batchnorms]
    weights = [p.detach().clone() for name in names for p in dict(models.named_stages(model))[name].parameters()]
    trainer = train.Trainer(cfg.replace(freeze=None), model=model)
    probe = data.to_model_input(split.images[:cfg.batch_size], split, trainer.device, cfg.channels_last,
                                cfg.image_size)

    def body_output() -> torch.Tensor:
        was = trainer.model.training
        trainer.model.eval()
        with torch.no_grad():
            h = probe
            stages = dict(models.named_stages(trainer.model))
            for name in names:
                h = stages[name](h)
        trainer.model.train(was)
        return h.float()

    before = body_output()
    result = trainer.run(progress=progress)
    after = body_output()
    frozen_now = [p.detach() for name in names for p in dict(models.named_stages(trainer.model))[name].parameters()]
    return {
        "result": result.to_dict(),
        "running_mean_change": max((float((bn.running_mean.cpu() - m.cpu()).abs().max())
                                    for bn, m in zip(batchnorms, means, strict=True)), default=0.0),
        "feature_change": float((after - before).norm() / before.norm()),
        "frozen_weight_change": max((float((a.cpu() - b.cpu()).abs().max())
                                     for a, b in zip(frozen_now, weights, strict=True)), default=0.0),
        "kept_in_eval": all(is_frozen_batchnorm(bn) for bn in batchnorms),
    }


def batchnorm_demo(cfg: RunConfig, level: str = "head_only", refresh: bool = False,
                   progress: bool = True) -> BatchNormDemo:
    """Freeze ``cfg``'s model at ``level`` twice, as labkit does and with ``requires_grad_(False)`` alone; fine-tune.

    Args:
        cfg: the fine-tune.
        level: a level that freezes something.
        refresh: run again.
        progress: progress bars.

    Returns:
        A `BatchNormDemo`; its rows (eval mode first): ``variant``, ``running_mean_change`` (largest change of a
        frozen running mean), ``feature_change_fraction`` (relative change of the frozen stages' eval output on
        a fixed batch), ``frozen_weight_change``, ``accuracy``, ``step_time_s``, ``test_size``. Cached.
    """
    if level in (None, "none") or level not in LEVELS:
        raise ConfigError("level", level, f"a level that freezes something: one of {list(LEVELS[1:])}")
    if not models.has_batchnorm(models.build(cfg.model, 2, pretrained=False)[0]):
        raise ConfigError("model", cfg.model, "a model with BatchNorm layers")
    rows = []
    env = env_report(cfg.device)
    for variant, keep in (("BatchNorm kept in eval mode (labkit)", True), ("requires_grad_(False) only", False)):
        key = f"{results.cache_key(cfg.replace(freeze=level), env)}-bn-demo-{'eval' if keep else 'train'}"
        record = results.cached_record(key, lambda keep=keep: _bn_demo_run(cfg, level, keep, progress), refresh)
        result = RunResult.from_dict(record["result"])
        rows.append({"variant": variant, "running_mean_change": record["running_mean_change"],
                     "feature_change_fraction": record["feature_change"],
                     "frozen_weight_change": record["frozen_weight_change"], "accuracy": result.accuracy,
                     "step_time_s": result.step_time_s, "test_size": profile().test_size,
                     "error": result.error})
    return BatchNormDemo(pd.DataFrame(rows), level)

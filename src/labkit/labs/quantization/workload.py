"""Notebook 06's two fine-tuned models, their calibration batches, accuracy on the test split, and QAT's fine-tune.

Every experiment of the notebook starts from the same two fine-tunes: ``tiny_vit`` (its work almost all in Linear
layers) and the profile's CNN (its work in convolutions). They are trained once, then read from the cache.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from ... import config, data, results, train
from ...config import RunConfig
from ...env import Profile, profile
from ...errors import ConfigError
from ...inference import accuracy, example_batch, model_device
from ...techniques import quantization
from ...validate import is_int

VIT = "tiny_vit"
QAT = "int8_qat"  # the table's row for quantization-aware training (a fine-tune, not a post-training method)
CALIBRATION_BATCHES = 8
# Every row's accuracy is measured on the same first test images; at most this many, so that the CPU-only
# methods stay affordable on a cloud GPU machine's few CPU cores at the `full` profile.
EVAL_IMAGES = 2000
QAT_LR_FACTOR = 0.1  # a continued fine-tune (QAT, or the float run beside it) runs at a tenth of the learning rate
BNB_TESTED = "0.50.2"


def workloads(prof: Profile | None = None) -> dict[str, RunConfig]:
    """The notebook's two fine-tunes, ``tiny_vit`` and the profile's CNN, keyed by model name.

    Args:
        prof: the profile (default: the active one).

    Example:
        >>> list(workloads(labkit.profile("ci")))
        ['tiny_vit', 'small_cnn']
    """
    prof = prof or profile()
    cnn = config.baseline(prof)
    vit = config.baseline(prof, model=VIT, image_size=None)  # tiny_vit takes 32x32 images
    return {VIT: vit, cnn.model: cnn}


def fine_tuned(cfg: RunConfig, progress: bool = True) -> tuple[nn.Module, object]:
    """The model ``cfg`` fine-tunes and its `RunResult`: trained once, then read from the cache.

    Args:
        cfg: the fine-tune. progress: show the training bar.
    """
    return results.cached_model(cfg, progress=progress)


def calibration_batches(cfg: RunConfig, num_batches: int = CALIBRATION_BATCHES) -> list[torch.Tensor]:
    """Batches of training inputs, on the CPU, for static quantization.

    Args:
        cfg: the fine-tune (its training split and ``batch_size``). num_batches: how many.

    Example:
        >>> int8 = quantization.quantize(model, "int8_static", calibration_batches(cfg, 8))
    """
    if not is_int(num_batches) or num_batches < 1:
        raise ConfigError("num_batches", num_batches, "a positive integer (calibration batches)")
    split = train.run_splits(cfg)["train"]
    loader = data.make_loader(split, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    batches = []
    for images, _ in loader:
        batches.append(data.to_model_input(images, split, "cpu", cfg.channels_last, cfg.image_size))
        if len(batches) == num_batches:
            break
    return batches


def library_versions() -> str:
    """The quantization libraries installed here, against the versions labkit was tested with."""
    parts = []
    for package, tested in (("torchao", quantization.TORCHAO_TESTED), ("bitsandbytes", BNB_TESTED)):
        version = quantization.installed_version(package)
        if version is None:
            parts.append(f"{package}: not installed (its rows will say so)")
        elif _version_tuple(version) < _version_tuple(tested):
            parts.append(f"{package} {version}: older than the {tested} this notebook was tested with; a method may "
                         "be missing or slower (pip install -U it, keeping torch, if a row fails)")
        else:
            parts.append(f"{package} {version} (tested: {tested})")
    return f"torch {torch.__version__}; " + "; ".join(parts)


def _version_tuple(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers)


def eval_accuracy(model: nn.Module, cfg: RunConfig, images: int | None = None) -> float:
    """Accuracy of ``model`` on the first ``images`` test images (default: `EVAL_IMAGES`), on its device.

    Args:
        model: the model, float or quantized. cfg: its fine-tune. images: how many test images.
    """
    images = images or EVAL_IMAGES
    test = train.run_splits(cfg, training=False)["test"]
    if len(test) <= images:
        return accuracy(model, cfg, "test")
    device = model_device(model)
    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, images, 256):
            batch = slice(start, min(start + 256, images))
            x = data.to_model_input(test.images[batch], test, device, cfg.channels_last, cfg.image_size)
            correct += int((model(x).argmax(dim=1).cpu() == test.labels[batch]).sum())
    model.train(was_training)
    return correct / images


def linear_share(model: nn.Module) -> float:
    """The share of the model's parameters that sit in Linear layers (what int8 dynamic quantizes).

    Args:
        model: the model.
    """
    linear = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters())
    return linear / sum(p.numel() for p in model.parameters())


def extra_steps(steps: int | None = None) -> int:
    """Steps of a continued fine-tune (QAT, or the float run it is compared with): half the profile's fine-tune.

    Args:
        steps: None for the default, else at least the untimed warm-up and profiling steps plus two.
    """
    prof = profile()
    least = prof.warmup_steps + train.PROFILING_STEPS + 2
    if steps is None:
        return max(prof.max_steps // 2, least)
    if not is_int(steps) or steps < least:
        raise ConfigError("steps", steps, f"an integer >= {least} (the run's untimed warm-up and profiling steps, "
                          "then at least two timed ones)")
    return steps


def continued(cfg: RunConfig, steps: int) -> RunConfig:
    """``cfg`` continued for ``steps`` more steps at `QAT_LR_FACTOR` of its learning rate, without warm-up.

    Args:
        cfg: the fine-tune. steps: the steps of the continued run.
    """
    return cfg.replace(max_steps=steps, lr=cfg.lr * QAT_LR_FACTOR, lr_warmup_steps=0)


_QAT_MODELS: dict = {}


def qat_model(cfg: RunConfig, steps: int | None = None, progress: bool = False) -> tuple[nn.Module, object, float]:
    """The fine-tuned model of ``cfg``, fine-tuned ``steps`` more steps with fake quantization, converted to int8.

    Kept for the session (its int8 model is a GraphModule, which labkit's disk cache cannot rebuild).

    Args:
        cfg: the fine-tune it starts from. steps: see `extra_steps`. progress: show the training bar.

    Returns:
        The int8 model, the QAT run's `RunResult`, and the seconds the conversion to int8 took.
    """
    steps = extra_steps(steps)
    key = (repr(sorted(cfg.to_dict().items())), steps)
    if key not in _QAT_MODELS:
        model, _ = fine_tuned(cfg, progress=progress)
        prepared = quantization.prepare_qat(model, example_batch(cfg, 2, device=model_device(model)))
        run = train.fit(continued(cfg, steps), model=prepared, progress=progress)
        start = time.perf_counter()
        int8 = quantization.convert_qat(prepared)
        _QAT_MODELS[key] = (int8, run, time.perf_counter() - start)
    return _QAT_MODELS[key]

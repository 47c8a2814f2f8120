"""Notebook 06's two fine-tunes (``tiny_vit`` and the profile's CNN), calibration batches, test accuracy; section 4:
PTQ at once, as many more float steps as QAT takes then PTQ (QAT's effect apart from the extra training), and QAT."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import config, data, evaluation, results, train
from ...config import RunConfig
from ...env import Profile, profile
from ...errors import ConfigError
from ...inference import accuracy, example_batch, model_device
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...project import release_of
from ...techniques import quantization
from ...techniques.precision import resolve_precision
from ...validate import is_int

VIT = "tiny_vit"
QAT = "int8_qat"  # the table's row for quantization-aware training (a fine-tune, not a post-training method)
CALIBRATION_BATCHES = 8
EVAL_IMAGES = 2000  # accuracy on at most this many test images: CPU-only methods stay affordable at `full`
QAT_LR_FACTOR = 0.1  # a continued fine-tune (QAT, or the float run beside it) runs at a tenth of the learning rate
BNB_TESTED = "0.50.2"
STEP_COLUMNS = ("step_time_s", "step_time_p10_s", "step_time_p90_s")


def workloads(prof: Profile | None = None) -> dict[str, RunConfig]:
    """The notebook's two fine-tunes, ``tiny_vit`` and the profile's CNN, keyed by model name."""
    cnn = config.baseline(prof or profile())
    vit = config.baseline(prof or profile(), model=VIT, image_size=None)  # tiny_vit takes 32x32 images
    return {VIT: vit, cnn.model: cnn}


def fine_tuned(cfg: RunConfig, progress: bool = True) -> tuple[nn.Module, object]:
    """The model ``cfg`` fine-tunes and its `RunResult`: trained once, then read from the cache."""
    return results.cached_model(cfg, progress=progress)


def calibration_batches(cfg: RunConfig, num_batches: int = CALIBRATION_BATCHES) -> list[torch.Tensor]:
    """``num_batches`` batches of training inputs, on the CPU, for static quantization."""
    if not is_int(num_batches) or num_batches < 1:
        raise ConfigError("num_batches", num_batches, "a positive integer (calibration batches)")
    split = train.run_splits(cfg)["train"]
    loader = data.make_loader(split, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    return [data.to_model_input(images, split, "cpu", cfg.channels_last, cfg.image_size)
            for images, _ in itertools.islice(loader, num_batches)]


def library_versions() -> str:
    """The quantization libraries installed here, against the versions labkit was tested with."""
    parts = []
    for package, tested in (("torchao", quantization.TORCHAO_TESTED), ("bitsandbytes", BNB_TESTED)):
        version = quantization.installed_version(package)
        if version is None:
            parts.append(f"{package}: not installed (its rows will say so)")
        elif release_of(version) < release_of(tested):
            parts.append(f"{package} {version}: older than the {tested} this notebook was tested with; a method may "
                         "be missing or slower (pip install -U it, keeping torch, if a row fails)")
        else:
            parts.append(f"{package} {version} (tested: {tested})")
    return f"torch {torch.__version__}; " + "; ".join(parts)


def eval_accuracy(model: nn.Module, cfg: RunConfig, images: int | None = None) -> float:
    """Accuracy of ``model`` on the first ``images`` test images (default `EVAL_IMAGES`), on its device."""
    test, first = train.run_splits(cfg, training=False)["test"], slice(images or EVAL_IMAGES)
    device = model_device(model)
    return evaluation.evaluate(model, dataclasses.replace(test, images=test.images[first], labels=test.labels[first]),
                               cfg, device, resolve_precision("fp32", device))


def linear_share(model: nn.Module) -> float:
    """The share of the model's parameters in Linear layers (what int8 dynamic quantizes)."""
    linear = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters())
    return linear / sum(p.numel() for p in model.parameters())


def timing_noise(first_s: float, again_s: float) -> float:
    """The relative gap between one model's two timings: the run's timing noise."""
    return abs(first_s - again_s) / min(first_s, again_s)


def latency(time_s: float, noise: float) -> Measured:
    """A latency measured within a relative ``noise``: two differ beyond it only when their ratio exceeds
    ``1 + noise``."""
    width = math.sqrt(1 + noise) if noise == noise else math.nan
    return Measured(time_s, time_s / width, time_s * width)


def speedup(old_s: float, new_s: float, noise: float):
    """``old_s / new_s`` as a `Comparison` within the timing ``noise``: ``1.52x (faster)``."""
    return compare(latency(old_s, noise), latency(new_s, noise), words=("slower", "faster"))


def accuracies(a: float, b: float, test_size: int):
    """Accuracy ``a`` against ``b``, both on ``test_size`` examples, as a `Comparison` within the test noise."""
    return compare(Measured.accuracy(a, test_size), Measured.accuracy(b, test_size))


def points(difference: float) -> str:
    """An accuracy difference in points, signed, never "-0.0"."""
    return f"{round(difference * 100, 1) + 0.0:+.1f} points"


def extra_steps(steps: int | None = None) -> int:
    """Steps of a continued fine-tune (QAT, or the float run beside it): half the profile's fine-tune by default."""
    prof = profile()
    least = prof.warmup_steps + train.PROFILING_STEPS + 2
    if steps is None:
        return max(prof.max_steps // 2, least)
    if not is_int(steps) or steps < least:
        raise ConfigError("steps", steps, f"an integer >= {least} (the run's untimed warm-up and profiling steps, "
                          "then at least two timed ones)")
    return steps


def continued(cfg: RunConfig, steps: int) -> RunConfig:
    """``cfg`` continued for ``steps`` more steps at `QAT_LR_FACTOR` of its learning rate, without warm-up."""
    return cfg.replace(max_steps=steps, lr=cfg.lr * QAT_LR_FACTOR, lr_warmup_steps=0)


_QAT_MODELS: dict = {}  # for the session: the int8 GraphModule is not something the disk cache can rebuild


def qat_model(cfg: RunConfig, steps: int | None = None, progress: bool = False) -> tuple[nn.Module, object, float]:
    """``cfg``'s model fine-tuned ``steps`` more steps with fake quantization, then int8: (int8 model, the QAT
    run's `RunResult`, seconds the conversion took)."""
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


@dataclass
class QatVsPtq(LabResult):
    """The three recipes: extra steps and their time, quantization time, accuracy before and after int8."""

    shown = ("recipe", "extra_train_time_s", "step_time_s", "quantize_s", "test_accuracy")

    @worded
    def finding(self) -> str:
        ptq, longer, qat = (self.frame.iloc[i] for i in range(3))

        def gap(other) -> str:
            c = accuracies(qat.test_accuracy, other.test_accuracy, profile().test_size)
            return f"{points(c.difference)} ({c.verdict})"

        step = compare(Measured.row(qat, "step_time_s"), Measured.row(longer, "step_time_s"),
                       words=("faster", "slower"))
        return (f"QAT against PTQ at once: {gap(ptq)}; against as many float steps: {gap(longer)}; a QAT step "
                f"against a float step: {step}.")


def qat_vs_ptq(cfg: RunConfig, steps: int | None = None, num_calibration: int = CALIBRATION_BATCHES,
               progress: bool = False, refresh: bool = False) -> QatVsPtq:
    """The three recipes from ``cfg``'s fine-tune, ``steps`` (`extra_steps`) more steps each (measured once, cached)."""
    steps = extra_steps(steps)
    frame = results.cached_frame("quant-qat", [cfg], lambda: _recipe_rows(cfg, steps, num_calibration, progress),
                                 refresh=refresh, steps=steps, num_calibration=num_calibration)
    frame[list(STEP_COLUMNS)] = frame[list(STEP_COLUMNS)].apply(pd.to_numeric)
    return QatVsPtq(frame)


def _recipe_rows(cfg: RunConfig, steps: int, num_calibration: int, progress: bool) -> pd.DataFrame:
    model, base = fine_tuned(cfg, progress=progress)
    calibration = calibration_batches(cfg, num_calibration)

    def ptq(trained: nn.Module) -> tuple[nn.Module, float]:
        start = time.perf_counter()
        return quantization.quantize(trained, "int8_static", calibration), time.perf_counter() - start

    at_once, at_once_s = ptq(model)
    longer = copy.deepcopy(model)
    run = train.fit(continued(cfg, steps), model=longer, progress=progress)
    longer_int8, longer_s = ptq(longer)
    qat, qat_run, convert_s = qat_model(cfg, steps, progress=progress)

    def timed(r) -> dict:
        return {"extra_steps": steps, "extra_train_time_s": r.train_time_s, **{c: getattr(r, c) for c in STEP_COLUMNS}}

    untimed = {"extra_steps": 0, "extra_train_time_s": 0.0, **dict.fromkeys(STEP_COLUMNS, math.nan)}
    frame = pd.DataFrame([
        {"recipe": "fine-tune, then int8 (PTQ)", **untimed, "quantize_s": at_once_s, "float_accuracy": base.accuracy,
         "test_accuracy": accuracy(at_once, cfg, "test")},
        {"recipe": f"+{steps} float steps, then int8 (PTQ)", **timed(run), "quantize_s": longer_s,
         "float_accuracy": run.accuracy, "test_accuracy": accuracy(longer_int8, cfg, "test")},
        {"recipe": f"+{steps} QAT steps, then int8", **timed(qat_run), "quantize_s": convert_s,
         "float_accuracy": qat_run.accuracy, "test_accuracy": accuracy(qat, cfg, "test")},
    ])
    frame["accuracy_drop"] = base.accuracy - frame.test_accuracy
    return frame

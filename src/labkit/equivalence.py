"""Is a plain-PyTorch training step the same as the engine's? `compare_step` runs both side by side.

A notebook shows a technique's core lines as a plain function (the mixed-precision step, the accumulation
loop) and checks it against `labkit.train.Trainer.step`; a code exercise runs the learner's function the
same way. Both start from the same weights and see the same batches. What is compared is what the
optimizer is given: the gradients at the moment ``optimizer.step()`` runs (after any unscaling and
clipping), then the weights after the step and, for fp16, the GradScaler's scale.

The ``step`` that `compare_step` runs is ``step(model, images, labels, optimizer)``, plus ``scaler`` and
``dtype`` when it takes parameters of those names: a GradScaler like the engine's, and the autocast dtype or
None for fp32. ``images`` are model inputs already on the device. A huge ``init_scale``, e.g. 2**40, makes the
first fp16 steps overflow: the engine skips them, and so must the plain step.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import data
from .config import RunConfig
from .errors import ConfigError
from .techniques.optimizers import build_optimizer
from .techniques.precision import DTYPES, grad_scaler
from .train import Trainer


@dataclass(frozen=True)
class StepComparison:
    """How far a plain step is from the engine's after ``steps`` optimizer steps.

    Attributes:
        grad_diff: largest difference of a gradient entry seen by ``optimizer.step()``, relative to the
            largest engine gradient entry (0: identical). inf: one side never stepped the optimizer.
        weight_diff: the same for the weights after the last step.
        engine_scale, plain_scale: the GradScalers' scales afterwards (1.0 without fp16).
        engine_steps, plain_steps: how many times each called ``optimizer.step()`` (fp16 skips a step whose
            gradients overflowed).
    """

    steps: int
    grad_diff: float
    weight_diff: float
    engine_scale: float
    plain_scale: float
    engine_steps: int
    plain_steps: int

    def same(self, rel_tol: float = 1e-5) -> bool:
        """Whether the two steps agree within ``rel_tol`` (default: float rounding of a CPU)."""
        return (self.grad_diff <= rel_tol and self.weight_diff <= rel_tol and self.engine_scale == self.plain_scale
                and self.engine_steps == self.plain_steps)


def _recording(optimizer: torch.optim.Optimizer, grads: list) -> None:
    def hook(opt, args, kwargs):
        grads.append([None if p.grad is None else p.grad.detach().float().clone()
                      for group in opt.param_groups for p in group["params"]])

    optimizer.register_step_pre_hook(hook)


def _relative(a: list, b: list) -> float:
    largest = max((float(t.abs().max()) for t in a if t is not None), default=0.0)
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if (x is None) != (y is None):
            return float("inf")
        if x is not None:
            worst = max(worst, float((x - y).abs().max()))
    return worst / largest if largest else worst


def compare_step(step: Callable, cfg: RunConfig, steps: int = 2, init_scale: float | None = None) -> StepComparison:
    """Run ``step`` and `Trainer.step` for ``cfg`` from the same weights on the same ``steps`` batches.

    Args:
        step: ``step(model, images, labels, optimizer)``, taking ``scaler``/``dtype`` too if it names them.
        cfg: the run the engine would do (its precision, grad_accum, grad_clip and optimizer).
        steps: optimizer steps to compare (two: the second one shows a scaler that was not updated).
        init_scale: the GradScalers' first scale (fp16; default PyTorch's 2**16); a huge one makes steps overflow.

    Returns:
        A `StepComparison`; ``.same()`` says whether they agree.

    Example:
        >>> compare_step(my_step, labkit.RunConfig(precision="fp16", grad_clip=1.0)).same()
        True
    """
    if not callable(step):
        raise ConfigError("step", step, "a function step(model, images, labels, optimizer[, scaler, dtype])")
    if cfg.checkpointing is not False:
        raise ConfigError("checkpointing", cfg.checkpointing, "False: compare a plain step on a plain model")
    with _deterministic_cudnn():
        return _compare(step, cfg, steps, init_scale)


@contextlib.contextmanager
def _deterministic_cudnn():
    """cuDNN's deterministic kernels for the comparison: its fastest ones may add in any order, and the
    rounding differences would hide (or fake) a real difference. No effect on a CPU."""
    kept = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = kept


def _compare(step: Callable, cfg: RunConfig, steps: int, init_scale: float | None) -> StepComparison:
    engine = Trainer(cfg)
    model = copy.deepcopy(engine.model)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum)
    scaler = grad_scaler(engine.precision, engine.device)
    if init_scale is not None:
        engine.scaler, scaler = (torch.amp.GradScaler(engine.device.type, init_scale=init_scale,
                                                      enabled=engine.precision.uses_scaler) for _ in range(2))
    engine_grads, plain_grads = [], []
    _recording(engine.optimizer, engine_grads)
    _recording(optimizer, plain_grads)
    wanted = inspect.signature(step).parameters
    extra = {}
    if "scaler" in wanted:
        extra["scaler"] = scaler
    if "dtype" in wanted:
        extra["dtype"] = DTYPES.get(engine.precision.name)
    for index, (images, labels) in enumerate(engine.batches(steps)):
        torch.manual_seed(cfg.seed + index)  # the same dropout masks, if the model has any
        engine.step(images, labels)
        torch.manual_seed(cfg.seed + index)
        x = data.to_model_input(images, engine.train_split, engine.device, cfg.channels_last, cfg.image_size)
        step(model, x, labels.to(engine.device), optimizer, **extra)
    if len(engine_grads) != len(plain_grads) or not engine_grads:
        grad_diff = float("inf")
    else:
        grad_diff = max(_relative(a, b) for a, b in zip(engine_grads, plain_grads, strict=True))
    weight_diff = _relative([p.detach() for p in engine.model.parameters()], [p.detach() for p in model.parameters()])
    return StepComparison(steps=steps, grad_diff=grad_diff, weight_diff=weight_diff,
                          engine_scale=float(engine.scaler.get_scale()) if engine.scaler.is_enabled() else 1.0,
                          plain_scale=float(scaler.get_scale()) if scaler.is_enabled() else 1.0,
                          engine_steps=len(engine_grads), plain_steps=len(plain_grads))

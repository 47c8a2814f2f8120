"""Optimizers, the mechanism: what ``RunConfig(optimizer=..., lr=..., lr_warmup_steps=...)`` builds.

- `build_optimizer`: AdamW, SGD, or bitsandbytes' 8-bit AdamW (`build_8bit_optimizer`) over the
  trainable parameters. bitsandbytes is imported only when an 8-bit optimizer is built, so
  ``import labkit`` never needs it.
- `scale_lr`: the linear (Goyal et al. 2017) and square-root learning-rate scaling rules for a batch size.
- `warmup_lr`: the linear learning-rate warm-up over the first optimizer steps.

8-bit AdamW (``adamw8bit``) keeps AdamW's two moments as uint8 codes in blocks of 256 values, each block with an
fp32 scale (absmax): about 2.03 bytes per parameter instead of 8. Tensors with fewer than ``min_8bit_size``
elements (biases, BatchNorm weights, small convolutions) keep fp32 moments: 8-bit state there would save little and
cost accuracy. ``paged_adamw8bit`` is the same optimizer with its state (of tensors of 100,000+ elements) in CUDA
unified memory, which the driver pages out to CPU memory when the GPU runs short; it needs a CUDA GPU. Paged state
is allocated outside PyTorch's allocator: the allocator's peak (``peak_memory_bytes`` on CUDA) leaves it out, the
memory breakdown's ``optimizer_state`` counts it.
"""

from __future__ import annotations

import functools
import math

import torch

from ..choices import EIGHT_BIT_OPTIMIZERS, OPTIMIZER_IMPLS, check_choice, check_optimizer
from ..env import import_bitsandbytes
from ..errors import ConfigError
from ..validate import check_positive_int, is_int

MIN_8BIT_SIZE = 4096  # bitsandbytes' default: tensors with fewer elements keep 32-bit state
BNB_BLOCK_SIZE = 256  # elements per quantisation block (one fp32 absmax per block and state), since 0.44
BNB_QMAP_BYTES = 2 * 256 * 4  # the two 256-entry fp32 quantisation maps, shared by all tensors
PAGED_MIN_NUMEL = 100_000  # bitsandbytes pages only the state of tensors at least this large
BITSANDBYTES_REQUIREMENT = "bitsandbytes>=0.50"
INSTALL_HINT = (f"Install (or upgrade) it with `pip install '{BITSANDBYTES_REQUIREMENT}'` (or `pip install "
                "'labkit-finetune[memory]'`); 0.50 is the first version whose 8-bit optimizers run on the CPU too")


def bitsandbytes_module(optimizer: str = "adamw8bit"):
    """Import bitsandbytes, or raise `ConfigError` naming ``optimizer`` with the install hint.

    Example:
        >>> bnb = bitsandbytes_module()
        >>> bnb.__version__
        '0.50.2'
    """
    try:
        bitsandbytes = import_bitsandbytes()
    except ImportError as exc:
        raise ConfigError("optimizer", optimizer, "'adamw' or 'sgd' without the bitsandbytes package, which is "
                          f"not installed ({exc})", INSTALL_HINT) from exc
    except Exception as exc:  # noqa: BLE001 - a broken install (e.g. a CUDA library mismatch) fails on import
        raise ConfigError("optimizer", optimizer, "'adamw' or 'sgd': bitsandbytes is installed but failed to "
                          f"import ({type(exc).__name__}: {exc})", INSTALL_HINT) from exc
    return bitsandbytes


@functools.lru_cache(maxsize=8)
def _runs_on(device: str) -> str | None:
    """None when bitsandbytes' 8-bit AdamW can take a step on ``device``, else why not."""
    bnb = bitsandbytes_module()
    try:
        weight = torch.zeros(MIN_8BIT_SIZE, device=device, requires_grad=True)
        weight.grad = torch.ones_like(weight)
        probe = bnb.optim.AdamW8bit([weight], lr=1e-3)
        probe.step()
    except Exception as exc:  # noqa: BLE001 - any failure means it cannot run here; the caller says so
        return f"{type(exc).__name__}: {exc}"
    return None


def build_8bit_optimizer(params, optimizer: str = "adamw8bit", lr: float = 1e-3, weight_decay: float = 0.0,
                         min_8bit_size: int = MIN_8BIT_SIZE) -> torch.optim.Optimizer:
    """bitsandbytes' 8-bit AdamW over ``params``: what ``RunConfig(optimizer="adamw8bit")`` builds (see above).

    Args:
        params: the parameters to optimise (all on one device).
        optimizer: ``adamw8bit`` or ``paged_adamw8bit``.
        lr, weight_decay: as for ``torch.optim.AdamW`` (decoupled weight decay; betas (0.9, 0.999), eps 1e-8).
        min_8bit_size: tensors with fewer elements keep 32-bit state (bitsandbytes' default 4096).

    Example:
        >>> opt = build_8bit_optimizer(model.parameters(), "adamw8bit", lr=1e-3)
    """
    if optimizer not in EIGHT_BIT_OPTIMIZERS:
        raise ConfigError("optimizer", optimizer, f"one of {list(EIGHT_BIT_OPTIMIZERS)} (bitsandbytes' 8-bit AdamW)")
    if not is_int(min_8bit_size) or min_8bit_size < 0:
        raise ConfigError("min_8bit_size", min_8bit_size, "an integer >= 0 (0: every tensor gets 8-bit state)")
    params = list(params)
    if not params:
        raise ConfigError("params", params, "at least one parameter to optimise")
    device = params[0].device
    if optimizer.startswith("paged_") and device.type != "cuda":
        raise ConfigError(
            "optimizer", optimizer, f"'adamw8bit' on device '{device}'",
            "Paged optimizers keep their state in CUDA unified memory, which the GPU driver pages out to CPU "
            "memory; without a CUDA GPU there is nothing to page (bitsandbytes would quietly run adamw8bit). "
            "adamw8bit has the same 8-bit state")
    bnb = bitsandbytes_module(optimizer)
    failure = _runs_on(str(device))
    if failure is not None:
        raise ConfigError("optimizer", optimizer,
                          f"'adamw' or 'sgd' here: bitsandbytes {bnb.__version__} cannot run 8-bit optimizers on "
                          f"'{device}' ({failure})", INSTALL_HINT)
    cls = bnb.optim.PagedAdamW8bit if optimizer == "paged_adamw8bit" else bnb.optim.AdamW8bit
    return cls(params, lr=lr, weight_decay=weight_decay, min_8bit_size=min_8bit_size)


def impl_kwargs(impl: str | None) -> dict:
    """torch.optim's keywords for kernel choice ``impl``: ``forloop``, ``foreach``, ``fused``, or None (torch's pick).

    Example:
        >>> torch.optim.AdamW(model.parameters(), **impl_kwargs("fused"))
    """
    if impl is None:
        return {}
    check_choice("optimizer_impl", impl, OPTIMIZER_IMPLS, "None (torch's default) or one of")
    return {"forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]


def build_optimizer(model: torch.nn.Module, name: str = "adamw", lr: float = 1e-3, weight_decay: float = 0.0,
                    momentum: float = 0.9, impl: str | None = None) -> torch.optim.Optimizer:
    """The optimizer called ``name`` over ``model``'s trainable parameters: what ``RunConfig(optimizer=...)`` builds.

    Args:
        model: its parameters that require a gradient are optimised (frozen ones get no state).
        name: ``adamw``, ``sgd`` or bitsandbytes' ``adamw8bit`` / ``paged_adamw8bit`` (`build_8bit_optimizer`).
        lr: the learning rate.
        weight_decay: decoupled for AdamW, L2 for SGD.
        momentum: SGD's momentum (the others have none).
        impl: torch.optim's kernels for AdamW and SGD (`impl_kwargs`); the 8-bit ones refuse anything but None.

    Example:
        >>> opt = build_optimizer(model, "adamw", lr=1e-3, impl="fused")
    """
    check_optimizer(name)
    params = [p for p in model.parameters() if p.requires_grad]
    kernels = impl_kwargs(impl)
    if name in EIGHT_BIT_OPTIMIZERS:
        if impl is not None:
            raise ConfigError("optimizer_impl", impl, f"None with optimizer={name!r}",
                              "bitsandbytes' 8-bit optimizers have their own kernels")
        return build_8bit_optimizer(params, name, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **kernels)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kernels)


LR_RULES = ("linear", "sqrt")


def scale_lr(lr: float, batch_size: int, base_batch_size: int, rule: str = "linear") -> float:
    """The learning rate for ``batch_size``, from ``lr`` that works at ``base_batch_size``.

    ``linear`` multiplies by batch_size / base_batch_size (Goyal et al. 2017, for SGD, with a warm-up); ``sqrt``
    by its square root, which keeps the gradient noise constant and suits Adam-style optimizers better.

    Args:
        lr: the learning rate tuned at ``base_batch_size``.
        batch_size: the batch size to scale it to.
        base_batch_size: the batch size ``lr`` was chosen for.
        rule: ``linear`` or ``sqrt``.

    Example:
        >>> cfg.replace(lr=scale_lr(cfg.lr, 256, base_batch_size=64))  # 4x cfg.lr
    """
    if rule not in LR_RULES:
        raise ConfigError("rule", rule, "'linear' (SGD, Goyal et al. 2017) or 'sqrt' (Adam-style optimizers)")
    check_positive_int("base_batch_size", base_batch_size)
    check_positive_int("batch_size", batch_size)
    ratio = batch_size / base_batch_size
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))


def warmup_lr(optimizer: torch.optim.Optimizer, lr: float, step: int, warmup_steps: int) -> None:
    """Set the learning rate of optimizer step ``step`` (0-based) of a linear warm-up to ``lr``.

    Step ``s`` uses ``lr * (s + 1) / warmup_steps``; from step ``warmup_steps`` on, the lr is left as it is
    (``lr``). The lr is set directly rather than through a scheduler: a GradScaler that skips a step would
    make a scheduler warn about its call order, and this costs nothing after the warm-up.

    Example:
        >>> for step in range(steps):
        ...     warmup_lr(optimizer, lr=1e-3, step=step, warmup_steps=100); train_step(); optimizer.step()
    """
    if step < warmup_steps:
        for group in optimizer.param_groups:
            group["lr"] = lr * (step + 1) / warmup_steps

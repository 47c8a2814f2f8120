"""Memory savers (notebook 03): gradient checkpointing, 8-bit optimizers, and what training memory costs.

One call per experiment:

- `apply_checkpointing` (what ``RunConfig(checkpointing=...)`` does), `checkpoint_segments`,
  `checkpoint_tradeoff` and `tradeoff_finding`: recompute activations in the backward pass instead of
  storing them, and measure what that saves and costs over the number of segments, beside the cost model
  of Chen et al. 2016 (the sqrt(n) rule).
- `build_8bit_optimizer` (what ``RunConfig(optimizer="adamw8bit" | "paged_adamw8bit")`` does),
  `optimizer_state_table`, `eight_bit_savings`: bitsandbytes' 8-bit AdamW, tensor by tensor, and why
  tensors below ``min_8bit_size`` keep 32-bit state.
- `training_memory`, `model_training_memory`, `calculator_check`, `scale_table`, `optimizer_claim`: the
  bytes-per-parameter accounting (weights, gradients, optimizer state, master weights), checked against a
  measured step and applied to 7B and 175B models.
- `staged_runs`: baseline, +AMP, +checkpointing, +8-bit optimizer and all together, for one stacked
  memory chart (``labkit.plots.memory_breakdown(staged.frame, label="stage")``) with step time beside it.

bitsandbytes is imported only when an 8-bit optimizer is built, so ``import labkit`` never needs it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import models
from ..config import RunConfig, is_int, is_number
from ..errors import ConfigError

# ---------------------------------------------------------------------------------------------
# Gradient checkpointing

_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


class _KeepBatchNormStats:
    """Context for a checkpoint's recomputation: BatchNorm layers update scratch copies of their running
    statistics, which are dropped afterwards.

    Recomputing a segment runs its forward a second time, in train mode, and every BatchNorm layer in it
    would update ``running_mean``/``running_var`` (and ``num_batches_tracked``) again: twice per step in
    all (torch does nothing about it). Turning the update off instead (``track_running_stats=False``) is
    not possible: BatchNorm then saves different tensors and torch's checkpoint raises a CheckpointError.
    """

    def __init__(self, batchnorms: list[nn.Module]):
        self.batchnorms = batchnorms
        self._kept: list[dict] = []

    def __enter__(self):
        self._kept = []
        for bn in self.batchnorms:
            kept = {name: bn._buffers[name] for name in _BN_BUFFERS if bn._buffers.get(name) is not None}
            self._kept.append(kept)
            for name, tensor in kept.items():
                bn._buffers[name] = tensor.clone()
        return self

    def __exit__(self, *exc):
        for bn, kept in zip(self.batchnorms, self._kept, strict=True):
            bn._buffers.update(kept)
        self._kept = []
        return False


class _Segment:
    """Consecutive blocks run as one checkpointed unit."""

    def __init__(self, names: list[str], stages: list[nn.Module], model: nn.Module):
        registered = {id(m) for m in model.modules()}
        # A stage may be a view built by `named_stages` (e.g. a ResNet's stem, a Sequential of conv1, bn1,
        # relu, maxpool): call its children, which are the model's own modules, not the view.
        self.calls = []
        for stage in stages:
            self.calls.extend([stage] if id(stage) in registered else list(stage.children()))
        self.names = names
        self.batchnorms = [m for stage in stages for m in stage.modules()
                           if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def run(self, x: torch.Tensor) -> torch.Tensor:
        for call in self.calls:
            x = call(x)
        return x

    def contexts(self):
        return contextlib.nullcontext(), _KeepBatchNormStats(self.batchnorms)


class _CheckpointedForward:
    """The forward a checkpointed model runs: its blocks in checkpointed segments, then its head."""

    def __init__(self, model: nn.Module, segments: list[_Segment]):
        self.model = model
        self.segments = segments

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        model = self.model
        if not torch.is_grad_enabled():  # evaluation: nothing is stored for a backward pass anyway
            return type(model).forward(model, x)
        for segment in self.segments:
            x = checkpoint(segment.run, x, use_reentrant=False, context_fn=segment.contexts)
        return models.forward_head(model, x)


def checkpoint_blocks(model: nn.Module | str) -> list[str]:
    """The blocks of ``model`` that checkpointing can wrap: every stage before the head, in forward order.

    small_cnn: ``stem, block1, block2, block3``; ResNets: ``stem, layer1 .. layer4``; ShuffleNetV2:
    ``stem, stage2, stage3, stage4, conv5``. The stem counts: in a CNN it works at full resolution and
    often holds the largest activations. A model labkit cannot split raises `ConfigError`.

    Example:
        >>> checkpoint_blocks("small_cnn")
        ['stem', 'block1', 'block2', 'block3']
    """
    return models.block_names(model)


def checkpoint_segments(model: nn.Module | str, checkpointing: bool | int) -> list[list[str]]:
    """How ``checkpointing`` groups ``model``'s blocks into checkpointed segments (``[]`` when off).

    ``True`` puts every block in its own segment; an int ``k`` splits the ``n`` blocks into ``k`` runs of
    consecutive blocks, as even as possible with the longer runs first.

    Args:
        model: a model from `labkit.models.build`, or a model name.
        checkpointing: False, True or 1 .. number of blocks.

    Example:
        >>> checkpoint_segments("small_cnn", 2)
        [['stem', 'block1'], ['block2', 'block3']]
    """
    if checkpointing is False:
        return []
    try:
        names = checkpoint_blocks(model)
    except ConfigError as exc:
        name = model if isinstance(model, str) else type(models._unwrap(model)).__name__
        raise ConfigError(
            "checkpointing", checkpointing,
            f"False for a {name}: labkit splits only the models of labkit.models.build ({', '.join(models.available())}) "
            "into blocks", "For a model of your own, call torch.utils.checkpoint.checkpoint(block, x, "
            "use_reentrant=False) on its blocks in its forward",
        ) from exc
    n = len(names)
    label = model if isinstance(model, str) else getattr(models._unwrap(model), "labkit_name", "this model")
    if checkpointing is True:
        segments = n
    elif is_int(checkpointing) and 1 <= checkpointing <= n:
        segments = int(checkpointing)
    else:
        raise ConfigError("checkpointing", checkpointing,
                          f"False, True or 1 to {n}: {label} has {n} blocks ({', '.join(names)}), and a "
                          "segment holds at least one")
    sizes = [n // segments + (1 if i < n % segments else 0) for i in range(segments)]
    groups, start = [], 0
    for size in sizes:
        groups.append(names[start:start + size])
        start += size
    return groups


def apply_checkpointing(model: nn.Module, checkpointing: bool | int) -> nn.Module:
    """Run ``model``'s blocks in checkpointed segments (in place); what ``RunConfig(checkpointing=...)`` does.

    Each segment runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: only its
    input is kept, and its activations are recomputed in the backward pass. Losses, gradients and
    BatchNorm running statistics equal the un-checkpointed model's (the recomputation updates scratch
    copies of the statistics; torch alone would update them twice per step). Without gradients (evaluation
    under ``torch.no_grad``) the model runs as usual. The module structure and the state_dict do not
    change; ``checkpointing=False`` restores the plain forward.

    Args:
        model: a model from `labkit.models.build` (DDP/compile wrappers are looked through).
        checkpointing: False, True (every block its own segment) or the number of segments (see
            `checkpoint_segments`).

    Returns:
        ``model``, with ``model.labkit_checkpoint_segments`` listing the segments' block names.

    Example:
        >>> model = apply_checkpointing(models.build("small_cnn", 10)[0], checkpointing=2)
        >>> model.labkit_checkpoint_segments
        [['stem', 'block1'], ['block2', 'block3']]
    """
    m = models._unwrap(model)
    groups = checkpoint_segments(m, checkpointing)
    m.__dict__.pop("forward", None)
    m.labkit_checkpoint_segments = groups
    if groups:
        stages = dict(models.named_stages(m))
        m.forward = _CheckpointedForward(m, [_Segment(g, [stages[name] for name in g], m) for g in groups])
    return model


def _profile_blocks(model: nn.Module, x: torch.Tensor) -> dict:
    """Bytes each block saves for the backward pass in one forward of ``x``, and each block's output bytes."""
    stages = dict(models.named_stages(model))
    seen: set[int] = set()
    saved: dict[str, int] = {}
    current = ["input"]

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            saved[current[0]] = saved.get(current[0], 0) + storage.nbytes()
        return tensor

    outputs = {"input": x.untyped_storage().nbytes()}
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = x
        for name in checkpoint_blocks(model):
            current[0] = name
            h = _Segment([name], [stages[name]], model).run(h)
            outputs[name] = h.untyped_storage().nbytes()
        current[0] = "head"
        models.forward_head(model, h)
    return {"saved": saved, "outputs": outputs}


def _predicted_activations(profile: dict, names: list[str], groups: list[list[str]]) -> int:
    """Chen et al.'s cost model: the stored segment inputs plus the largest recomputed segment.

    Without checkpointing every saved tensor is stored. With segments, the forward keeps each segment's
    input (and the head's own tensors); the backward recomputes one segment at a time, while the inputs of
    the segments before it are still stored. For ``n`` equal one-tensor layers in ``k`` segments this is
    ``k + n/k`` layers, smallest at ``k = sqrt(n)``: the sqrt(n) rule.
    """
    saved, outputs = profile["saved"], profile["outputs"]
    head = saved.get("head", 0)
    if not groups:
        return sum(saved.values())
    previous = {name: prev for prev, name in zip(["input", *names], names, strict=False)}
    inputs = [outputs[previous[g[0]]] for g in groups]
    end_of_forward = sum(inputs) + head
    backward = max(sum(inputs[:j + 1]) + max(0, sum(saved.get(b, 0) for b in g) - inputs[j])
                   for j, g in enumerate(groups))
    return int(max(end_of_forward, backward))


def _segments_label(groups: list[list[str]]) -> str:
    return " | ".join("+".join(g) for g in groups) if groups else "off"


def checkpoint_tradeoff(cfg: RunConfig, segments: Iterable[int] | None = None, refresh: bool = False,
                        progress: bool = True):
    """Train ``cfg`` once per number of checkpointed segments and measure memory against time.

    Runs go through `labkit.results.run_configs` (cached; a failed run becomes a row with its ``error``).
    Rows have `labkit.sweep`'s columns plus:

    - ``segments`` (0: checkpointing off) and ``segment_blocks`` (which blocks each segment holds);
    - ``activation_ratio``, ``peak_ratio``, ``time_ratio``, ``flops_ratio``: activations
      (``mem_activations_bytes``), peak memory, step time and FLOPs per step relative to the run without
      checkpointing (FLOPs grow by the recomputed forward);
    - ``predicted_activation_bytes`` / ``predicted_activation_ratio``: Chen et al.'s cost model (stored
      segment inputs plus the largest recomputed segment) from the bytes each block saves in one forward;
    - ``sqrt_rule_segments``: round(sqrt(n)) for ``n`` blocks, the rule's best segment count for equal
      blocks, and ``sqrt_rule`` (True on that row).

    Args:
        cfg: the run (its ``checkpointing`` is replaced).
        segments: segment counts to run (default ``0, 1, ..., n``).
        refresh: rerun even when cached results exist; progress: show progress bars.

    Example:
        >>> df = checkpoint_tradeoff(cfg)
        >>> df[["segments", "peak_ratio", "activation_ratio", "time_ratio"]]
    """
    import pandas as pd

    from .. import data, results, train
    from .precision import autocast

    names = checkpoint_blocks(cfg.model)
    counts = list(range(len(names) + 1) if segments is None else segments)
    if not counts:
        raise ConfigError("segments", counts, f"a non-empty list of segment counts from 0 (off) to {len(names)}")
    configs = []
    for count in counts:  # every count is validated before anything runs
        if not is_int(count) or not 0 <= count <= len(names):
            raise ConfigError("segments", count, f"segment counts from 0 (checkpointing off) to {len(names)} "
                                                 f"({cfg.model} has {len(names)} blocks: {', '.join(names)})")
        configs.append(cfg.replace(checkpointing=int(count) if count else False))
    if 0 not in counts:
        configs.append(cfg.replace(checkpointing=False))  # the reference every ratio is relative to
    runs = results.run_configs(configs, refresh=refresh, progress=progress)
    base = runs[counts.index(0)] if 0 in counts else runs[-1]
    trainer = train.Trainer(cfg.replace(checkpointing=False, evaluate=False, pretrained=False))
    images, _ = next(iter(trainer.loader))
    with autocast(trainer.precision, trainer.device):
        block_profile = _profile_blocks(trainer.model, data.to_model_input(
            images, trainer.train_split, trainer.device, cfg.channels_last))
    predicted_base = _predicted_activations(block_profile, names, [])
    rule = round(math.sqrt(len(names)))
    rows = []
    for count, result in zip(counts, runs, strict=False):
        groups = checkpoint_segments(cfg.model, int(count) if count else False)
        row = results.to_row(result)
        predicted = _predicted_activations(block_profile, names, groups)
        row.update(segments=int(count), segment_blocks=_segments_label(groups),
                   activation_ratio=_ratio(result.memory.get("activations"), base.memory.get("activations")),
                   peak_ratio=_ratio(result.peak_memory_bytes, base.peak_memory_bytes),
                   time_ratio=_ratio(result.step_time_s, base.step_time_s),
                   flops_ratio=_ratio(result.flops_per_step, base.flops_per_step),
                   predicted_activation_bytes=predicted, predicted_activation_ratio=predicted / predicted_base,
                   sqrt_rule_segments=rule, sqrt_rule=count == rule)
        rows.append(row)
    first = ["segments", "segment_blocks", "peak_memory_bytes", "mem_activations_bytes", "step_time_s",
             "peak_ratio", "activation_ratio", "time_ratio", "flops_ratio", "predicted_activation_ratio"]
    frame = pd.DataFrame(rows)
    return frame[first + [c for c in frame.columns if c not in first]]


def _ratio(value, reference) -> float:
    if value is None or reference is None or not reference or _isnan(value) or _isnan(reference):
        return math.nan
    return value / reference


def _isnan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _mib(nbytes) -> str:
    return f"{nbytes / 2**20:.3g} MiB"


def tradeoff_finding(frame) -> str:
    """What checkpointing saved and cost in this run, as a sentence computed from `checkpoint_tradeoff`'s frame.

    Example:
        >>> print(tradeoff_finding(checkpoint_tradeoff(cfg)))
    """
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    base = ok[ok["segments"] == 0]
    on = ok[ok["segments"] > 0]
    if base.empty or on.empty:
        raise ConfigError("frame", f"{len(ok)} successful rows",
                          "a checkpoint_tradeoff frame with the run without checkpointing (segments=0) and at "
                          "least one with it")
    base = base.iloc[0]
    # The lowest peak; among equal peaks, the fewest activations.
    best = on.sort_values(["peak_memory_bytes", "mem_activations_bytes"], kind="stable").iloc[0]
    ties = on[(on["peak_memory_bytes"] == best["peak_memory_bytes"]) & (on["segments"] != best["segments"])]
    also = f", as did {', '.join(str(int(k)) for k in ties['segments'])} segment(s)" if len(ties) else ""
    rule = int(best["sqrt_rule_segments"])
    n = len(checkpoint_blocks(best["model"]))
    text = (
        f"Checkpointing {best['model']} in {int(best['segments'])} segment(s) ({best['segment_blocks']}) gave the "
        f"lowest peak{also}: {_mib(best['peak_memory_bytes'])} instead of {_mib(base['peak_memory_bytes'])} "
        f"({_saved(best['peak_ratio'])}); activations alone went from {_mib(base['mem_activations_bytes'])} to "
        f"{_mib(best['mem_activations_bytes'])} ({_saved(best['activation_ratio'])}). It cost time: a step took "
        f"{best['time_ratio']:.2f}x as long ({base['step_time_s'] * 1e3:.3g} ms -> "
        f"{best['step_time_s'] * 1e3:.3g} ms), with {best['flops_ratio']:.2f}x the FLOPs (the recomputed forward)."
    )
    if best["peak_ratio"] > 1 - (1 - best["activation_ratio"]) / 2:
        text += (" The peak fell much less than the activations: it is reached during the backward pass, where a "
                 "recomputed block's activations and their gradients are alive together, and no grouping of "
                 "whole blocks into segments splits a block.")
    text += (f" The sqrt(n) rule, which assumes n equal blocks that each store one tensor, suggests {rule} segment(s) "
             f"for {n} blocks")
    rule_row = on[on["segments"] == rule]
    if int(best["segments"]) == rule:
        text += ", which is what measured best."
    elif len(rule_row) and rule_row.iloc[0]["peak_memory_bytes"] == best["peak_memory_bytes"]:
        text += (f"; {rule} reached the same peak, with more activations stored "
                 f"({_mib(rule_row.iloc[0]['mem_activations_bytes'])}): these blocks differ in how much they store, "
                 "and each stores several tensors.")
    else:
        text += ("; here it is not the best: these blocks differ in how much they store, and each stores "
                 "several tensors.")
    return text


def _saved(ratio: float) -> str:
    if _isnan(ratio):
        return "not measured"
    if abs(1 - ratio) < 0.005:
        return "no change"
    return f"{1 - ratio:.0%} less" if ratio < 1 else f"{ratio - 1:.0%} more"


# ---------------------------------------------------------------------------------------------
# 8-bit optimizers (bitsandbytes)

EIGHT_BIT_OPTIMIZERS = ("adamw8bit", "paged_adamw8bit")
MIN_8BIT_SIZE = 4096  # bitsandbytes' default: tensors with fewer elements keep 32-bit state
BNB_BLOCK_SIZE = 256  # elements per quantisation block (one fp32 absmax per block and state), since 0.44
BNB_QMAP_BYTES = 2 * 256 * 4  # the two 256-entry fp32 quantisation maps, shared by all tensors
PAGED_MIN_NUMEL = 100_000  # bitsandbytes pages only the state of tensors at least this large
BITSANDBYTES_REQUIREMENT = "bitsandbytes>=0.50"
INSTALL_HINT = (f"Install (or upgrade) it with `pip install '{BITSANDBYTES_REQUIREMENT}'` (or `pip install "
                "'labkit-finetune[memory]'`); 0.50 is the first version whose 8-bit optimizers run on the CPU too")


class _SkipUnusedKernelWarning(logging.Filter):
    """bitsandbytes logs, on import on some CPUs, that an optional 4-bit matmul kernel package is missing;
    labkit uses no 4-bit matmul, so the message would only mislead a learner."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "gemm_4bit_forward" not in record.getMessage()


def bitsandbytes_module(optimizer: str = "adamw8bit"):
    """Import bitsandbytes, or raise `ConfigError` naming ``optimizer`` with the install hint.

    Example:
        >>> bnb = bitsandbytes_module()
        >>> bnb.__version__
        '0.50.2'
    """
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_SkipUnusedKernelWarning())
    try:
        import bitsandbytes
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
    """bitsandbytes' 8-bit AdamW over ``params``: what ``RunConfig(optimizer="adamw8bit")`` builds.

    ``adamw8bit`` keeps AdamW's two moments as uint8 codes in blocks of 256 values, each block with an
    fp32 scale (absmax): about 2.03 bytes per parameter instead of 8. Tensors with fewer than
    ``min_8bit_size`` elements (biases, BatchNorm weights, small convolutions) keep fp32 moments: 8-bit
    state there would save little and cost accuracy. ``paged_adamw8bit`` is the same optimizer with its
    state (of tensors of 100,000+ elements) in CUDA unified memory, which the driver pages out to CPU
    memory when the GPU runs short; it needs a CUDA GPU. Paged state is allocated outside PyTorch's
    allocator: the allocator's peak (``peak_memory_bytes`` on CUDA) leaves it out, the memory breakdown's
    ``optimizer_state`` counts it.

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


def _storage_key(tensor: torch.Tensor) -> tuple:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def optimizer_state_table(optimizer: torch.optim.Optimizer, model: nn.Module | None = None):
    """The optimizer's state tensor by tensor: what each parameter tensor costs, and in which dtype.

    Columns: ``tensor`` (the parameter's name when ``model`` is given), ``numel``, ``state_dtype`` (of the
    moments: float32, or uint8 for 8-bit state), ``state_bytes``, ``bytes_per_param``, and, for
    bitsandbytes optimizers, ``below_min_8bit_size`` (True: the tensor is too small for 8-bit state and
    keeps fp32 moments). State shared by all tensors (bitsandbytes' quantisation maps) is one last row
    with ``numel`` 0, so ``state_bytes`` sums to `labkit.measure.optimizer_state_bytes`.

    Example:
        >>> optimizer_state_table(trainer.optimizer, trainer.model).groupby("below_min_8bit_size").sum()
    """
    import pandas as pd

    names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
    min_size = getattr(getattr(optimizer, "args", None), "min_8bit_size", None)
    counts: dict[tuple, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                counts[_storage_key(value)] = counts.get(_storage_key(value), 0) + 1
    rows, shared, shared_seen = [], 0, set()
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            own = 0
            dtype = None
            for key, value in state.items():
                if not torch.is_tensor(value):
                    continue
                storage = _storage_key(value)
                if counts[storage] > 1:  # shared between tensors: counted once, in the last row
                    if storage not in shared_seen:
                        shared_seen.add(storage)
                        shared += value.untyped_storage().nbytes()
                    continue
                own += value.untyped_storage().nbytes()
                if key in ("exp_avg", "state1", "momentum_buffer"):
                    dtype = str(value.dtype).replace("torch.", "")
            row = {"tensor": names.get(id(p), f"param {index}"), "numel": p.numel(), "state_dtype": dtype,
                   "state_bytes": own, "bytes_per_param": own / p.numel() if p.numel() else math.nan}
            if min_size is not None:
                row["below_min_8bit_size"] = p.numel() < min_size
            rows.append(row)
            index += 1
    if shared:
        row = {"tensor": "(shared: quantisation maps)", "numel": 0, "state_dtype": "float32",
               "state_bytes": shared, "bytes_per_param": math.nan}
        if min_size is not None:
            row["below_min_8bit_size"] = None
        rows.append(row)
    frame = pd.DataFrame(rows)
    if min_size is not None:
        frame["below_min_8bit_size"] = frame["below_min_8bit_size"].astype("boolean")  # NA on the shared row
    return frame


def eight_bit_savings(model_names: Iterable[str] | None = None, min_8bit_size: int = MIN_8BIT_SIZE,
                      num_classes: int = 10):
    """Optimizer state of AdamW and 8-bit AdamW per model, computed from its tensor sizes (no training).

    Shows why small models save less: tensors with fewer than ``min_8bit_size`` elements keep 32-bit state.
    Columns: ``model``, ``num_params``, ``params_below_min_8bit_size`` and its ``share_below``,
    ``adamw_state_bytes``, ``adamw8bit_state_bytes``, ``state_ratio`` (8-bit / AdamW) and 8-bit
    ``bytes_per_param``.

    Example:
        >>> eight_bit_savings(["small_cnn", "resnet18"])
    """
    import pandas as pd

    rows = []
    for name in list(models.available() if model_names is None else model_names):
        model = models.build(name, num_classes, pretrained=False)[0]
        sizes = [p.numel() for p in model.parameters() if p.requires_grad]
        total = sum(sizes)
        adamw = training_memory(total, optimizer="adamw")["optimizer_state"]
        eight = training_memory(total, optimizer="adamw8bit", tensor_sizes=sizes,
                                min_8bit_size=min_8bit_size)["optimizer_state"]
        below = sum(n for n in sizes if n < min_8bit_size)
        rows.append({"model": name, "num_params": total, "params_below_min_8bit_size": below,
                     "share_below": below / total, "min_8bit_size": min_8bit_size, "adamw_state_bytes": adamw,
                     "adamw8bit_state_bytes": eight, "state_ratio": eight / adamw, "bytes_per_param": eight / total})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# The calculator

WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
CALCULATOR_OPTIMIZERS = ("adamw", "sgd", "adamw8bit", "paged_adamw8bit")
COMPONENTS = ("weights", "gradients", "optimizer_state", "master_weights")


def _eight_bit_state_bytes(sizes: list[int], min_8bit_size: int) -> int:
    total, any_8bit = 0, False
    for n in sizes:
        if n < min_8bit_size:
            total += 8 * n  # two fp32 moments
        else:
            any_8bit = True
            total += 2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK_SIZE)  # two uint8 moments, an fp32 absmax per block each
    return total + (BNB_QMAP_BYTES if any_8bit else 0)


def training_memory(num_params: int | float, precision: str = "fp32", optimizer: str = "adamw",
                    master_weights: bool | None = None, trainable_params: int | float | None = None,
                    tensor_sizes: Iterable[int] | None = None, min_8bit_size: int = MIN_8BIT_SIZE,
                    momentum: bool = True) -> dict:
    """Bytes of training memory that do not depend on the batch: the standard per-parameter accounting.

    Components (activations are extra and grow with the batch):

    - ``weights``: 4 bytes per parameter in fp32, 2 in fp16/bf16.
    - ``gradients``: one per trainable parameter, in the weights' dtype.
    - ``master_weights``: an fp32 copy of the trainable weights when the weights are half precision
      (``master_weights=None`` means yes for fp16/bf16): the optimizer updates the copy, and the half
      weights are rounded from it. ``master_weights=False`` is "pure" half-precision training.
    - ``optimizer_state``: AdamW two moments in the dtype of the weights it updates (8 bytes per
      trainable parameter for fp32 or master weights, 4 for pure half weights); SGD one momentum buffer
      (none when ``momentum=False``); 8-bit AdamW (``adamw8bit``, ``paged_adamw8bit``) two uint8 moments
      plus an fp32 absmax per 256-value block for each (2 + 8/256 = 2.03 bytes per parameter) and 2 KiB
      of shared quantisation maps; tensors with fewer than ``min_8bit_size`` elements keep fp32 moments
      (8 bytes), which only ``tensor_sizes`` can account for (without it every tensor counts as large).
      Paged state has the same size; it can be paged out to CPU memory.

    Two conventions for "mixed precision": ``torch.autocast`` (what labkit's ``precision="bf16"`` runs)
    keeps the weights, gradients and optimizer state in fp32 and only computes in half precision, so
    describe it here as ``precision="fp32"`` (4 + 4 + 8 = 16 bytes per parameter with AdamW; autocast
    saves activation memory, not these). The classic recipe (Micikevicius et al. 2018) and the ZeRO paper
    keep fp16 weights and gradients plus an fp32 master copy: 2 + 2 + (4 + 8) = 16 bytes per parameter
    (ZeRO counts the master copy as optimizer state, "12 bytes"): the same total, split differently.
    Not counted: AdamW's per-tensor step counters (4 bytes each) and allocator overhead.

    Args:
        num_params: the model's parameters (a count; 7e9 is fine).
        precision: dtype of the stored weights: ``fp32``, ``fp16`` or ``bf16``.
        optimizer: ``adamw``, ``sgd``, ``adamw8bit`` or ``paged_adamw8bit``.
        master_weights: keep an fp32 master copy (default: yes for half-precision weights, never for fp32).
        trainable_params: parameters that get gradients and optimizer state (default all).
        tensor_sizes: element counts of the trainable tensors, for the exact 8-bit accounting.
        min_8bit_size: bitsandbytes' threshold (default 4096).
        momentum: SGD keeps a momentum buffer (labkit's default momentum is 0.9).

    Returns:
        A dict of bytes: ``weights``, ``gradients``, ``optimizer_state``, ``master_weights``, ``total``.

    Example:
        >>> training_memory(7e9, optimizer="adamw")["total"] / 1e9   # fp32 + AdamW: 16 bytes/param
        112.0
        >>> training_memory(7e9, "bf16", "adamw")                   # 2 + 2 + 8 + 4 = 16 bytes/param
    """
    if not is_number(num_params) or num_params <= 0:
        raise ConfigError("num_params", num_params, "a number of parameters > 0 (e.g. 7e9)")
    if precision not in WEIGHT_BYTES:
        raise ConfigError("precision", precision, f"one of {list(WEIGHT_BYTES)} (the dtype of the stored weights)",
                          "torch.autocast keeps fp32 weights: describe an autocast run as 'fp32'")
    if optimizer not in CALCULATOR_OPTIMIZERS:
        raise ConfigError("optimizer", optimizer, f"one of {list(CALCULATOR_OPTIMIZERS)}")
    if master_weights not in (None, True, False):
        raise ConfigError("master_weights", master_weights, "None (the default for the precision), True or False")
    if precision == "fp32" and master_weights:
        raise ConfigError("master_weights", master_weights, "None or False with precision='fp32'",
                          "fp32 weights are their own master copy")
    trainable = num_params if trainable_params is None else trainable_params
    if not is_number(trainable) or not 0 <= trainable <= num_params:
        raise ConfigError("trainable_params", trainable_params, f"None or a number from 0 to num_params={num_params:g}")
    if not is_int(min_8bit_size) or min_8bit_size < 0:
        raise ConfigError("min_8bit_size", min_8bit_size, "an integer >= 0")
    if not isinstance(momentum, bool):
        raise ConfigError("momentum", momentum, "True or False")
    if optimizer != "sgd" and momentum is not True:
        raise ConfigError("momentum", momentum, "True (the default) unless optimizer='sgd'",
                          f"{optimizer} has no momentum setting")
    sizes = None
    if tensor_sizes is not None:
        sizes = list(tensor_sizes)
        if not all(is_int(n) and n >= 0 for n in sizes) or sum(sizes) != trainable:
            raise ConfigError("tensor_sizes", f"{len(sizes)} sizes summing to {sum(sizes) if all(map(is_int, sizes)) else '?'}",
                              f"element counts (integers >= 0) of the trainable tensors, summing to {trainable:g}")
    half = WEIGHT_BYTES[precision] == 2
    master = half if master_weights is None else master_weights
    weight_bytes = WEIGHT_BYTES[precision]
    updated_bytes = 4 if (master or not half) else weight_bytes  # dtype of the weights the optimizer updates
    if optimizer == "adamw":
        state = 2 * updated_bytes * trainable
    elif optimizer == "sgd":
        state = updated_bytes * trainable if momentum else 0
    elif sizes is not None:
        state = _eight_bit_state_bytes(sizes, min_8bit_size)
    else:
        state = (2 * trainable + 2 * 4 * math.ceil(trainable / BNB_BLOCK_SIZE) + BNB_QMAP_BYTES) if trainable else 0
    out = {"weights": weight_bytes * num_params, "gradients": weight_bytes * trainable,
           "optimizer_state": state, "master_weights": 4 * trainable if master else 0}
    out = {k: int(round(v)) for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def model_training_memory(model: nn.Module, precision: str = "fp32", optimizer: str = "adamw",
                          master_weights: bool | None = None, device: torch.device | str = "cpu",
                          min_8bit_size: int = MIN_8BIT_SIZE, momentum: bool = True) -> dict:
    """`training_memory` for a real model, exact to the byte: what labkit's memory breakdown should measure.

    Uses the model's trainable tensor sizes (exact 8-bit accounting), adds its buffers (BatchNorm running
    statistics) to ``weights`` as labkit's ``parameters`` category does, and torch AdamW's 4-byte step
    counter per tensor when training on the CPU (on a GPU they stay on the CPU and are not GPU memory).

    Example:
        >>> model_training_memory(model, optimizer="adamw8bit")["optimizer_state"]
    """
    trainable = [p.numel() for p in model.parameters() if p.requires_grad]
    num_params = sum(p.numel() for p in model.parameters())
    out = training_memory(num_params, precision, optimizer, master_weights, trainable_params=sum(trainable),
                          tensor_sizes=trainable, min_8bit_size=min_8bit_size, momentum=momentum)
    out["weights"] += sum(b.numel() * b.element_size() for b in model.buffers())
    if optimizer == "adamw" and torch.device(device).type == "cpu":
        out["optimizer_state"] += 4 * len(trainable)
    out["total"] = sum(out[k] for k in COMPONENTS)
    return out


def calculator_check(cfg: RunConfig):
    """The calculator against one measured training step of ``cfg``: parameters, gradients, optimizer state.

    Measures with `labkit.techniques.batching.step_memory` (the tracker `labkit.fit` uses) and computes
    with `model_training_memory` on the same model. Columns: ``component``, ``calculated_bytes``,
    ``measured_bytes``, ``difference_bytes``. An autocast run (``precision`` fp16/bf16) keeps fp32 weights,
    so it is computed as fp32.

    Example:
        >>> calculator_check(cfg.replace(optimizer="adamw8bit"))
    """
    import pandas as pd

    from .. import train
    from .batching import step_memory

    measured = step_memory(cfg, cfg.batch_size).breakdown.peak_by_category
    trainer = train.Trainer(cfg.replace(evaluate=False, pretrained=False))
    calculated = model_training_memory(trainer.model, "fp32", cfg.optimizer, device=trainer.device,
                                       momentum=cfg.momentum > 0 if cfg.optimizer == "sgd" else True)
    rows = []
    for component, category in (("weights", "parameters"), ("gradients", "gradients"),
                                ("optimizer_state", "optimizer_state")):
        rows.append({"component": component, "calculated_bytes": calculated[component],
                     "measured_bytes": measured.get(category, 0),
                     "difference_bytes": measured.get(category, 0) - calculated[component]})
    return pd.DataFrame(rows)


GB, TB, GIB, TIB = 1e9, 1e12, 2**30, 2**40


def scale_table(num_params: dict | None = None, setups: dict | None = None):
    """`training_memory` for large models: bytes, GB and bytes per parameter by component.

    Args:
        num_params: label -> parameter count (default 7B and 175B).
        setups: label -> `training_memory` keyword arguments (default: fp32 + AdamW, mixed precision with
            master weights + AdamW (ZeRO's 16 bytes), the same with 8-bit AdamW, and pure bf16 + 8-bit AdamW).

    Example:
        >>> scale_table()[["model", "setup", "bytes_per_param", "total_gb"]]
    """
    import pandas as pd

    num_params = num_params or {"7B": 7e9, "175B": 175e9}
    setups = setups or {
        "fp32 + AdamW": {"precision": "fp32", "optimizer": "adamw"},
        "mixed (fp16 + master) + AdamW": {"precision": "fp16", "optimizer": "adamw"},
        "mixed (fp16 + master) + 8-bit AdamW": {"precision": "fp16", "optimizer": "adamw8bit"},
        "pure bf16 + 8-bit AdamW": {"precision": "bf16", "optimizer": "adamw8bit", "master_weights": False},
    }
    rows = []
    for label, count in num_params.items():
        for setup, kwargs in setups.items():
            memory = training_memory(count, **kwargs)
            row = {"model": label, "num_params": count, "setup": setup}
            row.update({f"{k}_bytes": v for k, v in memory.items()})
            row.update(bytes_per_param=memory["total"] / count, total_gb=memory["total"] / GB,
                       total_gib=memory["total"] / GIB, optimizer_state_gb=memory["optimizer_state"] / GB)
            rows.append(row)
    return pd.DataFrame(rows)


def optimizer_claim(num_params: float = 175e9, claimed_tb: tuple[float, float] = (1.2, 0.3)) -> str:
    """Check a claim "optimizer memory goes from A TB to B TB with 8-bit Adam" for ``num_params`` parameters.

    Computes AdamW's fp32 moments (8 bytes per parameter) and 8-bit AdamW's (2 bytes plus the block
    scales), in TB (10^12 bytes) and TiB (2^40), and with the fp32 master weights that ZeRO counts as
    optimizer state, and says which reading, if any, gives the claimed numbers.

    Example:
        >>> print(optimizer_claim(175e9, (1.2, 0.3)))
    """
    if not is_number(num_params) or num_params <= 0:
        raise ConfigError("num_params", num_params, "a number of parameters > 0 (e.g. 175e9)")
    if (not isinstance(claimed_tb, tuple) or len(claimed_tb) != 2
            or not all(is_number(v) and v > 0 for v in claimed_tb)):
        raise ConfigError("claimed_tb", claimed_tb, "a pair of positive numbers (before, after), in TB")
    fp32 = training_memory(num_params, optimizer="adamw")["optimizer_state"]
    eight = training_memory(num_params, optimizer="adamw8bit")["optimizer_state"]
    master = 4 * num_params
    before, after = claimed_tb
    readings = {
        "TB": (fp32 / TB, eight / TB),
        "TiB": (fp32 / TIB, eight / TIB),
        "TB with master weights": ((fp32 + master) / TB, (eight + master) / TB),
    }

    def close(value, claimed):  # the claim's precision: its numbers are given to one decimal
        return abs(value - claimed) <= 0.05 + 1e-9 or math.floor(value * 10) / 10 == claimed

    matches = [name for name, (a, b) in readings.items() if close(a, before) and close(b, after)]
    count = f"{num_params / 1e9:g}B"
    text = (f"For {count} parameters, AdamW's two fp32 moments take {num_params:g} x 8 B = {fp32 / TB:.3g} TB "
            f"({fp32 / TIB:.3g} TiB); 8-bit AdamW's take 2 B per parameter plus one fp32 scale per 256 values "
            f"for each moment, {eight / num_params:.3f} B: {eight / TB:.3g} TB ({eight / TIB:.3g} TiB), "
            f"{fp32 / eight:.2f}x less. ")
    if matches == ["TiB"]:
        text += (f"The claim's {before:g} TB -> {after:g} TB match the TiB figures, rounded down and labelled TB: "
                 f"in TB it is {fp32 / TB:.3g} TB -> {eight / TB:.3g} TB. The 4x ratio is right.")
    elif matches:
        text += f"The claim {before:g} TB -> {after:g} TB matches when read as {' or '.join(matches)}."
    else:
        text += (f"The claim {before:g} TB -> {after:g} TB matches none of these readings; the ratio, "
                 f"{before / after:.2g}x claimed, is {fp32 / eight:.2f}x.")
    text += (f" With the fp32 master weights (4 B per parameter, which ZeRO counts as optimizer state) it is "
             f"{(fp32 + master) / TB:.3g} TB -> {(eight + master) / TB:.3g} TB, only "
             f"{(fp32 + master) / (eight + master):.2f}x less.")
    return text


# ---------------------------------------------------------------------------------------------
# The staged view


@dataclass
class StagedRuns:
    """The staged view's runs: label -> `RunResult`, and one row per stage with a ``stage`` column.

    Example:
        >>> staged = staged_runs(cfg)
        >>> labkit.plots.memory_breakdown(staged.frame, label="stage")
        >>> labkit.plots.bar(staged.frame, x="stage", y="step_time_s")
    """

    results: dict = field(default_factory=dict)
    frame: object = None

    def finding(self) -> str:
        """The memory each stage saved against the baseline, and its step time, as one sentence each."""
        frame = self.frame
        base = frame[frame["stage"] == "baseline"].iloc[0]
        lines = []
        for _, row in frame.iterrows():
            if isinstance(row.get("error"), str):
                lines.append(f"{row['stage']}: failed ({row['error']}).")
                continue
            if row["stage"] == "baseline":
                lines.append(f"baseline: peak {_mib(row['peak_memory_bytes'])}, step {row['step_time_s'] * 1e3:.3g} ms.")
                continue
            if isinstance(base.get("error"), str):
                lines.append(f"{row['stage']}: peak {_mib(row['peak_memory_bytes'])} (no baseline to compare with).")
                continue
            lines.append(f"{row['stage']}: peak {_mib(row['peak_memory_bytes'])} "
                         f"({_saved(_ratio(row['peak_memory_bytes'], base['peak_memory_bytes']))}), step "
                         f"{_ratio(row['step_time_s'], base['step_time_s']):.2f}x the baseline's time.")
        singles = frame[frame["stage"].isin(STAGES[1:-1]) & frame["error"].isna()] if "error" in frame else \
            frame[frame["stage"].isin(STAGES[1:-1])]
        if len(singles) and not isinstance(base.get("error"), str):
            order = singles.sort_values("peak_memory_bytes")
            ranking = ", ".join(f"{row.stage} ({_saved(_ratio(row.peak_memory_bytes, base['peak_memory_bytes']))})"
                                for row in order.itertuples())
            lines.append(f"Single savers by peak saved, here: {ranking}.")
        return "\n".join(lines)


STAGES = ("baseline", "+AMP", "+checkpointing", "+8-bit optimizer", "all together")


def staged_runs(cfg: RunConfig, precision: str | None = None, checkpointing: bool | int = True,
                optimizer: str = "adamw8bit", refresh: bool = False, progress: bool = True) -> StagedRuns:
    """Baseline, +AMP, +checkpointing, +8-bit optimizer and all three together, each trained and measured.

    The baseline is ``cfg`` in fp32 with AdamW and no checkpointing; each middle stage adds one saver to it,
    the last adds all three. Runs are cached (`labkit.results.run_configs`); a failed stage is a row with
    its ``error``. The frame has `labkit.sweep`'s columns with ``stage`` first, and ``state_bytes`` (the
    parameters + gradients + optimizer state the run measured).

    Args:
        cfg: the run to start from (its precision, optimizer and checkpointing are replaced).
        precision: the AMP stage's precision (default: `labkit.techniques.precision.low_precision_for`
            this machine: bf16 where native, fp16 on other tensor-core GPUs, bf16 on a CPU).
        checkpointing: the checkpointing stage's setting (True: every block its own segment).
        optimizer: the 8-bit stage's optimizer (``adamw8bit``; ``paged_adamw8bit`` on a CUDA GPU).

    Example:
        >>> staged = staged_runs(labkit.config.baseline())
        >>> labkit.plots.memory_breakdown(staged.frame, label="stage"); print(staged.finding())
    """
    from .. import results
    from ..env import env_report
    from .precision import low_precision_for

    if checkpointing is False:
        raise ConfigError("checkpointing", checkpointing, "True or a number of segments (the stage turns it on)")
    if optimizer not in EIGHT_BIT_OPTIMIZERS:
        raise ConfigError("optimizer", optimizer, f"one of {list(EIGHT_BIT_OPTIMIZERS)} (the 8-bit stage's optimizer)")
    precision = low_precision_for(env_report(cfg.device)) if precision is None else precision
    if precision not in ("fp16", "bf16"):
        raise ConfigError("precision", precision, "'fp16' or 'bf16' (the AMP stage's precision) or None (chosen "
                                                  "for this machine)")
    base = cfg.replace(precision="fp32", optimizer="adamw", momentum=0.9, checkpointing=False)
    configs = {
        "baseline": base,
        "+AMP": base.replace(precision=precision),
        "+checkpointing": base.replace(checkpointing=checkpointing),
        "+8-bit optimizer": base.replace(optimizer=optimizer),
        "all together": base.replace(precision=precision, checkpointing=checkpointing, optimizer=optimizer),
    }
    runs = results.run_configs(list(configs.values()), refresh=refresh, progress=progress)
    labelled = dict(zip(configs, runs, strict=True))
    frame = results.to_frame(runs)
    frame.insert(0, "stage", list(configs))
    frame["state_bytes"] = [sum(r.memory.get(k, 0) or 0 for k in ("parameters", "gradients", "optimizer_state"))
                            if r.memory else None for r in runs]
    return StagedRuns(results=labelled, frame=frame)

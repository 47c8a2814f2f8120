"""Notebook 03 (memory savers): its experiments and the findings worded from their live numbers.

- `checkpoint_tradeoff`, `tradeoff_finding`: gradient checkpointing over the number of segments, memory
  against time, beside the cost model of Chen et al. 2016 (the sqrt(n) rule).
- `optimizer_state_table`, `eight_bit_savings`: bitsandbytes' 8-bit AdamW tensor by tensor, and why
  tensors below ``min_8bit_size`` keep 32-bit state.
- `calculator_check`, `scale_table`, `optimizer_claim`: the bytes-per-parameter calculator
  (`labkit.capacity.training_memory`) checked against a measured step and applied to 7B and 175B models.
- `staged_runs`: baseline, +AMP, +checkpointing, +8-bit optimizer and all together, for one stacked
  memory chart (``labkit.plots.memory_breakdown(staged.frame, label="stage")``) with step time beside it.

The mechanisms are in `labkit.techniques.checkpointing` and `labkit.techniques.optimizers`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from ... import data, measure, models, results, train
from ...capacity import model_training_memory, step_memory, training_memory
from ...config import RunConfig
from ...env import env_report
from ...errors import ConfigError
from ...messages import worded
from ...techniques.checkpointing import Segment, checkpoint_blocks, checkpoint_segments
from ...techniques.optimizers import EIGHT_BIT_OPTIMIZERS, MIN_8BIT_SIZE
from ...techniques.precision import autocast, low_precision_for
from ...units import GB, GIB, TB, TIB, change, mib, ratio
from ...validate import is_int, is_number


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
            h = Segment([name], [stages[name]], model).run(h)
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
            images, trainer.train_split, trainer.device, cfg.channels_last, cfg.image_size))
    predicted_base = _predicted_activations(block_profile, names, [])
    rule = round(math.sqrt(len(names)))
    rows = []
    for count, result in zip(counts, runs, strict=False):
        groups = checkpoint_segments(cfg.model, int(count) if count else False)
        row = results.to_row(result)
        predicted = _predicted_activations(block_profile, names, groups)
        row.update(segments=int(count), segment_blocks=_segments_label(groups),
                   activation_ratio=ratio(result.memory.get("activations"), base.memory.get("activations")),
                   peak_ratio=ratio(result.peak_memory_bytes, base.peak_memory_bytes),
                   time_ratio=ratio(result.step_time_s, base.step_time_s),
                   flops_ratio=ratio(result.flops_per_step, base.flops_per_step),
                   predicted_activation_bytes=predicted, predicted_activation_ratio=predicted / predicted_base,
                   sqrt_rule_segments=rule, sqrt_rule=count == rule)
        rows.append(row)
    first = ["segments", "segment_blocks", "peak_memory_bytes", "mem_activations_bytes", "step_time_s",
             "peak_ratio", "activation_ratio", "time_ratio", "flops_ratio", "predicted_activation_ratio"]
    frame = pd.DataFrame(rows)
    return frame[first + [c for c in frame.columns if c not in first]]


@worded
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
        f"lowest peak{also}: {mib(best['peak_memory_bytes'], '.3g')} instead of "
        f"{mib(base['peak_memory_bytes'], '.3g')} ({change(best['peak_ratio'])}); activations alone went from "
        f"{mib(base['mem_activations_bytes'], '.3g')} to {mib(best['mem_activations_bytes'], '.3g')} "
        f"({change(best['activation_ratio'])}). It cost time: a step took "
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
                 f"({mib(rule_row.iloc[0]['mem_activations_bytes'], '.3g')}): these blocks differ in how much "
                 "they store, and each stores several tensors.")
    else:
        text += ("; here it is not the best: these blocks differ in how much they store, and each stores "
                 "several tensors.")
    return text


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


def calculator_check(cfg: RunConfig):
    """The calculator against one measured training step of ``cfg``: parameters, gradients, optimizer state.

    Measures with `labkit.capacity.step_memory` (the tracker `labkit.fit` uses) and computes
    with `model_training_memory` on the same model. Columns: ``component``, ``calculated_bytes``,
    ``measured_bytes``, ``difference_bytes`` and ``rounding_bytes``: how much more the measurement may
    hold because the CUDA caching allocator rounds every tensor up to a multiple of 512 bytes (511 bytes
    per tensor at most; 0 on the CPU). An autocast run (``precision`` fp16/bf16) keeps fp32 weights, so it
    is computed as fp32.

    Example:
        >>> calculator_check(cfg.replace(optimizer="adamw8bit"))
    """
    measured = step_memory(cfg, cfg.batch_size).breakdown.peak_by_category
    trainer = train.Trainer(cfg.replace(evaluate=False, pretrained=False))
    calculated = model_training_memory(trainer.model, "fp32", cfg.optimizer, device=trainer.device,
                                       momentum=cfg.momentum > 0 if cfg.optimizer == "sgd" else True)
    allowance = rounding_allowance(trainer.model, cfg.optimizer, cfg.momentum > 0, trainer.device)
    rows = []
    for component, category in (("weights", "parameters"), ("gradients", "gradients"),
                                ("optimizer_state", "optimizer_state")):
        rows.append({"component": component, "calculated_bytes": calculated[component],
                     "measured_bytes": measured.get(category, 0),
                     "difference_bytes": measured.get(category, 0) - calculated[component],
                     "rounding_bytes": allowance[component]})
    return pd.DataFrame(rows)


def rounding_allowance(model, optimizer: str, momentum: bool, device) -> dict:
    """The most bytes the CUDA allocator's rounding can add to each component of ``model``'s training state:
    511 bytes per tensor (`CUDA_ROUNDING_BYTES` - 1); 0 on a CPU, which allocates exactly.

    Tensors per trainable parameter in the optimizer: AdamW two moments; 8-bit AdamW two 8-bit states and
    their two block scales (an upper bound: tensors under ``min_8bit_size`` keep two fp32 moments); SGD one
    momentum buffer, or none.

    Example:
        >>> rounding_allowance(model, "adamw", True, "cuda")["optimizer_state"]   # 2 x 511 x tensors
    """
    if torch.device(device).type != "cuda":
        return {"weights": 0, "gradients": 0, "optimizer_state": 0}
    trainable = sum(p.requires_grad for p in model.parameters())
    per_param = {"adamw": 2, "adamw8bit": 4, "paged_adamw8bit": 4, "sgd": 1 if momentum else 0}[optimizer]
    per_tensor = CUDA_ROUNDING_BYTES - 1
    return {"weights": per_tensor * (len(list(model.parameters())) + len(list(model.buffers()))),
            "gradients": per_tensor * trainable, "optimizer_state": per_tensor * per_param * trainable}


def scale_table(num_params: dict | None = None, setups: dict | None = None):
    """`training_memory` for large models: bytes, GB and bytes per parameter by component.

    Args:
        num_params: label -> parameter count (default 7B and 175B).
        setups: label -> `training_memory` keyword arguments (default: fp32 + AdamW, mixed precision with
            master weights + AdamW (ZeRO's 16 bytes), the same with 8-bit AdamW, and pure bf16 + 8-bit AdamW).

    Example:
        >>> scale_table()[["model", "setup", "bytes_per_param", "total_gb"]]
    """
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


@worded
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

    @worded
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
                lines.append(f"baseline: peak {mib(row['peak_memory_bytes'], '.3g')}, "
                             f"step {row['step_time_s'] * 1e3:.3g} ms.")
                continue
            if isinstance(base.get("error"), str):
                lines.append(f"{row['stage']}: peak {mib(row['peak_memory_bytes'], '.3g')} "
                             "(no baseline to compare with).")
                continue
            lines.append(f"{row['stage']}: peak {mib(row['peak_memory_bytes'], '.3g')} "
                         f"({change(ratio(row['peak_memory_bytes'], base['peak_memory_bytes']))}), step "
                         f"{ratio(row['step_time_s'], base['step_time_s']):.2f}x the baseline's time.")
        singles = frame[frame["stage"].isin(STAGES[1:-1]) & frame["error"].isna()] if "error" in frame else \
            frame[frame["stage"].isin(STAGES[1:-1])]
        if len(singles) and not isinstance(base.get("error"), str):
            order = singles.sort_values("peak_memory_bytes")
            ranking = ", ".join(f"{row.stage} ({change(ratio(row.peak_memory_bytes, base['peak_memory_bytes']))})"
                                for row in order.itertuples())
            lines.append(f"Single savers by peak saved, here: {ranking}.")
        return "\n".join(lines)


# The CUDA caching allocator hands out memory in multiples of this many bytes, so a tensor occupies up to
# 511 bytes more than its elements; labkit's tracker counts what was allocated.
CUDA_ROUNDING_BYTES = 512
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


# --- Selective checkpointing, measured on a stack of MLP blocks ---------------------------------------------


def mlp_blocks(seed: int = 0, width: int = 256, depth: int = 4) -> nn.Sequential:
    """``depth`` MLP blocks (Linear, GELU, Linear: a transformer's feed-forward part) as an nn.Sequential."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                           for _ in range(depth)])


def activation_peak(blocks: nn.Module, forward, x: torch.Tensor) -> tuple[int, list[torch.Tensor], torch.Tensor]:
    """Peak activation bytes of ``forward(blocks, x)`` and its backward (MemTracker), the gradients and the output."""
    blocks.zero_grad(set_to_none=True)
    holder = {}

    def step():
        out = forward(blocks, x)
        holder["out"] = out.detach()
        out.square().mean().backward()

    optimizer = torch.optim.SGD(blocks.parameters(), lr=0.0)  # the tracker files state by optimizer
    breakdown = measure.track_step_memory(step, blocks, optimizer, x.device)
    grads = [None if p.grad is None else p.grad.clone() for p in blocks.parameters()]
    blocks.zero_grad(set_to_none=True)
    return breakdown.peak_by_category.get("activations", 0), grads, holder["out"]


def checkpoint_variants(variants: dict, width: int = 256, depth: int = 4, batch_size: int = 512,
                        repeats: int = 5) -> pd.DataFrame:
    """Each way of running a block, measured on `mlp_blocks`: activations, FLOPs, time, and whether the
    gradients equal the plain forward's.

    Args:
        variants: name -> ``run(block, x)``, e.g. ``{"plain": lambda b, x: b(x), "full": lambda b, x:
            checkpoint(b, x, use_reentrant=False)}``; the first is the baseline the ratios compare with.
        width, depth: the blocks' size. batch_size: rows of the input. repeats: timed forward + backward passes.

    Returns:
        A frame: ``variant``, ``activation_bytes``, ``flops``, ``step_time_s``, ``activation_ratio``,
        ``flops_ratio``, ``time_ratio``, ``max_grad_diff``.

    Example:
        >>> checkpoint_variants({"plain": lambda b, x: b(x), "selective": my_selective})
    """
    if not variants or not all(callable(v) for v in variants.values()):
        raise ConfigError("variants", variants, "a dict of name -> run(block, x) functions")
    blocks = mlp_blocks(width=width, depth=depth)
    x = torch.randn(batch_size, width, generator=torch.Generator().manual_seed(1))
    rows, base_grads = [], None
    for name, run in variants.items():
        def forward(stack, t, run=run):
            for block in stack:
                t = run(block, t)
            return t

        act, grads, _ = activation_peak(blocks, forward, x)
        flops = measure.count_flops(lambda: forward(blocks, x).square().mean().backward())
        blocks.zero_grad(set_to_none=True)
        timer = measure.StepTimer(x.device)
        for index in range(repeats + 1):
            if index:
                timer.start()
            forward(blocks, x).square().mean().backward()
            if index:
                timer.stop()
            blocks.zero_grad(set_to_none=True)
        base_grads = base_grads or grads
        diff = max(float((a - b).abs().max()) for a, b in zip(grads, base_grads, strict=True))
        rows.append({"variant": name, "activation_bytes": act, "flops": flops,
                     "step_time_s": measure.spread(timer.times_s())[0], "max_grad_diff": diff})
    frame = pd.DataFrame(rows)
    base = frame.iloc[0]
    for column, key in (("activation_ratio", "activation_bytes"), ("flops_ratio", "flops"), ("time_ratio", "step_time_s")):
        frame[column] = frame[key] / base[key]
    return frame


@worded
def variants_finding(frame: pd.DataFrame) -> str:
    """What each checkpointing variant saved and cost, against the first (plain) one."""
    base = frame.iloc[0]
    parts = [f"{row.variant}: activations {row.activation_ratio:.2f}x, FLOPs {row.flops_ratio:.2f}x, time "
             f"{row.time_ratio:.2f}x" for row in frame.iloc[1:].itertuples()]
    return (f"Against {base.variant} ({mib(base.activation_bytes, '.1f')} of activations): " + "; ".join(parts)
            + ". FLOPs count the recomputed forward exactly; times are this machine's, noisy at this size.")


# --- 8-bit state from the tensor sizes ------------------------------------------------------------------------

BNB_BLOCK = 256  # bitsandbytes' block size for 8-bit optimizer state: one fp32 scale per 256 values


def eight_bit_numbers(state: pd.DataFrame, min_8bit_size: int = MIN_8BIT_SIZE) -> dict:
    """Your own numbers for exercise ``03.own_8bit``, from `optimizer_state_table` of an 8-bit optimizer."""
    tensors = state[state["numel"] > 0]
    small = tensors["numel"] < min_8bit_size
    return {"numel_large": int(tensors.loc[~small, "numel"].sum()), "numel_small": int(tensors.loc[small, "numel"].sum()),
            "min_8bit_size": min_8bit_size, "block": BNB_BLOCK}


@worded
def eight_bit_finding(numbers: dict, state: pd.DataFrame) -> str:
    """The state the exercise's arithmetic gives beside what the optimizer really holds."""
    computed = numbers["numel_large"] * 2 * (1 + 4 / numbers["block"]) + numbers["numel_small"] * 8
    measured = int(state["state_bytes"].sum())
    shared = int(state.loc[state["numel"] == 0, "state_bytes"].sum())
    rest = measured - shared - round(computed)
    tail = ("the per-tensor state matches the arithmetic exactly" if rest == 0 else
            f"the remaining {rest:+,} bytes are each tensor's block count rounded up to whole blocks")
    return (f"The arithmetic gives {computed:,.0f} bytes; the optimizer holds {measured:,} bytes "
            f"({measured / computed - 1:+.1%}): {shared:,} of them are the quantisation maps shared by all tensors "
            f"(two tables of 256 float32 values), and {tail}.")

"""Section 2 of notebook 03: gradient checkpointing over the number of segments, memory against time, beside
the cost model of Chen et al. 2016 (stored segment inputs plus the largest recomputed segment; for ``n`` equal
one-tensor blocks in ``k`` segments ``k + n/k`` tensors, smallest at ``k = sqrt(n)``).

`checkpoint_tradeoff`'s rows have `labkit.sweep`'s columns plus ``segments`` (0: off) and ``segment_blocks``;
``activation_ratio``, ``peak_ratio``, ``time_ratio``, ``flops_ratio`` (against the run without checkpointing);
``predicted_activation_bytes`` and ``predicted_activation_ratio`` (the cost model, from the bytes each block
saves in one forward); ``sqrt_rule_segments`` (round(sqrt(n))) and ``sqrt_rule`` (True on that row).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch
from torch import nn

from ... import data, models, results, train
from ...config import RunConfig
from ...display import number
from ...errors import ConfigError
from ...messages import worded
from ...techniques.checkpointing import Segment, checkpoint_blocks, checkpoint_segments
from ...techniques.precision import autocast
from ...units import change, mib, ratio
from ...validate import is_int
from ._shared import timing_noise


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
    """Train ``cfg`` once per number of checkpointed segments and measure memory against time (columns: above).

    Runs are cached (`labkit.results.run_configs`); a failed run is a row with its ``error``. Every block in its
    own segment runs as ``checkpointing=True``, the config the staged view and the panel use.

    Args:
        cfg: the run (its ``checkpointing`` is replaced).
        segments: segment counts to run (default ``0, 1, ..., n``).
        refresh: rerun even when cached results exist; progress: show progress bars.

    Example:
        >>> checkpoint_tradeoff(cfg)[["segments", "peak_ratio", "activation_ratio", "time_ratio"]]
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
        setting = True if count == len(names) else (int(count) if count else False)
        configs.append(cfg.replace(checkpointing=setting))
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
    """The segment count with the lowest peak, what it saved and what it cost, from `checkpoint_tradeoff`'s frame.

    Args:
        frame: a `checkpoint_tradeoff` frame with the run without checkpointing (segments=0) and one with it.
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
    rule = int(best["sqrt_rule_segments"])
    rule_row = on[on["segments"] == rule]
    if int(best["segments"]) == rule:
        sqrt_rule = "the same choice"
    elif len(rule_row):
        rule_peak = rule_row.iloc[0]["peak_memory_bytes"]
        sqrt_rule = "the same peak" if rule_peak == best["peak_memory_bytes"] else f"a peak of {mib(rule_peak, '.3g')}"
    else:
        sqrt_rule = "not run"
    return (f"Lowest peak with {int(best['segments'])} segment(s) ({best['segment_blocks']}): "
            f"{mib(base['peak_memory_bytes'], '.3g')} -> {mib(best['peak_memory_bytes'], '.3g')} "
            f"({change(best['peak_ratio'])}); activations {change(best['activation_ratio'])}; a step "
            f"{number(best['time_ratio'])}x as long ({timing_noise(best, base)}), {number(best['flops_ratio'])}x the "
            f"FLOPs; the sqrt(n) rule's {rule} segment(s): {sqrt_rule}.")

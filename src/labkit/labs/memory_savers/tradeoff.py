"""Section 2 of notebook 03: gradient checkpointing over the number of segments, beside Chen et al.'s cost model."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch
from torch import nn

from ... import models, results
from ...config import RunConfig
from ...display import number
from ...errors import ConfigError
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...runsetup import set_up
from ...techniques.checkpointing import Segment, checkpoint_blocks, checkpoint_segments
from ...techniques.precision import autocast, resolve_precision
from ...units import change, mib, ratio
from ...validate import is_int


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
    """Chen et al.'s cost model: the forward keeps each segment's input (and the head's tensors); the backward
    recomputes one segment at a time while the inputs before it are still stored (no segments: everything)."""
    saved, outputs = profile["saved"], profile["outputs"]
    if not groups:
        return sum(saved.values())
    previous = {name: prev for prev, name in zip(["input", *names], names, strict=False)}
    inputs = [outputs[previous[g[0]]] for g in groups]
    end_of_forward = sum(inputs) + saved.get("head", 0)
    backward = max(sum(inputs[:j + 1]) + max(0, sum(saved.get(b, 0) for b in g) - inputs[j])
                   for j, g in enumerate(groups))
    return int(max(end_of_forward, backward))


class Tradeoff(LabResult):
    shown = ("segments", "segment_blocks", "peak_memory_bytes", "mem_activations_bytes", "predicted_activation_bytes",
             "step_time_s", "flops_ratio")

    @worded
    def finding(self) -> str:
        ok = self.frame[self.frame["error"].isna()] if "error" in self.frame else self.frame
        base, on = ok[ok["segments"] == 0], ok[ok["segments"] > 0]
        if base.empty or on.empty:
            return "Nothing to compare: no successful run without checkpointing and one with it."
        base = base.iloc[0]
        # The lowest peak; among equal peaks, the fewest activations.
        best = on.sort_values(["peak_memory_bytes", "mem_activations_bytes"], kind="stable").iloc[0]
        rule = int(best["sqrt_rule_segments"])
        rule_peak = on.loc[on["segments"] == rule, "peak_memory_bytes"]
        sqrt_rule = ("the same choice" if int(best["segments"]) == rule else "not run" if rule_peak.empty else
                     "the same peak" if rule_peak.iloc[0] == best["peak_memory_bytes"] else
                     f"a peak of {mib(rule_peak.iloc[0], '.3g')}")
        step = compare(Measured.row(best, "step_time_s"), Measured.row(base, "step_time_s"), ("faster", "slower"))
        return (f"Lowest peak with {int(best['segments'])} segment(s) ({best['segment_blocks']}): "
                f"{mib(base['peak_memory_bytes'], '.3g')} -> {mib(best['peak_memory_bytes'], '.3g')} "
                f"({change(best['peak_ratio'])}); activations {change(best['activation_ratio'])}; a step {step}, "
                f"{number(best['flops_ratio'])}x the FLOPs; the sqrt(n) rule's {rule} segment(s): {sqrt_rule}.")


def checkpoint_tradeoff(cfg: RunConfig, segments: Iterable[int] | None = None, refresh: bool = False,
                        progress: bool = True) -> Tradeoff:
    """One cached run of ``cfg`` per number of ``segments`` (default 0 = off to n), against the run without."""
    names = checkpoint_blocks(cfg.model)
    counts = list(range(len(names) + 1) if segments is None else segments)
    if not counts:
        raise ConfigError("segments", counts, f"a non-empty list of segment counts from 0 (off) to {len(names)}")
    configs = []
    for count in counts:  # every count is validated before anything runs
        if not is_int(count) or not 0 <= count <= len(names):
            raise ConfigError("segments", count, f"segment counts from 0 (checkpointing off) to {len(names)} "
                                                 f"({cfg.model} has {len(names)} blocks: {', '.join(names)})")
        configs.append(cfg.replace(checkpointing=True if count == len(names) else (int(count) if count else False)))
    if 0 not in counts:
        configs.append(cfg.replace(checkpointing=False))  # the reference every ratio is relative to
    runs = results.run_configs(configs, refresh=refresh, progress=progress)
    base = runs[counts.index(0)] if 0 in counts else runs[-1]
    s = set_up(cfg.replace(checkpointing=False, evaluate=False, pretrained=False), techniques=True)
    with autocast(resolve_precision(cfg.precision, s.device), s.device):
        block_profile = _profile_blocks(s.model, s.batch().images)
    predicted_base = _predicted_activations(block_profile, names, [])
    rule = round(math.sqrt(len(names)))
    rows = []
    for count, result in zip(counts, runs, strict=False):
        groups = checkpoint_segments(cfg.model, int(count) if count else False)
        predicted, label = _predicted_activations(block_profile, names, groups), " | ".join("+".join(g) for g in groups)
        rows.append({**results.to_row(result), "segments": int(count), "segment_blocks": label or "off",
                     "activation_ratio": ratio(result.memory.get("activations"), base.memory.get("activations")),
                     "peak_ratio": ratio(result.peak_memory_bytes, base.peak_memory_bytes),
                     "time_ratio": ratio(result.step_time_s, base.step_time_s),
                     "flops_ratio": ratio(result.flops_per_step, base.flops_per_step),
                     "predicted_activation_bytes": predicted, "predicted_activation_ratio": predicted / predicted_base,
                     "sqrt_rule_segments": rule, "sqrt_rule": count == rule})
    first = ["segments", "segment_blocks", "peak_memory_bytes", "mem_activations_bytes", "step_time_s",
             "peak_ratio", "activation_ratio", "time_ratio", "flops_ratio", "predicted_activation_ratio"]
    frame = pd.DataFrame(rows)
    return Tradeoff(frame[first + [c for c in frame.columns if c not in first]])

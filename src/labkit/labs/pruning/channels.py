"""Section 4 of notebook 04: structured pruning, channels removed and the layers rebuilt into a smaller dense model."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from itertools import islice

import pandas as pd
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ... import measure, results, train
from ...config import RunConfig
from ...env import profile
from ...errors import ConfigError
from ...inference import accuracy, example_batch, latencies
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...runsetup import set_up
from ...techniques import pruning
from ...validate import is_int
from .common import fine_tuned, forward_flops, timed


def recover(model: nn.Module, cfg: RunConfig, steps: int, progress: bool = False, on_step=None):
    """Fine-tune ``model`` (a pruned copy) in place for ``steps`` steps of ``cfg``; returns its `RunResult`."""
    if not is_int(steps) or steps < 1:
        raise ConfigError("recovery_steps", steps, "a positive number of fine-tuning steps")
    return train.fit(cfg.replace(max_steps=steps, epochs=1), model=model, progress=progress, on_step=on_step)


def train_batches(cfg: RunConfig, count: int) -> list[torch.Tensor]:
    """The run's first ``count`` training batches (inputs only, on its device), e.g. to re-estimate BatchNorm."""
    s = set_up(cfg, model=False)
    loader = s.kind.loader(s.train, cfg.batch_size, cfg, None, s.device)
    return [s.kind.to_device(s.kind.batch(item), s.train, cfg, s.device).images for item in islice(loader, count)]


@dataclass
class Structured(LabResult):
    """`structured`'s rows: dense, pruned, pruned with BatchNorm re-estimated, pruned and recovered."""

    shown = ("model", "num_params", "flops", "model_size_bytes", "latency_s", "cpu_latency_s", "test_accuracy")
    test_size: int | None = None  # the test split's size (None: the profile's)

    @worded
    def finding(self) -> str:
        by = self.frame.set_index("model")
        dense, pruned, rec = by.loc["dense"], by.loc["pruned"], by.loc["pruned + recovery"]
        latency = compare(Measured.row(pruned, "latency_s"), Measured.row(dense, "latency_s"), ("faster", "slower"))
        acc = compare(Measured.accuracy(rec.test_accuracy, self.test_size or profile().test_size),
                      Measured.accuracy(dense.test_accuracy, self.test_size or profile().test_size))
        return (f"{dense.num_params / pruned.num_params:.1f}x fewer parameters, {dense.flops / pruned.flops:.1f}x "
                f"fewer FLOPs; latency {latency} against the dense model; after {int(rec.recovery_steps)} recovery "
                f"steps test accuracy is {rec.test_accuracy:.1%} against {dense.test_accuracy:.1%} dense "
                f"({acc.difference * 100:+.1f} points, {acc.verdict}).")


def structured(cfg: RunConfig, amount: float = 0.5, recovery_steps: int | None = None) -> Structured:
    """Remove ``amount`` of the channels of every prunable conv of the fine-tuned model and measure before and after
    (default recovery: the fine-tune's steps, more than its untimed ones). Cached: notebook 09 reads it."""
    amount = pruning.check_amount(amount)
    prof = profile()
    steps = max(prof.max_steps, prof.warmup_steps + train.PROFILING_STEPS + 1) if recovery_steps is None else \
        recovery_steps
    frame = results.cached_frame("prune-structured", [cfg], lambda: _measure_structured(cfg, amount, steps),
                                 amount=amount, recovery_steps=steps)
    return Structured(frame, test_size=profile().test_size)


def _measure_model(model: nn.Module, cfg: RunConfig, x: torch.Tensor) -> dict:
    return {"num_params": measure.count_parameters(model)[0], "flops": forward_flops(model, x),
            "model_size_bytes": measure.model_size_bytes(model),
            "inference_peak_bytes": measure.inference_peak_bytes(model, x),
            "val_accuracy": accuracy(model, cfg, "val"), "test_accuracy": accuracy(model, cfg, "test")}


def _measure_structured(cfg: RunConfig, amount: float, steps: int) -> pd.DataFrame:
    model, _ = fine_tuned(cfg)
    x = example_batch(cfg)
    slim = pruning.prune_channels(model, amount, x[:2])
    before = copy.deepcopy(slim)
    recalibrated = pruning.recalibrate_batchnorm(copy.deepcopy(slim), train_batches(cfg, 8))
    rows = [{"model": "dense", **_measure_model(model, cfg, x)}, {"model": "pruned", **_measure_model(slim, cfg, x)},
            {"model": "pruned + BN re-estimated", **_measure_model(recalibrated, cfg, x)}]
    recover(slim, cfg, steps)
    rows.append({"model": "pruned + recovery", **_measure_model(slim, cfg, x)})
    all_four = [model, before, recalibrated, slim]
    frame = pd.DataFrame(rows).assign(**timed(all_four, x))
    frame["cpu_latency_s"] = frame.latency_s if x.device.type == "cpu" else latencies(all_four, x, cpu=True)
    frame.insert(1, "amount", amount)
    frame["recovery_steps"] = [0, 0, 0, steps]
    for column in ("num_params", "flops", "model_size_bytes", "latency_s", "cpu_latency_s", "inference_peak_bytes"):
        frame[f"{column}_ratio"] = frame[column] / frame[column].iloc[0]
    return frame


def layer_flops(model: nn.Module, layer: str, x: torch.Tensor) -> int:
    """FLOPs of conv ``layer`` alone in one forward of ``x`` (torch's FlopCounter, per module)."""
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    counts = counter.get_flop_counts()
    key = next((k for k in counts if k.endswith(layer) or k.endswith(f".{layer}")), None)
    if key is None:
        raise ConfigError("layer", layer, f"a module the FLOP counter saw ({', '.join(list(counts)[:8])}, ...)")
    return int(sum(counts[key].values()))


@dataclass
class OwnFlops(LabResult):
    """One conv's channels before and after structured pruning (exercise 04.own_flops) and its measured FLOPs."""

    numbers: dict = field(default_factory=dict)

    @worded
    def finding(self) -> str:
        n = self.numbers
        return (f"Measured by the FLOP counter: {n['layer']} does {self.frame.flops_ratio.iloc[0]:.3f}x the FLOPs it "
                f"did before ({n['in_after']}/{n['in_before']} input channels x "
                f"{n['out_after']}/{n['out_before']} output channels).")


def own_flops(dense: nn.Module, slim: nn.Module, x: torch.Tensor, layer: str | None = None) -> OwnFlops:
    """The channels of conv ``layer`` (None: the one whose in x out shrank most) before and after structured pruning
    (``slim`` is `prune_channels`' copy of ``dense``), and its FLOPs after over before on ``x``."""
    convs = [name for name, m in dense.named_modules() if isinstance(m, nn.Conv2d) and m.groups == 1]

    def kept(name):
        a, b = dense.get_submodule(name), slim.get_submodule(name)
        return (b.in_channels * b.out_channels) / (a.in_channels * a.out_channels)

    if layer is not None and layer not in convs:
        raise ConfigError("layer", layer, f"a conv of the model ({', '.join(convs)})")
    layer = layer or min(convs, key=kept)
    a, b = dense.get_submodule(layer), slim.get_submodule(layer)
    numbers = {"layer": layer, "in_before": a.in_channels, "out_before": a.out_channels,
               "in_after": b.in_channels, "out_after": b.out_channels}
    ratio = layer_flops(slim, layer, x) / layer_flops(dense, layer, x)
    return OwnFlops(pd.DataFrame([{**numbers, "flops_ratio": ratio}]), numbers=numbers)

"""Section 4 of notebook 04: structured pruning, channels removed and the layers rebuilt into a smaller dense model."""

from __future__ import annotations

import copy

import pandas as pd
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ... import data, measure, results, train
from ...config import RunConfig
from ...env import Profile, profile, resolve_device
from ...errors import ConfigError
from ...messages import worded
from ...techniques import pruning
from ...validate import is_int
from .common import accuracy, example_batch, fine_tuned, forward_flops, latencies, latencies_with_band, points

RECALIBRATION_BATCHES = 8


def _measure_model(model: nn.Module, cfg: RunConfig, x: torch.Tensor) -> dict:
    """Everything but latency (`latencies` times the models together)."""
    return {"num_params": measure.count_parameters(model)[0], "flops": forward_flops(model, x),
            "model_size_bytes": measure.model_size_bytes(model),
            "inference_peak_bytes": measure.inference_peak_bytes(model, x),
            "val_accuracy": accuracy(model, cfg, "val"), "test_accuracy": accuracy(model, cfg, "test")}


def recover(model: nn.Module, cfg: RunConfig, steps: int, progress: bool = False, on_step=None):
    """Fine-tune ``model`` (a pruned copy) in place for ``steps`` optimizer steps of ``cfg``; returns the `RunResult`.

    Args:
        model: the pruned model.
        cfg: the fine-tune's settings.
        steps: optimizer steps.
        progress: show a progress bar.
        on_step: called after each step, as `labkit.fit` calls it.
    """
    if not is_int(steps) or steps < 1:
        raise ConfigError("recovery_steps", steps, "a positive number of fine-tuning steps")
    return train.fit(cfg.replace(max_steps=steps, epochs=1), model=model, progress=progress, on_step=on_step)


def default_recovery_steps(prof: Profile | None = None) -> int:
    """As many steps as the fine-tune itself had (the profile's), and always more than its untimed steps.

    Args:
        prof: the profile (default: the active one).
    """
    prof = prof or profile()
    return max(prof.max_steps, prof.warmup_steps + train.PROFILING_STEPS + 1)


def train_batches(cfg: RunConfig, count: int) -> list[torch.Tensor]:
    """The first ``count`` training batches of ``cfg`` (inputs only, on the run's device), e.g. for BatchNorm.

    Args:
        cfg: the fine-tune (its data, batch size and random seed).
        count: how many batches.
    """
    split = train.run_splits(cfg)["train"]
    device = resolve_device(cfg.device)
    loader = data.make_loader(split, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed, drop_last=True)
    batches = []
    for images, _ in loader:
        batches.append(data.to_model_input(images, split, device, cfg.channels_last, cfg.image_size))
        if len(batches) == count:
            break
    return batches


def structured(cfg: RunConfig, amount: float = 0.5, recovery_steps: int | None = None) -> pd.DataFrame:
    """Remove ``amount`` of the channels of every prunable conv of the fine-tuned model and measure before/after.

    Args:
        cfg: the fine-tune.
        amount: the share of each prunable conv's output channels removed.
        recovery_steps: fine-tuning steps after pruning (default `default_recovery_steps`).

    Returns:
        Rows ``dense``, ``pruned``, ``pruned + BN re-estimated``, ``pruned + recovery``: ``num_params``, ``flops``,
        ``model_size_bytes``, ``inference_peak_bytes``, ``latency_s`` (run's device), ``cpu_latency_s``,
        ``val_accuracy``, ``test_accuracy``, ratios to the dense row (``*_ratio``), and the noise band of a
        latency ratio, ``latency_p10_ratio`` / ``latency_p90_ratio`` (`latencies_with_band`). Cached (read by 09).
    """
    amount = pruning.check_amount(amount)
    steps = default_recovery_steps() if recovery_steps is None else recovery_steps
    return results.cached_frame("prune-structured", [cfg], lambda: _measure_structured(cfg, amount, steps),
                                amount=amount, recovery_steps=steps)


def _measure_structured(cfg: RunConfig, amount: float, steps: int) -> pd.DataFrame:
    model, _ = fine_tuned(cfg)
    prof = profile()
    x = example_batch(cfg)
    slim = pruning.prune_channels(model, amount, x[:2])
    before = copy.deepcopy(slim)
    recalibrated = pruning.recalibrate_batchnorm(copy.deepcopy(slim), train_batches(cfg, RECALIBRATION_BATCHES))
    rows = [{"model": "dense", **_measure_model(model, cfg, x)}, {"model": "pruned", **_measure_model(slim, cfg, x)},
            {"model": "pruned + BN re-estimated", **_measure_model(recalibrated, cfg, x)}]
    recover(slim, cfg, steps)
    rows.append({"model": "pruned + recovery", **_measure_model(slim, cfg, x)})
    frame = pd.DataFrame(rows)
    models_ = [model, before, recalibrated, slim]
    frame["latency_s"], band = latencies_with_band(models_, x, prof)
    frame["cpu_latency_s"] = frame.latency_s if x.device.type == "cpu" else latencies(models_, x, prof, cpu=True)
    frame["latency_p10_ratio"], frame["latency_p90_ratio"] = band
    frame.insert(1, "amount", amount)
    frame["recovery_steps"] = [0, 0, 0, steps]
    dense = frame.iloc[0]
    for column in ("num_params", "flops", "model_size_bytes", "latency_s", "cpu_latency_s", "inference_peak_bytes"):
        frame[f"{column}_ratio"] = frame[column] / dense[column]
    return frame


@worded
def structured_finding(frame: pd.DataFrame) -> str:
    """One line from `structured`'s frame: how much smaller and faster, and whether recovery closed the gap.

    Args:
        frame: `structured`'s rows.
    """
    by = frame.set_index("model")
    dense, pruned, rec = by.loc["dense"], by.loc["pruned"], by.loc["pruned + recovery"]
    band = f"{dense.latency_p10_ratio:.2f}x-{dense.latency_p90_ratio:.2f}x"
    inside = dense.latency_p10_ratio <= pruned.latency_s_ratio <= dense.latency_p90_ratio
    text = (f"{dense.num_params / pruned.num_params:.1f}x fewer parameters, {dense.flops / pruned.flops:.1f}x fewer "
            f"FLOPs; latency {pruned.latency_s_ratio:.2f}x the dense model's, "
            f"{'within' if inside else 'beyond'} its timing noise ({band}); ")
    gap = dense.test_accuracy - rec.test_accuracy
    noise = measure.accuracy_noise(dense.test_accuracy, profile().test_size)
    text += (f"after {int(rec.recovery_steps)} recovery steps test accuracy is {rec.test_accuracy:.1%} "
             f"against {dense.test_accuracy:.1%} dense, ")
    if gap <= noise:
        return text + f"within the test noise ({points(noise)})."
    return text + f"{points(gap)} below, beyond the test noise ({points(noise)})."


def flops_numbers(dense: nn.Module, slim: nn.Module, layer: str | None = None) -> dict:
    """The channel counts of conv ``layer`` before and after structured pruning, for exercise 04.own_flops.

    Args:
        dense, slim: the model before and after `labkit.techniques.pruning.prune_channels`.
        layer: a conv's name; None takes the one whose channels shrank most (in x out).
    """
    convs = [name for name, m in dense.named_modules() if isinstance(m, nn.Conv2d) and m.groups == 1]
    if layer is None:
        def kept(name):
            a, b = dense.get_submodule(name), slim.get_submodule(name)
            return (b.in_channels * b.out_channels) / (a.in_channels * a.out_channels)
        layer = min(convs, key=kept)
    elif layer not in convs:
        raise ConfigError("layer", layer, f"a conv of the model ({', '.join(convs)})")
    a, b = dense.get_submodule(layer), slim.get_submodule(layer)
    return {"layer": layer, "in_before": a.in_channels, "out_before": a.out_channels,
            "in_after": b.in_channels, "out_after": b.out_channels}


def layer_flops(model: nn.Module, layer: str, x: torch.Tensor) -> int:
    """FLOPs of conv ``layer`` alone in one forward of ``x`` (torch's FlopCounter, per module).

    Args:
        model: the model.
        layer: the conv's name.
        x: the batch.
    """
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    counts = counter.get_flop_counts()
    key = next((k for k in counts if k.endswith(layer) or k.endswith(f".{layer}")), None)
    if key is None:
        raise ConfigError("layer", layer, f"a module the FLOP counter saw ({', '.join(list(counts)[:8])}, ...)")
    return int(sum(counts[key].values()))


@worded
def flops_finding(numbers: dict, dense: nn.Module, slim: nn.Module, x: torch.Tensor) -> str:
    """The measured FLOPs ratio of one conv after structured pruning, beside the channel arithmetic.

    Args:
        numbers: `flops_numbers`' channel counts.
        dense: the model before pruning.
        slim: the model after.
        x: the batch the FLOPs are counted on.
    """
    measured = layer_flops(slim, numbers["layer"], x) / layer_flops(dense, numbers["layer"], x)
    return (f"Measured by the FLOP counter: {numbers['layer']} does {measured:.3f}x the FLOPs it did before "
            f"({numbers['in_after']}/{numbers['in_before']} input channels x "
            f"{numbers['out_after']}/{numbers['out_before']} output channels).")

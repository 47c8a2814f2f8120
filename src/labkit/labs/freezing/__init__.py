"""Notebook 05 (layer freezing): its experiments and the findings worded from their live numbers.

- `level_table`: what each level freezes on each model, and the share of the parameters left training.
- `level_sweep`, `levels_finding`, `seed_tradeoff`: one fine-tune per freezing level from the same
  pretrained start and for the same steps: trainable parameters, step time, the backward pass's FLOPs
  (measured, and predicted layer by layer by `backward_profile`), the activations kept for the backward
  pass, peak memory by category, accuracy; and the seed's claim that heavy freezing costs more accuracy
  than it saves time, reproduced or refuted.
- `batchnorm_demo`: the same freezing with BatchNorm kept in eval mode and with ``requires_grad_(False)``
  alone, where the "frozen" layers' running statistics keep moving.
- `feature_caching`: with everything but the head frozen, the body's output computed once and the head
  trained on it, against head-only training through the whole network.
- `schedule_runs`, `schedule_finding`: gradual unfreezing and discriminative (per-stage) learning rates against
  the fixed levels.
- `backward_numbers`, `backward_check`: the learner's own numbers for exercise ``05.own_backward``, and their
  arithmetic beside the measurement.

The mechanism is in `labkit.techniques.freezing`.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, RandomSampler

from ... import data, measure, models, results, train
from ...config import RunConfig
from ...env import env_report, profile, resolve_device
from ...errors import ConfigError
from ...measure import accuracy_noise
from ...messages import worded
from ...result import RunResult
from ...techniques.freezing import (
    LEVELS,
    cache_features,
    discriminative_param_groups,
    freeze,
    frozen_stages,
    gradual_unfreeze,
    is_frozen_batchnorm,
)
from ...techniques.precision import autocast, resolve_precision
from ...units import change, mib, ratio
from ...validate import check_positive_int, is_number

GFLOP = 1e9


def _label(level) -> str:
    return "none" if level is None else str(level)


def _frozen_label(names: list[str]) -> str:
    return ", ".join(names) if names else "-"


def _typical_step_s(result: RunResult, phase_starts=()) -> float:
    """A run's mean step time, robust to disturbed steps: each timed step counts with the median of its phase.

    A fixed level has one phase (the mean is the median step); a gradual schedule starts a new phase at each
    step where a stage thaws (``phase_starts``, 0-based step indices), and its steps get slower from phase to
    phase, so one median would pick one phase. A plain mean would move with every step that other work on the
    machine slowed down.
    """
    times = result.step_times_s
    if not times:
        return math.nan
    first = result.steps - len(times)  # the timed steps are the run's last ones
    starts = sorted(set(phase_starts))
    phase = [sum(first + i >= start for start in starts) for i in range(len(times))]
    medians = {k: statistics.median([t for t, p in zip(times, phase, strict=True) if p == k]) for k in set(phase)}
    return statistics.fmean(medians[p] for p in phase)


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def level_table(model_names=("small_cnn", "resnet18", "shufflenet_v2_x0_5"), num_classes: int = 10) -> pd.DataFrame:
    """What each level freezes on each model (no training): one row per level, per model the frozen
    stages and the share of the parameters that still trains (with a ``num_classes`` head).

    Example:
        >>> level_table(["small_cnn", "resnet18"])
    """
    rows = {level: {"level": level} for level in LEVELS}
    for name in model_names:
        model = models.build(name, num_classes, pretrained=False)[0]
        total = sum(p.numel() for p in model.parameters())
        stages = dict(models.named_stages(model))
        for level in LEVELS:
            frozen = frozen_stages(model, level)
            kept = total - sum(p.numel() for stage in frozen for p in stages[stage].parameters())
            rows[level][name] = f"{_frozen_label(frozen)} ({kept / total:.1%} train)"
    return pd.DataFrame(list(rows.values()))


def _model_and_batch(cfg: RunConfig, level):
    """``cfg``'s model (random weights: FLOPs and saved bytes do not depend on them) frozen at ``level``, in
    training mode on its device, and one training batch as model input with its labels."""
    split = train.run_splits(cfg)["train"]
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model, _ = models.build(cfg.model, split.num_classes, pretrained=False)
    if level not in (None, "none"):
        freeze(model, level)
    model = model.to(device).train()
    x = data.to_model_input(split.images[:cfg.batch_size], split, device, cfg.channels_last, cfg.image_size)
    return model, x, split.labels[:cfg.batch_size].to(device)


def _layer_forward_flops(module: nn.Module, output: torch.Tensor) -> int:
    """A convolution's or linear layer's forward FLOPs, counted as torch's FlopCounterMode counts them."""
    weight = module.weight
    if isinstance(module, nn.modules.conv._ConvNd):
        return 2 * output.numel() * weight[0].numel()  # each output value: c_in/groups x kh x kw multiply-adds
    return 2 * output.numel() * module.in_features


def backward_profile(cfg: RunConfig, level) -> dict:
    """What the backward pass of one step at ``level`` must compute, layer by layer, and what it keeps.

    Every convolution and linear layer (the layers whose FLOPs are counted) is run once in a training
    forward pass and classified: a layer with a trainable weight computes the weight's gradient (about its
    forward FLOPs again); a layer whose **input** requires a gradient also computes the input's gradient
    (about its forward FLOPs once more). A frozen prefix has neither: nothing before it requires a gradient,
    so autograd records nothing there, and the first trainable layer's input (the frozen output) needs no
    gradient either. The saved-tensor hooks count the activation bytes autograd keeps for the backward pass.

    Returns:
        A dict: ``forward_flops`` (the layers' sum), ``trainable_forward_flops`` (layers with a trainable
        weight), ``no_input_grad_flops`` (of those, the ones whose input needs no gradient),
        ``predicted_backward_flops`` (``2 x trainable - no_input_grad`` for a frozen prefix; in general each
        layer's forward FLOPs times the number of gradients it computes), ``counter_overcount_flops`` (what
        torch's FLOP counter adds for grouped convolutions: it counts their weight gradient at ``groups`` times
        the forward FLOPs), ``saved_activation_bytes`` and ``saved_by_stage`` (stage -> bytes).

    Example:
        >>> backward_profile(cfg, "heavy")["predicted_backward_flops"] / 1e9
    """
    model, x, _ = _model_and_batch(cfg, level)
    stage_of = {id(m): name for name, stage in models.named_stages(model) for m in stage.modules()}
    layers = []

    def record(module, args, output):
        layers.append({"stage": stage_of.get(id(module)), "flops": _layer_forward_flops(module, output),
                       "weight_trains": module.weight.requires_grad, "input_needs_grad": args[0].requires_grad,
                       "groups": getattr(module, "groups", 1)})

    handles = [m.register_forward_hook(record) for m in model.modules()
               if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))]
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    saved: dict[str, int] = {}
    current = ["input"]

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in seen and pointer not in weights:  # activations only, each storage once
            seen.add(pointer)
            saved[current[0]] = saved.get(current[0], 0) + tensor.untyped_storage().nbytes()
        return tensor

    stages = dict(models.named_stages(model))
    capability = torch.cuda.get_device_capability(x.device) if x.device.type == "cuda" else None
    precision = resolve_precision(cfg.precision, x.device, capability)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                autocast(precision, x.device):
            h = x
            for name in models.block_names(model):
                current[0] = name
                h = stages[name](h)
            current[0] = "head"
            models.forward_head(model, h)
    finally:
        for handle in handles:
            handle.remove()
    trainable = sum(r["flops"] for r in layers if r["weight_trains"])
    no_input_grad = sum(r["flops"] for r in layers if r["weight_trains"] and not r["input_needs_grad"])
    return {
        "forward_flops": sum(r["flops"] for r in layers),
        "trainable_forward_flops": trainable,
        "no_input_grad_flops": no_input_grad,
        "predicted_backward_flops": sum(r["flops"] * (r["weight_trains"] + r["input_needs_grad"]) for r in layers),
        # torch's FlopCounterMode counts a grouped convolution's weight gradient as an ungrouped one would cost
        # (groups x its forward FLOPs): what its measurement adds on top of the real work.
        "counter_overcount_flops": sum(r["flops"] * (r["groups"] - 1) for r in layers if r["weight_trains"]),
        "saved_activation_bytes": sum(saved.values()),
        "saved_by_stage": saved,
    }


def level_sweep(cfg: RunConfig, levels=LEVELS, refresh: bool = False, progress: bool = True) -> pd.DataFrame:
    """Fine-tune ``cfg`` once per freezing level, from the same pretrained start and for the same steps.

    Runs go through `labkit.results.run_configs` (cached; a failed run becomes a row with its ``error``).
    Rows have `labkit.sweep`'s columns plus:

    - ``level``, ``frozen_stages`` (what the level freezes on this model), ``trainable_share``
      (trainable / all parameters);
    - ``time_ratio``, ``peak_ratio``, ``state_ratio`` (optimizer state), ``activation_ratio`` (the memory
      tracker's activation peak): against the run without freezing (``none``, always run);
    - ``forward_flops`` and ``backward_flops`` (measured: the step's FLOPs minus the forward's),
      ``predicted_backward_flops``, ``trainable_forward_flops``, ``no_input_grad_flops`` and
      ``saved_activation_bytes`` (`backward_profile`), ``backward_ratio`` (backward / none's backward);
    - ``mean_step_time_s`` (here the median step: a fixed level has one phase; see `schedule_runs`) and
      ``accuracy_change`` (accuracy - none's).

    Example:
        >>> df = level_sweep(labkit.config.baseline())
        >>> df[["level", "num_trainable_params", "time_ratio", "accuracy"]]
    """
    levels = list(levels)
    if not levels or any(level not in LEVELS and level is not None for level in levels):
        raise ConfigError("levels", levels, f"a non-empty list of levels from {list(LEVELS)}")
    names = [_label(level) for level in levels]
    if "none" not in names:
        names.append("none")  # the reference every ratio is relative to
    runs = results.run_configs([cfg.replace(freeze=name) for name in names], refresh=refresh, progress=progress)
    base = runs[names.index("none")]
    rows = []
    for name, result in zip(names, runs, strict=True):
        row = results.to_row(result)
        counts = backward_profile(cfg, name)
        backward = result.flops_per_step - counts["forward_flops"] if result.flops_per_step else math.nan
        base_backward = (base.flops_per_step - counts["forward_flops"]) if base.flops_per_step else math.nan
        row.update(
            level=name, frozen_stages=_frozen_label(frozen_stages(cfg.model, name)), test_size=profile().test_size,
            trainable_share=ratio(result.num_trainable_params, result.num_params),
            time_ratio=ratio(result.step_time_s, base.step_time_s),
            peak_ratio=ratio(result.peak_memory_bytes, base.peak_memory_bytes),
            state_ratio=ratio(result.memory.get("optimizer_state"), base.memory.get("optimizer_state")),
            activation_ratio=ratio(result.memory.get("activations"), base.memory.get("activations")),
            forward_flops=counts["forward_flops"], backward_flops=backward,
            predicted_backward_flops=counts["predicted_backward_flops"],
            trainable_forward_flops=counts["trainable_forward_flops"],
            no_input_grad_flops=counts["no_input_grad_flops"], counter_overcount_flops=counts["counter_overcount_flops"],
            saved_activation_bytes=counts["saved_activation_bytes"],
            backward_ratio=ratio(backward, base_backward),
            mean_step_time_s=_typical_step_s(result),
            accuracy_change=(result.accuracy - base.accuracy) if result.ok and base.ok and
            result.accuracy is not None and base.accuracy is not None else math.nan,
        )
        rows.append(row)
    frame = pd.DataFrame(rows)
    first = ["level", "frozen_stages", "num_trainable_params", "trainable_share", "step_time_s", "time_ratio",
             "forward_flops", "backward_flops", "predicted_backward_flops", "saved_activation_bytes",
             "peak_memory_bytes", "state_ratio", "accuracy", "accuracy_change"]
    return frame[first + [c for c in frame.columns if c not in first]]


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["error"].isna()] if "error" in frame else frame


def _row(frame: pd.DataFrame, level: str):
    rows = _ok(frame)
    rows = rows[rows["level"] == level]
    if rows.empty:
        raise ConfigError("frame", f"no successful {level!r} row",
                          f"a level_sweep frame with a successful row for {level!r}")
    return rows.iloc[0]


def _points(value: float) -> str:
    return f"{value * 100:+.1f} points"


@worded
def levels_finding(frame: pd.DataFrame) -> str:
    """Why the step got faster as more was frozen, from `level_sweep`'s frame: the backward pass's FLOPs,
    the activations kept, and what the step time did."""
    base = _row(frame, "none")
    deepest = _ok(frame)[_ok(frame)["level"] != "none"]
    if deepest.empty:
        raise ConfigError("frame", "only the 'none' row", "a level_sweep frame with at least one frozen level")
    deepest = deepest.sort_values("trainable_share").iloc[0]
    forward, backward = base["forward_flops"], base["backward_flops"]
    lines = [
        f"The forward pass costs the same at every level ({forward / GFLOP:.3g} GFLOP per step): every layer still "
        f"runs. The backward pass is what shrinks. With nothing frozen it cost {backward / GFLOP:.3g} GFLOP, "
        f"{backward / forward:.2f}x the forward: each layer computes its weight gradient and its input gradient "
        f"(the first layer skips the input gradient: the images need none)." + _overcount_note(base, forward),
        f"At {deepest['level']} ({deepest['frozen_stages']} frozen, {deepest['trainable_share']:.1%} of the "
        f"parameters training) it cost {deepest['backward_flops'] / GFLOP:.3g} GFLOP "
        f"({change(deepest['backward_ratio'])}): a frozen prefix computes no gradient at all, and the first trainable "
        f"layer only its weight gradient, since its input, the frozen output, needs none. Layer by layer this "
        f"predicts {deepest['predicted_backward_flops'] / GFLOP:.3g} GFLOP" + _against_counter(deepest),
        f"Autograd kept {mib(base['saved_activation_bytes'], '.3g')} of activations for the backward pass with nothing "
        f"frozen and {mib(deepest['saved_activation_bytes'], '.3g')} at {deepest['level']}: nothing in a frozen "
        f"prefix requires a gradient, so no graph is recorded there and nothing is saved. The memory tracker's "
        f"activation peak fell less ({change(deepest['activation_ratio'])}): the frozen forward still holds a "
        f"layer's input and output at the same time while it runs.",
    ]
    flop_share = (forward + deepest["backward_flops"]) / (forward + backward)
    text = (f"The step took {deepest['time_ratio']:.2f}x the time ({_duration(base['step_time_s'])} -> "
            f"{_duration(deepest['step_time_s'])}), against {flop_share:.2f}x the FLOPs. ")
    if deepest["step_time_s"] >= base["step_time_p10_s"]:
        text += (f"That is no faster than the fastest tenth of the unfrozen run's own steps (under "
                 f"{_duration(base['step_time_p10_s'])}): this machine's timing was disturbed, by other work running at "
                 "the same time or by too few timed steps. The FLOPs and memory above do not depend on it; rerun the "
                 "sweep with refresh=True when the machine is idle.")
    elif deepest["time_ratio"] > flop_share * 1.15:
        text += ("Time fell less than the FLOPs: the rest of the step (loading the batch, BatchNorm and ReLU, the loss, "
                 "the optimizer) does not shrink with the counted FLOPs, and small layers run below peak speed.")
    elif deepest["time_ratio"] < flop_share / 1.15:
        text += ("Time fell more than the FLOPs: the frozen prefix's BatchNorm and ReLU backward, which FLOP counters "
                 "leave out, is gone too, its BatchNorm layers run in eval mode (no batch statistics), and the "
                 "optimizer updates only the trainable tensors.")
    else:
        text += "Time followed the FLOPs closely: the convolutions dominate the step here."
    lines.append(text)
    return "\n".join(lines)


def _overcount_note(row, forward: float) -> str:
    extra = row.get("counter_overcount_flops", 0) or 0
    if not extra:
        return ""
    real = row["backward_flops"] - extra
    return (f" Of that, {extra / GFLOP:.3g} GFLOP is the FLOP counter counting the weight gradients of grouped "
            f"(depthwise) convolutions as if they were not grouped: the real backward is {real / GFLOP:.3g} GFLOP, "
            f"{real / forward:.2f}x the forward.")


def _against_counter(row) -> str:
    predicted, measured = row["predicted_backward_flops"], row["backward_flops"]
    if predicted == measured:
        return " exactly."
    if predicted + row.get("counter_overcount_flops", 0) == measured:
        return (f"; the FLOP counter measured {measured / GFLOP:.3g}, because it counts the weight gradient of a "
                "grouped (depthwise) convolution as if it were not grouped, groups x its forward FLOPs.")
    return f" (the FLOP counter measured {measured / GFLOP:.3g})."


@worded
def seed_tradeoff(frame: pd.DataFrame, level: str = "heavy", test_size: int | None = None) -> str:
    """The seed's claim, "heavy freezing cost more accuracy than it saved time", against `level_sweep`'s rows.

    The claim is read as: the fraction of accuracy lost is larger than the fraction of step time saved,
    and the loss is more than test-set noise (`labkit.measure.accuracy_noise`).
    """
    base, row = _row(frame, "none"), _row(frame, level)
    test_size = test_size or int(row.get("test_size") or 0) or None
    if test_size is None:
        raise ConfigError("test_size", test_size, "the number of test images the accuracies were measured on")
    noise = accuracy_noise((row["accuracy"] + base["accuracy"]) / 2, test_size)
    saved = 1 - row["time_ratio"]
    lost = base["accuracy"] - row["accuracy"]
    lost_share = lost / base["accuracy"] if base["accuracy"] else math.nan
    text = (f"{level} freezing ({row['frozen_stages']}) took {row['time_ratio']:.2f}x the step time of no freezing "
            f"({change(row['time_ratio'])}) and reached {row['accuracy']:.1%} accuracy against {base['accuracy']:.1%} "
            f"({_points(-lost)}; differences under {noise * 100:.1f} points are test-set noise at {test_size} "
            f"images). ")
    if saved <= 0:
        text += ("It was not faster here, which freezing a prefix cannot cause (its backward pass is smaller): this "
                 "machine's timing was disturbed, so these times cannot judge the claim. Rerun the sweep with "
                 "refresh=True when the machine is idle.")
    elif lost > noise and lost_share > saved:
        text += (f"Reproduced: it lost {lost_share:.0%} of the accuracy to save {saved:.0%} of the time. After the same "
                 "steps the frozen stages could not adapt to the new task, and the time saved does not buy the "
                 "accuracy back.")
    elif lost > noise:
        text += (f"Not reproduced as stated: it lost accuracy beyond noise ({lost_share:.0%} of it), but a smaller share "
                 f"than the {saved:.0%} of time it saved; whether that trade is worth it depends on what the last "
                 "points are worth to you.")
    else:
        text += (f"Not reproduced here: the accuracy lost is within noise, so the {saved:.0%} of time it saved came "
                 "free. Here the frozen pretrained stages already compute features this task can use; where the "
                 "pretraining task is further from the new one (as the seed's may have been), the frozen stages "
                 "would need to relearn more, and heavy freezing costs more.")
    return text


# --- BatchNorm in frozen stages -------------------------------------------------------------------------


@dataclass
class BatchNormDemo:
    """`batchnorm_demo`'s rows (one per way of freezing) and what they show."""

    frame: pd.DataFrame
    level: str

    @worded
    def finding(self) -> str:
        good, bad = self.frame.iloc[0], self.frame.iloc[1]
        text = (f"Frozen at {self.level}, both ways left every frozen weight exactly as it was (largest change: "
                f"{good['frozen_weight_change']:g} and {bad['frozen_weight_change']:g}). With requires_grad_(False) "
                f"alone, the frozen BatchNorm layers' running means still moved by up to "
                f"{bad['running_mean_change']:.3g} (kept in eval mode: {good['running_mean_change']:g}), so the frozen "
                f"body's output on a fixed batch changed by {bad['feature_change']:.1%} (eval mode: "
                f"{good['feature_change']:.1%}): those stages were not frozen, and features cached from them "
                f"would be stale. ")
        text += (f"In training mode the layers also normalise each batch by its own statistics, and the head learns "
                 f"on those, while evaluation uses the running ones. Accuracy: {bad['accuracy']:.1%} against "
                 f"{good['accuracy']:.1%} kept in eval mode")
        noise = accuracy_noise((good["accuracy"] + bad["accuracy"]) / 2, int(good["test_size"]))
        difference = bad["accuracy"] - good["accuracy"]
        if abs(difference) <= noise:
            text += (f" (within the {noise * 100:.1f}-point noise): here the damage is to what the frozen stages "
                     "compute, not to the score; with smaller batches, whose statistics are noisier, the score "
                     "tends to suffer too.")
        elif difference < 0:
            text += f" ({_points(difference)}): the moving statistics cost accuracy here."
        else:
            text += (f" ({_points(difference)}): adapting the statistics to the new data helped here (the idea behind "
                     "AdaBN), but then do it on purpose: the layers are not frozen, and their features cannot be cached.")
        step = ratio(bad["step_time_s"], good["step_time_s"])
        text += f" A step took {step:.2f}x the time of the eval-mode one (batch statistics are computed and kept)."
        return text


def _frozen_batchnorms(model: nn.Module, names: list[str]) -> list[nn.Module]:
    stages = dict(models.named_stages(model))
    return [m for name in names for m in stages[name].modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _bn_demo_run(cfg: RunConfig, level: str, batchnorm_eval: bool, progress: bool) -> dict:
    split = train.run_splits(cfg)["train"]
    torch.manual_seed(cfg.seed)
    model, _ = models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)
    freeze(model, level, batchnorm_eval=batchnorm_eval)
    names = frozen_stages(model, level)
    batchnorms = _frozen_batchnorms(model, names)
    means = [bn.running_mean.clone() for bn in batchnorms]
    weights = [p.detach().clone() for name in names for p in dict(models.named_stages(model))[name].parameters()]
    trainer = train.Trainer(cfg.replace(freeze=None), model=model)
    probe = data.to_model_input(split.images[:cfg.batch_size], split, trainer.device, cfg.channels_last,
                                cfg.image_size)

    def body_output() -> torch.Tensor:
        was = trainer.model.training
        trainer.model.eval()
        with torch.no_grad():
            h = probe
            stages = dict(models.named_stages(trainer.model))
            for name in names:
                h = stages[name](h)
        trainer.model.train(was)
        return h.float()

    before = body_output()
    result = trainer.run(progress=progress)
    after = body_output()
    frozen_now = [p.detach() for name in names for p in dict(models.named_stages(trainer.model))[name].parameters()]
    return {
        "result": result.to_dict(),
        "running_mean_change": max((float((bn.running_mean.cpu() - m.cpu()).abs().max())
                                    for bn, m in zip(batchnorms, means, strict=True)), default=0.0),
        "feature_change": float((after - before).norm() / before.norm()),
        "frozen_weight_change": max((float((a.cpu() - b.cpu()).abs().max())
                                     for a, b in zip(frozen_now, weights, strict=True)), default=0.0),
        "kept_in_eval": all(is_frozen_batchnorm(bn) for bn in batchnorms),
    }


def batchnorm_demo(cfg: RunConfig, level: str = "head_only", refresh: bool = False,
                   progress: bool = True) -> BatchNormDemo:
    """Freeze ``cfg``'s model at ``level`` twice: as labkit does (BatchNorm kept in eval mode) and with
    ``requires_grad_(False)`` alone (its BatchNorm layers follow ``model.train()``), and fine-tune both.

    Rows (in that order): ``variant``, ``running_mean_change`` (the largest change of a frozen BatchNorm
    layer's running mean over the run), ``feature_change`` (relative change of the frozen stages' eval-mode
    output on a fixed batch), ``frozen_weight_change`` (0: no frozen weight moves either way), and the run's
    ``accuracy``, ``step_time_s`` and ``test_size``. Cached like the runs (`labkit.results.cached_record`).

    Example:
        >>> demo = batchnorm_demo(cfg); print(demo.finding())
    """
    if level in (None, "none") or level not in LEVELS:
        raise ConfigError("level", level, f"a level that freezes something: one of {list(LEVELS[1:])}")
    if not models.has_batchnorm(models.build(cfg.model, 2, pretrained=False)[0]):
        raise ConfigError("model", cfg.model, "a model with BatchNorm layers")
    rows = []
    env = env_report(cfg.device)
    for variant, keep in (("BatchNorm kept in eval mode (labkit)", True), ("requires_grad_(False) only", False)):
        key = f"{results.cache_key(cfg.replace(freeze=level), env)}-bn-demo-{'eval' if keep else 'train'}"
        record = results.cached_record(key, lambda keep=keep: _bn_demo_run(cfg, level, keep, progress), refresh)
        result = RunResult.from_dict(record["result"])
        rows.append({"variant": variant, "running_mean_change": record["running_mean_change"],
                     "feature_change": record["feature_change"],
                     "frozen_weight_change": record["frozen_weight_change"], "accuracy": result.accuracy,
                     "step_time_s": result.step_time_s, "test_size": profile().test_size,
                     "error": result.error})
    return BatchNormDemo(pd.DataFrame(rows), level)


# --- Feature caching ------------------------------------------------------------------------------------


@dataclass
class FeatureCaching:
    """`feature_caching`'s measurements: time per epoch both ways, the one-off extraction, and the accuracies."""

    frame: pd.DataFrame
    extract_s: float
    cache_bytes: int
    head_weight_diff: float
    epochs: int

    @property
    def speedup(self) -> float:
        """Head-only epoch time through the network / epoch time on the cached features."""
        by = self.frame.set_index("method")
        return by.loc["through the network", "epoch_time_s"] / by.loc["cached features", "epoch_time_s"]

    @worded
    def finding(self) -> str:
        by = self.frame.set_index("method")
        through, cached = by.loc["through the network", "epoch_time_s"], by.loc["cached features", "epoch_time_s"]
        gain = through - cached
        even = self.extract_s / gain if gain > 0 else math.inf
        total_through = self.epochs * through
        total_cached = self.extract_s + self.epochs * cached
        text = (f"An epoch of head-only training took {_duration(through)} through the whole network and "
                f"{_duration(cached)} on the cached features ({self.speedup:.1f}x faster); computing the features "
                f"once took {_duration(self.extract_s)} and {mib(self.cache_bytes, '.3g')} of memory. ")
        if math.isfinite(even):
            text += (f"Caching pays for itself after {even:.2f} epochs; over these {self.epochs} epochs it took "
                     f"{_duration(total_cached)} in all against {_duration(total_through)}. ")
        else:
            text += "Here it never pays: an epoch on the cache was not faster. "
        same = by.loc["through the network", "accuracy"] == by.loc["cached features", "accuracy"]
        text += (f"Both trained the same head on the same features: its weights differ by {self.head_weight_diff:.2g} "
                 f"(relative), and the accuracy is {by.loc['cached features', 'accuracy']:.1%}"
                 + (" both ways." if same else f" against {by.loc['through the network', 'accuracy']:.1%} (float "
                                               "rounding: the features were computed in other batch sizes)."))
        return text


def _synchronized_time(device: torch.device, start: float) -> float:
    measure.synchronize(device)
    return time.perf_counter() - start


def _head_step(trainer: train.Trainer, features: torch.Tensor, labels: torch.Tensor) -> None:
    """The engine's step on a batch of cached body outputs: forward through the head only."""
    with autocast(trainer.precision, trainer.device):
        loss = F.cross_entropy(models.forward_head(trainer.model, features), labels)
    trainer.scaler.scale(loss).backward()
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    trainer.optimizer.zero_grad(set_to_none=True)


def _caching_record(cfg: RunConfig, epochs: int) -> dict:
    through = train.Trainer(cfg)
    device = through.device
    times_through = []
    for _ in range(epochs):
        start = time.perf_counter()
        for images, labels in through.loader:
            through.step(images, labels)
        times_through.append(_synchronized_time(device, start))

    cached = train.Trainer(cfg)  # the same seed: the same head to start from, the same batch order
    split = cached.train_split
    order = data.make_loader(split, batch_size=max(cfg.batch_size, 256), shuffle=False)
    start = time.perf_counter()
    features = cache_features(cached.model, (data.to_model_input(images, split, device, cfg.channels_last,
                                                                 cfg.image_size) for images, _ in order))
    extract_s = _synchronized_time(device, start)
    labels_all = split.labels.to(device)
    batches = BatchSampler(RandomSampler(range(len(split)), generator=torch.Generator().manual_seed(cfg.seed)),
                           cfg.batch_size, drop_last=True)  # the order the Trainer's loader draws
    times_cached = []
    for _ in range(epochs):
        start = time.perf_counter()
        for indices in batches:
            index = torch.as_tensor(indices, device=device)
            _head_step(cached, features[index], labels_all[index])
        times_cached.append(_synchronized_time(device, start))

    test = through.splits["test"]
    heads = [dict(models.named_stages(t.model))["head"] for t in (through, cached)]
    pairs = list(zip(heads[0].parameters(), heads[1].parameters(), strict=True))
    largest = max(float(a.detach().abs().max()) for a, _ in pairs)
    diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in pairs) / largest
    accuracy = [train.evaluate(t.model, test, cfg, device, t.precision) for t in (through, cached)]
    return {"epoch_times_through_s": times_through, "epoch_times_cached_s": times_cached, "extract_s": extract_s,
            "cache_bytes": features.untyped_storage().nbytes(), "head_weight_diff": diff,
            "accuracy_through": accuracy[0], "accuracy_cached": accuracy[1], "steps_per_epoch": len(through.loader)}


def feature_caching(cfg: RunConfig, epochs: int = 3, refresh: bool = False) -> FeatureCaching:
    """Head-only training two ways, ``epochs`` epochs each from the same start on the same batches: through
    the whole (frozen) network every step, and on the body's output computed once (`cache_features`).

    ``cfg`` is run at ``freeze="head_only"`` (no lr warm-up, no accumulation, no clipping: one plain step).
    Cached like the runs (`labkit.results.cached_record`).

    Returns:
        A `FeatureCaching`: ``frame`` (``method``, ``epoch_time_s``, the median over the epochs, and
        ``accuracy``), ``extract_s`` (computing the cache once), ``cache_bytes``, ``head_weight_diff`` (the
        two heads' largest weight difference, relative: about 0, the same training) and ``speedup``.

    Example:
        >>> caching = feature_caching(cfg); print(caching.finding())
    """
    check_positive_int("epochs", epochs)
    run = cfg.replace(freeze="head_only", lr_warmup_steps=0, grad_accum=1, grad_clip=None, max_steps=None, epochs=1)
    key = f"{results.cache_key(run, env_report(cfg.device))}-feature-caching-{epochs}"
    record = results.cached_record(key, lambda: _caching_record(run, epochs), refresh)
    frame = pd.DataFrame([
        {"method": "through the network", "epoch_time_s": statistics.median(record["epoch_times_through_s"]),
         "accuracy": record["accuracy_through"]},
        {"method": "cached features", "epoch_time_s": statistics.median(record["epoch_times_cached_s"]),
         "accuracy": record["accuracy_cached"]},
    ])
    return FeatureCaching(frame, record["extract_s"], record["cache_bytes"], record["head_weight_diff"], epochs)


# --- Gradual unfreezing and discriminative learning rates --------------------------------------------------

SCHEDULES = ("gradual unfreezing", "discriminative lr", "gradual + discriminative")


def _schedule_record(cfg: RunConfig, schedule: str, decay: float, progress: bool) -> dict:
    gradual = schedule != "discriminative lr"
    trainer = train.Trainer(cfg.replace(freeze="head_only" if gradual else None))
    body = models.block_names(trainer.model)
    steps = train.total_steps(cfg, len(trainer.loader))
    every = max(1, steps // (len(body) + 1))  # the last stage thaws with a share of the steps left
    # One optimizer over every parameter from the start: a frozen one has no gradient, so AdamW skips it and
    # keeps no state for it until it thaws.
    groups = discriminative_param_groups(trainer.model, cfg.lr, decay if schedule != "gradual unfreezing" else 1.0,
                                         trainable_only=False)
    trainer.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    thawed = []

    def on_step(done: int, total: int) -> None:
        if gradual:
            thawed.extend((done, name) for name in gradual_unfreeze(trainer.model, done, every))

    result = trainer.run(on_step=on_step if gradual else None, progress=progress)
    if gradual:
        # The run's memory was tracked early, with only the head training: track one more step, with
        # every stage thawed, for the memory the schedule ends with.
        images, labels = next(iter(trainer.loader))
        breakdown = measure.track_step_memory(lambda: trainer.step(images, labels), trainer.model,
                                              trainer.optimizer, trainer.device)
        result.memory, result.memory_at_peak = breakdown.peak_by_category, breakdown.at_peak
        if trainer.device.type != "cuda" and breakdown.total_peak_bytes is not None:
            result.peak_memory_bytes = breakdown.total_peak_bytes
        result.num_trainable_params = measure.count_parameters(trainer.model)[1]
    return {"result": result.to_dict(), "every": every, "thawed": thawed,
            "stage_lrs": {g["stage"]: g["lr"] for g in groups}}


def schedule_runs(cfg: RunConfig, sweep: pd.DataFrame, decay: float = 1 / 2.6, refresh: bool = False,
                  progress: bool = True) -> pd.DataFrame:
    """Gradual unfreezing, discriminative learning rates and both together, beside `level_sweep`'s fixed levels.

    - ``gradual unfreezing``: starts at ``head_only`` and thaws one body stage from the top every
      ``steps // (body stages + 1)`` steps (`labkit.techniques.freezing.gradual_unfreeze`); by the end
      everything trains.
    - ``discriminative lr``: nothing frozen; the head trains at ``cfg.lr`` and each stage below at ``decay``
      times the one above it (`labkit.techniques.freezing.discriminative_param_groups`).
    - ``gradual + discriminative``: both (ULMFiT's recipe, Howard & Ruder 2018).

    Every run trains ``cfg``'s steps from the same pretrained start with AdamW. Columns: ``setup`` (the
    level or the schedule), ``kind`` (``fixed`` / ``schedule``), ``accuracy``, ``mean_step_time_s`` (each timed
    step counted at the median of its phase: a gradual schedule's steps get slower as stages thaw, and a step
    slowed by other work on the machine moves no median), ``train_time_s``,
    ``num_trainable_params`` (at the end), ``peak_memory_bytes`` and the memory categories (a gradual run's
    from one extra step at its end, with everything thawed), ``schedule`` (when each stage thawed, or each
    stage's lr).

    Example:
        >>> schedules = schedule_runs(cfg, level_sweep(cfg)); print(schedule_finding(schedules))
    """
    if cfg.optimizer != "adamw":
        raise ConfigError("optimizer", cfg.optimizer, "'adamw' (the schedules build their own AdamW)")
    if cfg.lr_warmup_steps:
        raise ConfigError("lr_warmup_steps", cfg.lr_warmup_steps, "0: a warm-up would set every group to one lr")
    if not is_number(decay) or not 0 < decay <= 1:
        raise ConfigError("decay", decay, "a number in (0, 1] (the lr factor from one stage to the one below)")
    env = env_report(cfg.device)
    rows = []
    for _, fixed in _ok(sweep).iterrows():
        rows.append({"setup": fixed["level"], "kind": "fixed", "accuracy": fixed["accuracy"],
                     "mean_step_time_s": fixed["mean_step_time_s"], "train_time_s": fixed["train_time_s"],
                     "num_trainable_params": fixed["num_trainable_params"],
                     "peak_memory_bytes": fixed["peak_memory_bytes"], "schedule": fixed["frozen_stages"],
                     **{c: fixed[c] for c in fixed.index if c.startswith("mem_")}, "error": None})
    for schedule in SCHEDULES:
        key = f"{results.cache_key(cfg, env)}-schedule-{schedule.replace(' ', '_')}-{decay:.6g}"
        record = results.cached_record(key, lambda s=schedule: _schedule_record(cfg, s, decay, progress), refresh)
        result = RunResult.from_dict(record["result"])
        row = results.to_row(result)
        if schedule == "discriminative lr":
            plan = ", ".join(f"{name} {lr:.2g}" for name, lr in record["stage_lrs"].items())
        else:
            plan = ", ".join(f"{name}@{step}" for step, name in record["thawed"])
        rows.append({"setup": schedule, "kind": "schedule", "accuracy": result.accuracy,
                     "mean_step_time_s": _typical_step_s(result, [step for step, _ in record["thawed"]]),
                     "train_time_s": result.train_time_s, "num_trainable_params": result.num_trainable_params,
                     "peak_memory_bytes": result.peak_memory_bytes, "schedule": plan,
                     **{c: row[c] for c in row if c.startswith("mem_")}, "error": result.error})
    return pd.DataFrame(rows)


@worded
def schedule_finding(frame: pd.DataFrame, test_size: int) -> str:
    """How the schedules compare with the fixed levels, in accuracy and time, from `schedule_runs`' frame."""
    ok = _ok(frame).set_index("setup")
    if "none" not in ok.index:
        raise ConfigError("frame", "no 'none' row", "a schedule_runs frame with the fixed level 'none'")
    base = ok.loc["none"]
    best = ok.sort_values(["accuracy", "mean_step_time_s"], ascending=[False, True]).index[0]
    noise = accuracy_noise(ok["accuracy"].mean(), test_size)
    lines = []
    for setup in [s for s in SCHEDULES if s in ok.index]:
        row = ok.loc[setup]
        lines.append(f"{setup}: {row['accuracy']:.1%} ({_points(row['accuracy'] - base['accuracy'])} against no "
                     f"freezing), mean step {ratio(row['mean_step_time_s'], base['mean_step_time_s']):.2f}x no "
                     f"freezing's; schedule: {row['schedule']}.")
    close = ok[(ok["accuracy"] >= ok.loc[best, "accuracy"] - noise)]
    fastest = close.sort_values("mean_step_time_s").index[0]
    lines.append(f"Best accuracy: {best} ({ok.loc[best, 'accuracy']:.1%}). Within the {noise * 100:.1f}-point noise "
                 f"of it: {', '.join(close.index)}; the fastest of those is {fastest}.")
    return "\n".join(lines)


# --- The learner's own numbers ------------------------------------------------------------------------------


def backward_numbers(sweep: pd.DataFrame, level: str = "heavy") -> dict:
    """Your own numbers for exercise ``05.own_backward``, from `level_sweep`'s row for ``level`` (in GFLOP)."""
    row = _row(sweep, level)
    return {"level": level, "trainable_gflop": round(float(row["trainable_forward_flops"]) / GFLOP, 4),
            "first_gflop": round(float(row["no_input_grad_flops"]) / GFLOP, 4)}


@worded
def backward_check(numbers: dict, sweep: pd.DataFrame) -> str:
    """The backward FLOPs the exercise's arithmetic gives, beside what the FLOP counter measured in the run."""
    row = _row(sweep, numbers["level"])
    computed = 2 * numbers["trainable_gflop"] - numbers["first_gflop"]
    measured = row["backward_flops"] / GFLOP
    return (f"The arithmetic gives {computed:.4g} GFLOP for the backward pass at {numbers['level']}; the FLOP counter "
            f"measured {measured:.4g} GFLOP in the run ({measured / computed - 1:+.2%}, the numbers' rounding).")

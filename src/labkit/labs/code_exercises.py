"""The notebooks' code exercises: the learner writes a technique's core function, the checker runs it
against the engine.

Each exercise has a reference solution here (what `labkit.exercises.solution(name)` prints for
instructors) and a checker that raises `labkit.exercises.WrongAnswer` with a hint naming what differs.
Importing any lab module registers them (`labkit.labs` imports this module).
"""

from __future__ import annotations

import copy
import functools
import math
import time

import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from .. import data, exercises, models
from ..config import RunConfig
from ..env import env_report, resolve_device
from ..equivalence import compare_step
from ..exercises import CodeExercise, WrongAnswer
from ..techniques import freezing, lora, pruning, quantization
from ..train import run_splits
from . import recipe
from .batch_size import without_batchnorm
from .memory_savers import activation_peak, mlp_blocks

# --- 00: a timer that is right on a GPU ------------------------------------------------------------------


def time_steps_solution(step, sync, warmup=3, repeats=10):
    """Time ``repeats`` calls of ``step()`` after ``warmup`` untimed ones; return each call's seconds."""
    import time

    for _ in range(warmup):
        step()
    sync()  # the warm-up's queued work must not land in the first timed step
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync()  # wait for the queued work before reading the clock
        times.append(time.perf_counter() - start)
    return times


class FakeAsyncDevice:
    """A pretend GPU: ``step()`` only queues work and returns at once, ``sync()`` waits for the queue.

    The first ``warmup`` steps are slow (as a GPU's first kernels are), later ones take ``step_s``.
    """

    def __init__(self, warmup: int, step_s: float = 0.01, first_s: float = 0.1):
        self.warmup, self.step_s, self.first_s = warmup, step_s, first_s
        self.calls = 0
        self.queued_s = 0.0

    def step(self) -> None:
        self.queued_s += self.first_s if self.calls < self.warmup else self.step_s
        self.calls += 1

    def sync(self) -> None:
        time.sleep(self.queued_s)
        self.queued_s = 0.0


def _check_timer(time_steps) -> str:
    warmup, repeats = 3, 8
    device = FakeAsyncDevice(warmup)
    times = time_steps(device.step, device.sync, warmup, repeats)
    try:
        times = [float(t) for t in times]
    except TypeError:
        raise WrongAnswer("00.timer: return a list with one time in seconds per timed step") from None
    if len(times) != repeats:
        raise WrongAnswer(f"00.timer: {len(times)} times returned for repeats={repeats}: return one per timed step "
                          "(the warm-up steps are not timed)")
    if device.calls != warmup + repeats:
        raise WrongAnswer(f"00.timer: step() was called {device.calls} times; expected warmup + repeats = "
                          f"{warmup + repeats}")
    too_short = [t for t in times if t < 0.7 * device.step_s]
    if too_short:
        raise WrongAnswer(f"00.timer: a step of {device.step_s * 1e3:.0f} ms was timed as {min(too_short) * 1e3:.2f} ms: "
                          "the clock was read before the queued work finished. Hint: call sync() after step() "
                          "and before reading the clock")
    if max(times) > 0.6 * device.first_s:
        raise WrongAnswer(f"00.timer: a timed step took {max(times) * 1e3:.0f} ms, as long as a warm-up step: the "
                          "warm-up's queued work landed in it. Hint: call sync() once after the warm-up loop")
    median = sorted(times)[len(times) // 2]
    return (f"On a pretend GPU that queues work, your timer measured a median of {median * 1e3:.1f} ms for a "
            f"{device.step_s * 1e3:.0f} ms step, warm-up excluded: labkit's StepTimer follows the same rule.")


exercises.register(CodeExercise(
    name="00.timer",
    task=("Complete the timer below: call step() `warmup` times untimed, then time `repeats` calls with "
          "time.perf_counter() and return the list of their durations in seconds. step() may return before its "
          "work is done (as on a GPU) and sync() waits until it is: no warm-up work may land in a timed step, and "
          "every timed step's work must be done before the clock is read."),
    checker=_check_timer,
    reference=time_steps_solution,
))


# --- 01: the mixed-precision step ------------------------------------------------------------------------


def amp_step_solution(model, images, labels, optimizer, scaler, dtype, max_norm=1.0):
    """One mixed-precision step: autocast forward, scaled backward, unscale, clip, step, update."""
    with torch.autocast(images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()  # a disabled scaler (bf16) passes the loss through
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # skips the step if a gradient is inf/NaN
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def exercise_config(**changes) -> RunConfig:
    """The small run the code exercises compare against: small_cnn on shapes10, batch 16, from scratch."""
    return RunConfig(model="small_cnn", dataset="shapes10", batch_size=16, pretrained=False, max_steps=4,
                     **changes)


def _diagnose_step(name: str, comparison, precision: str) -> str | None:
    if comparison.engine_steps != comparison.plain_steps:
        return (f"optimizer.step() ran {comparison.plain_steps} times in your step, {comparison.engine_steps} in the "
                "engine's. Hint: step through the scaler, scaler.step(optimizer), once per step")
    if comparison.engine_scale != comparison.plain_scale:
        return (f"the GradScaler's scale is {comparison.plain_scale:g}, the engine's {comparison.engine_scale:g}. "
                "Hint: call scaler.update() once after scaler.step(optimizer)")
    if not comparison.same(rel_tol=1e-4):
        return (f"in {precision}, the gradients the optimizer got differ from the engine's by "
                f"{comparison.grad_diff:.2g} (relative). Hint: scale the loss before backward(), call "
                "scaler.unscale_(optimizer) before clipping, clip to max_norm, and zero the gradients every step")
    return None


def _check_amp_step(amp_step) -> str:
    env = env_report()
    # A GPU before Ampere may refuse bf16 kernels outright: there only fp16 can be compared.
    precisions = ("fp16", "bf16") if env["device"] != "cuda" or env["bf16"] else ("fp16",)
    for precision in precisions:
        step = functools.partial(amp_step, max_norm=1.0)
        comparison = compare_step(step, exercise_config(precision=precision, grad_clip=1.0))
        problem = _diagnose_step("01.amp_step", comparison, precision)
        if problem:
            raise WrongAnswer(f"01.amp_step: {problem}")
    # A scale of 2**40 overflows fp16 gradients: the engine skips that step, and so must yours.
    overflow = compare_step(functools.partial(amp_step, max_norm=1.0), exercise_config(precision="fp16", grad_clip=1.0),
                            steps=1, init_scale=2.0**40)
    if overflow.plain_steps:
        raise WrongAnswer("01.amp_step: with fp16 gradients that overflowed (inf), your step still stepped the "
                          "optimizer, and the weights became inf/NaN. Hint: step through the scaler, "
                          "scaler.step(optimizer): it skips the step when a gradient is not finite")
    done = "In fp16 (with a GradScaler) and in bf16 (its scaler disabled)" if len(precisions) == 2 else "In fp16"
    return (f"{done}, two steps of your function gave the "
            "optimizer the same gradients as labkit's Trainer.step, clipped to 1.0, and it skipped a step whose "
            "gradients overflowed.")


exercises.register(CodeExercise(
    name="01.amp_step",
    task=("Complete the step below, (model, images, labels, optimizer, scaler, dtype, max_norm): one training "
          "step with the forward and the cross-entropy loss under torch.autocast(dtype=dtype), the backward pass "
          "through the GradScaler, the gradients clipped to max_norm (unscaled first), the optimizer step through "
          "the scaler, the scaler's update, and the gradients zeroed for the next step. It must work for fp16 (an "
          "enabled scaler) and bf16 (a disabled one); the checker runs two steps."),
    checker=_check_amp_step,
    reference=amp_step_solution,
))


# --- 02: accumulation over micro-batches of different sizes ----------------------------------------------


def accumulate_solution(model, micro_batches):
    """Leave in ``.grad`` the gradient of the mean loss over all samples of ``micro_batches``."""
    total = sum(len(labels) for _, labels in micro_batches)
    for images, labels in micro_batches:
        # each micro-batch's mean loss, weighted by its share of the samples (k equal ones: 1/k each)
        loss = F.cross_entropy(model(images), labels) * (len(labels) / total)
        loss.backward()


def _batchnorm_free(seed: int = 0):
    cfg = exercise_config()
    device = resolve_device(cfg.device)
    split = run_splits(cfg)["train"]
    torch.manual_seed(seed)
    model = without_batchnorm(models.build(cfg.model, split.num_classes, pretrained=False)[0])
    return model.to(device), split, device


def _check_accumulate(accumulate) -> str:
    model, split, device = _batchnorm_free()
    x = data.to_model_input(split.images[:32], split, device)
    y = split.labels[:32].to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    F.cross_entropy(model(x), y).backward()
    whole = [p.grad.clone() for p in params]
    largest = max(float(g.abs().max()) for g in whole)
    for sizes in ((8, 8, 8, 8), (5, 11, 16)):
        model.zero_grad(set_to_none=True)
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        accumulate(model, [(x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
        if any(p.grad is None for p in params):
            raise WrongAnswer("02.accumulate: some parameters have no gradient: call backward() on every micro-batch's loss")
        diff = max(float((p.grad - g).abs().max()) for p, g in zip(params, whole, strict=True)) / largest
        if diff > 1e-4:
            hint = ("divide each micro-batch's loss so that the sum is the mean over all samples" if len(set(sizes)) == 1
                    else "with unequal micro-batches, 1/k is wrong: weight each micro-batch's mean loss by its "
                         "share of the samples, len(labels) / total")
            raise WrongAnswer(f"02.accumulate: with micro-batches of {sizes} samples the gradient differs from the "
                              f"whole batch's by {diff:.2g} (relative). Hint: {hint}")

    def engine_like(model, images, labels, optimizer):
        accumulate(model, list(zip(images.chunk(4), labels.chunk(4), strict=True)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    comparison = compare_step(engine_like, exercise_config(grad_accum=4, optimizer="sgd", lr=0.1))
    if not comparison.same(rel_tol=1e-4):
        raise WrongAnswer(f"02.accumulate: with 4 equal micro-batches your gradients differ from Trainer.step's "
                          f"(grad_accum=4) by {comparison.grad_diff:.2g}")
    return ("Your accumulation gives the whole batch's gradient for equal and unequal micro-batches, and equals "
            "labkit's Trainer.step with grad_accum=4.")


exercises.register(CodeExercise(
    name="02.accumulate",
    task=("Complete accumulate(model, micro_batches) below: micro_batches is a list of (images, labels) pairs, "
          "possibly of different sizes. Run forward and backward on each so that, afterwards, every parameter's .grad is the "
          "gradient of the mean cross-entropy over all their samples together (no optimizer step)."),
    checker=_check_accumulate,
    reference=accumulate_solution,
))


# --- 03: checkpoint an nn.Sequential ---------------------------------------------------------------------


def checkpointed_forward_solution(blocks, x):
    """Run ``blocks`` (an nn.Sequential) on ``x``, each block under a checkpoint."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)  # keep only the block's input; recompute the rest
    return x


def _check_checkpointed(forward) -> str:
    blocks = mlp_blocks()
    x = torch.randn(256, 256)
    plain_bytes, plain_grads, plain_out = activation_peak(blocks, lambda b, t: b(t), x)
    yours_bytes, yours_grads, yours_out = activation_peak(blocks, forward, x)
    if not torch.allclose(yours_out, plain_out, rtol=1e-5, atol=1e-6):
        raise WrongAnswer("03.checkpoint: your forward's output differs from blocks(x): run every block, in order")
    if any(a is None or not torch.allclose(a, b, rtol=1e-4, atol=1e-7)
           for a, b in zip(yours_grads, plain_grads, strict=True)):
        raise WrongAnswer("03.checkpoint: the gradients differ from the plain forward's. Hint: "
                          "checkpoint(block, x, use_reentrant=False) returns the block's output; pass it on")
    if yours_bytes > 0.8 * plain_bytes:
        raise WrongAnswer(f"03.checkpoint: activations peaked at {yours_bytes / 2**20:.1f} MiB, the plain forward's at "
                          f"{plain_bytes / 2**20:.1f} MiB: nothing was checkpointed, or everything in one segment, "
                          "which recomputes all of it at once. Hint: wrap each block in "
                          "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)")
    return (f"Same output and gradients as the plain forward, with activations peaking at "
            f"{yours_bytes / 2**20:.1f} MiB instead of {plain_bytes / 2**20:.1f} MiB.")


exercises.register(CodeExercise(
    name="03.checkpoint",
    task=("Complete the forward below, (blocks, x): run each block of the nn.Sequential `blocks` on x under "
          "torch.utils.checkpoint.checkpoint, so that the output and the gradients stay the same and the "
          "activations held during forward and backward fall (checkpointing the whole stack as one segment "
          "recomputes it all at once and saves nothing at the peak)."),
    checker=_check_checkpointed,
    reference=checkpointed_forward_solution,
))


# --- 04: global magnitude pruning by hand ----------------------------------------------------------------


def global_masks_solution(model, amount):
    """One magnitude threshold for every Conv2d/Linear weight of ``model``: masks that zero ``amount`` of them all."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    scores = torch.cat([m.weight.detach().abs().flatten() for _, m in layers])
    k = round(amount * scores.numel())  # how many weights go, rounded as torch.nn.utils.prune rounds
    if k == 0:
        return {name: torch.ones_like(m.weight, dtype=torch.bool) for name, m in layers}
    threshold = scores.kthvalue(k).values  # the k-th smallest magnitude, over the whole model
    return {name: m.weight.detach().abs() > threshold for name, m in layers}


def _check_global_masks(global_masks) -> str:
    torch.manual_seed(0)
    model = models.SmallCNN(10)
    names = [name for name, _ in pruning.prunable_layers(model)]
    # Distinct magnitudes: no two weights tie at a threshold, where either of them may go.
    sizes = [m.weight.numel() for _, m in pruning.prunable_layers(model)]
    magnitudes = (torch.randperm(sum(sizes)).float() + 1).split(sizes)
    with torch.no_grad():
        for (_, m), values in zip(pruning.prunable_layers(model), magnitudes, strict=True):
            m.weight.copy_((values * torch.randn(values.shape).sign()).reshape(m.weight.shape) / sum(sizes))
    for amount in (0.0, 0.3, 0.7):
        masks = global_masks(model, amount)
        if not isinstance(masks, dict) or sorted(masks) != sorted(names):
            raise WrongAnswer(f"04.global: return a dict with one mask per Conv2d/Linear layer ({', '.join(names)}); "
                              f"got {sorted(masks) if isinstance(masks, dict) else type(masks).__name__}")
        engine = pruning.l1_unstructured(copy.deepcopy(model), amount, scope="global", permanent=False)
        layer_wise = pruning.l1_unstructured(copy.deepcopy(model), amount, scope="layer", permanent=False)
        expected = {name: m.weight_mask.bool() for name, m in pruning.prunable_layers(engine)}
        per_layer = {name: m.weight_mask.bool() for name, m in pruning.prunable_layers(layer_wise)}
        yours = {name: torch.as_tensor(mask).bool() for name, mask in masks.items()}
        if any(yours[n].shape != expected[n].shape for n in names):
            raise WrongAnswer("04.global: each mask must have its layer's weight shape")
        if all(torch.equal(yours[n], expected[n]) for n in names):
            continue
        if amount and all(torch.equal(yours[n], per_layer[n]) for n in names):
            raise WrongAnswer("04.global: your masks prune each layer by its own threshold. Hint: put every layer's "
                              "magnitudes into one tensor (torch.cat) and take a single threshold from it")
        kept = sum(int(m.sum()) for m in yours.values()) / sum(m.numel() for m in yours.values())
        raise WrongAnswer(f"04.global: at amount={amount} your masks keep {kept:.1%} of the weights, and not the ones "
                          "torch.nn.utils.prune.global_unstructured keeps. Hint: the k = round(amount x number of "
                          "weights) smallest magnitudes of the whole model go (kthvalue(k) is the largest of them)")
    return ("Your masks equal torch.nn.utils.prune.global_unstructured's (labkit's l1_unstructured(..., "
            "scope='global')) at 0 %, 30 % and 70 %.")


exercises.register(CodeExercise(
    name="04.global",
    task=("Complete global_masks(model, amount) below: return a dict layer name -> bool mask (the weight's shape, "
          "True = keep) for every Conv2d and Linear layer of model (named as model.named_modules() names them), such "
          "that the round(amount x all their weights) smallest-magnitude weights of the whole model are removed, "
          "wherever they are: one threshold for all layers, not one per layer."),
    checker=_check_global_masks,
    reference=global_masks_solution,
))


# --- 05: discriminative learning rates --------------------------------------------------------------------


def param_groups_solution(model, lr, decay):
    """Optimizer parameter groups: ``lr`` for the head, times ``decay`` for each stage further from it."""
    stages = models.named_stages(model)  # stem, ..., head
    groups = []
    for depth, (_name, stage) in enumerate(reversed(stages)):  # the head first: depth 0
        params = [p for p in stage.parameters() if p.requires_grad]  # frozen ones need no group
        if params:
            groups.append({"params": params, "lr": lr * decay**depth})
    return groups


def _check_param_groups(param_groups) -> str:
    torch.manual_seed(0)
    model = freezing.freeze(models.build("small_cnn", 10, pretrained=False)[0], "light")  # the stem is frozen
    lr, decay = 1e-3, 0.5
    groups = param_groups(model, lr, decay)
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) and "params" in g for g in groups):
        raise WrongAnswer("05.param_groups: return a list of dicts, each with 'params' (a list of parameters) and 'lr'")
    expected = {id(p): g["lr"] for g in freezing.discriminative_param_groups(model, lr, decay) for p in g["params"]}
    stage_of = {id(p): name for name, stage in models.named_stages(model) for p in stage.parameters()}
    yours: dict[int, float] = {}
    for group in groups:
        for p in group["params"]:
            if id(p) in yours:
                raise WrongAnswer(f"05.param_groups: a parameter of {stage_of[id(p)]} is in two groups; torch refuses "
                                  "that. Hint: one group per stage")
            yours[id(p)] = group.get("lr", lr)
    missing = sorted({stage_of[i] for i in expected if i not in yours})
    if missing:
        raise WrongAnswer(f"05.param_groups: the trainable parameters of {', '.join(missing)} are in no group, so "
                          "the optimizer would never update them. Hint: one group for every stage of "
                          "labkit.models.named_stages(model) that has trainable parameters")
    for i, want in reversed(list(expected.items())):  # the head first
        got = yours[i]
        if not math.isclose(got, want, rel_tol=1e-6):
            stage = stage_of[i]
            hint = ("the head trains at the full lr and the stem slowest: count the depth from the head"
                    if stage == "head" else "the stage k places below the head gets lr * decay**k")
            raise WrongAnswer(f"05.param_groups: {stage} gets lr {got:.3g}, expected {want:.3g}. Hint: {hint}")
    optimizer = torch.optim.AdamW(groups, lr=lr)  # torch accepts the groups as they are
    rates = sorted({g["lr"] for g in optimizer.param_groups}, reverse=True)
    return (f"Your groups give each stage the learning rate labkit's discriminative_param_groups gives it "
            f"({', '.join(f'{r:.3g}' for r in rates)}, head first), and leave the frozen stem out.")


exercises.register(CodeExercise(
    name="05.param_groups",
    task=("Complete param_groups(model, lr, decay) below: return optimizer parameter groups (a list of dicts with "
          "'params' and 'lr') for discriminative learning rates: the head's trainable parameters at lr, those of the "
          "stage before it at lr * decay, the one before that at lr * decay**2, and so on to the stem, over the "
          "stages of labkit.models.named_stages(model). Frozen parameters (requires_grad False) need no group. "
          "The checker freezes the stem first."),
    checker=_check_param_groups,
    reference=param_groups_solution,
))


# --- 06: per-channel symmetric int8 -----------------------------------------------------------------------


def per_channel_int8_solution(weight):
    """Symmetric int8 per output channel: (integers in -128..127, one scale per row of ``weight``)."""
    w = weight.detach().float()
    rows = w.reshape(w.shape[0], -1)
    scale = rows.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).eps) / 127.5  # torch's symmetric range
    shape = (-1,) + (1,) * (w.dim() - 1)
    q = torch.clamp(torch.round(w / scale.reshape(shape)), -128, 127).to(torch.int8)
    return q, scale


def _check_per_channel(per_channel) -> str:
    torch.manual_seed(0)
    model = models.build("tiny_vit", 10, pretrained=False)[0]
    weights = {"block1.attn.qkv": model.block1.attn.qkv.weight.detach(), "stem.proj": model.stem.proj.weight.detach()}
    weights["block1.mlp.0"] = model.block1.mlp[0].weight.detach() * torch.logspace(-2, 0, 256)[:, None]  # rows differ
    for name, w in weights.items():
        result = per_channel(w.clone())
        if not (isinstance(result, tuple) and len(result) == 2):
            raise WrongAnswer("06.per_channel: return a pair (q, scale): the integers and one scale per output channel")
        q, scale = (torch.as_tensor(t) for t in result)
        if q.shape != w.shape:
            raise WrongAnswer(f"06.per_channel: q must have the weight's shape {tuple(w.shape)}; got {tuple(q.shape)}")
        if scale.numel() == 1 and w.shape[0] > 1:
            raise WrongAnswer("06.per_channel: one scale for the whole tensor is per-tensor quantization. Hint: take "
                              "the largest |w| of each output channel (row 0, row 1, ...): amax over every dim but 0")
        if scale.numel() != w.shape[0]:
            raise WrongAnswer(f"06.per_channel: one scale per output channel ({w.shape[0]} of them) expected; got "
                              f"{scale.numel()}")
        expected_scale, zero = quantization.affine_qparams(w, symmetric=True, dim=0)
        scale = scale.flatten().float()
        if torch.allclose(scale * 127 / 127.5, expected_scale, rtol=1e-5):  # amax / 127 instead of / 127.5
            raise WrongAnswer("06.per_channel: your scale is max|w| / 127; torch's symmetric observers use "
                              "max|w| / 127.5, half the int8 range of 255 steps (so -128 is reachable too)")
        if not torch.allclose(scale, expected_scale, rtol=1e-5):
            raise WrongAnswer(f"06.per_channel: the scales of {name} differ from torch's (first: {float(scale[0]):.4g} "
                              f"against {float(expected_scale[0]):.4g}). Hint: scale = max|w| of the row / 127.5")
        torchs = torch.quantize_per_channel(w.float(), expected_scale, zero, 0, torch.qint8).int_repr()
        differ = (q.to(torch.int64) - torchs.to(torch.int64)).abs()
        # Each channel's largest |w| lands exactly on +-127.5 steps, a rounding tie that dividing (w / scale) and
        # torch's multiplying (w * (1 / scale)) may break differently: one integer per channel may differ by 1.
        if int(differ.max()) > 1 or int((differ > 0).sum()) > w.shape[0] + w.numel() // 1000:
            raise WrongAnswer(f"06.per_channel: {int((differ > 0).sum())} of {name}'s integers differ from "
                              "torch.quantize_per_channel's. Hint: q = clamp(round(w / scale), -128, 127), with the "
                              "scale broadcast along the output channels (reshape it to (-1, 1, ...))")
    return ("Your per-channel int8 equals torch.quantize_per_channel's integers and scales (up to a rare rounding tie) "
            "on three weights: a Linear, a conv and one whose rows differ in range by 100x.")


exercises.register(CodeExercise(
    name="06.per_channel",
    task=("Complete per_channel_int8(weight) below: symmetric int8 quantization with one scale per output channel "
          "(dim 0): return (q, scale), q the integers (weight's shape, in -128..127) and scale a 1-D tensor with one "
          "value per output channel, chosen as torch's symmetric observers choose it, so that your integers are "
          "torch.quantize_per_channel's. It must work for a Linear weight (out, in) and a conv weight "
          "(out, in, kh, kw)."),
    checker=_check_per_channel,
    reference=per_channel_int8_solution,
))


# --- 07: this rank's share of an epoch --------------------------------------------------------------------


def shard_solution(num_samples: int, world_size: int, rank: int, seed: int, epoch: int) -> list[int]:
    """The sample indices ``rank`` trains on in ``epoch``, as DistributedSampler(shuffle, drop_last) gives them."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    used = num_samples // world_size * world_size  # drop_last: every rank gets as many
    return order[rank:used:world_size]


_SHARD_CASES = ((10, 2, 0, 0, 0), (10, 2, 1, 0, 0), (10, 2, 1, 0, 1), (13, 4, 3, 5, 2), (64, 3, 2, 1, 0))


def _check_shard(shard) -> str:
    from_torch = {}
    for n, world, rank, seed, epoch in _SHARD_CASES:
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        sampler.set_epoch(epoch)
        from_torch[(n, world, rank, seed, epoch)] = list(sampler)
    for (n, world, rank, seed, epoch), expected in from_torch.items():
        got = [int(i) for i in shard(n, world, rank, seed, epoch)]
        if got == expected:
            continue
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        block = n // world
        if got == order[rank * block:(rank + 1) * block]:
            raise WrongAnswer("07.shard: you gave each rank a contiguous block; DistributedSampler interleaves: rank r "
                              "takes positions r, r + N, r + 2N, ... of the epoch's permutation")
        if got == shard_solution(n, world, rank, seed, 0) and epoch:
            raise WrongAnswer("07.shard: the same order in every epoch. Hint: the permutation's generator is seeded "
                              "with seed + epoch (what set_epoch changes)")
        if sorted(got) == got:
            raise WrongAnswer("07.shard: your indices are in order; with shuffle=True they come from "
                              "torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))")
        if len(got) != len(expected):
            raise WrongAnswer(f"07.shard: {len(got)} indices for rank {rank} of {world} with {n} samples; expected "
                              f"{len(expected)}: drop_last keeps n // N x N of them, the same number per rank")
        raise WrongAnswer(f"07.shard: for n={n}, world_size={world}, rank={rank}, seed={seed}, epoch={epoch} you gave "
                          f"{got[:6]}..., DistributedSampler gives {expected[:6]}...")
    return ("Your shards equal DistributedSampler's on five cases: interleaved positions of one permutation per "
            "epoch, seeded with seed + epoch, the tail dropped so that every rank gets as many.")


exercises.register(CodeExercise(
    name="07.shard",
    task=("Complete my_shard(num_samples, world_size, rank, seed, epoch) below: the sample indices this rank trains "
          "on in this epoch, as torch's DistributedSampler(shuffle=True, drop_last=True) gives them after "
          "set_epoch(epoch). Every rank draws the same permutation (same seed), so the ranks' shares never overlap."),
    checker=_check_shard,
    reference=shard_solution,
))


# --- 08: LoRA's forward pass -------------------------------------------------------------------------------


def lora_forward_solution(x, weight, bias, lora_A, lora_B, alpha):
    """The LoRA layer's output: the frozen layer plus the scaled low-rank update, as two thin matmuls."""
    rank = lora_A.shape[0]
    return F.linear(x, weight, bias) + (x @ lora_A.T @ lora_B.T) * (alpha / rank)


_LORA_CASES = ((128, 384, 8, 16.0), (64, 64, 1, 8.0), (96, 32, 4, 12.0), (20, 50, 16, 32.0))  # alpha / rank never 1


def _check_lora_forward(forward) -> str:
    for in_features, out_features, rank, alpha in _LORA_CASES:
        torch.manual_seed(in_features + rank)
        layer = lora.LoRALinear(torch.nn.Linear(in_features, out_features), rank, alpha)
        torch.nn.init.normal_(layer.lora_B, std=0.5)  # as after training (a zero B would hide the update)
        x = torch.randn(2, 5, in_features)
        args = (layer.base.weight.detach(), layer.base.bias.detach(), layer.lora_A.detach(), layer.lora_B.detach())
        with torch.no_grad():
            expected = layer(x)
            try:
                got = torch.as_tensor(forward(x.clone(), *[a.clone() for a in args], alpha))
            except NotImplementedError:
                raise  # not attempted yet
            except RuntimeError as error:
                raise WrongAnswer(f"08.lora_forward: {str(error).splitlines()[0]} (in={in_features}, out={out_features}, "
                                  f"rank={rank}). Hint: x @ A.T is (..., rank), then @ B.T is (..., out)") from None
            if got.shape != expected.shape:
                raise WrongAnswer(f"08.lora_forward: output shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
            base = F.linear(x, args[0], args[1])
            update = expected - base
            if torch.allclose(got, base, atol=1e-4):
                raise WrongAnswer("08.lora_forward: your output is the frozen layer's alone; add the update "
                                  "(alpha / rank) * B A x")
            if torch.allclose(got, base + update * rank / alpha, atol=1e-4):
                raise WrongAnswer("08.lora_forward: the update is unscaled; multiply it by alpha / rank "
                                  "(rank = lora_A.shape[0])")
            if rank != 1 and torch.allclose(got, base + update * rank * rank, atol=1e-4):
                raise WrongAnswer("08.lora_forward: the update is scaled by alpha x rank; LoRA scales by alpha / rank")
            if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
                raise WrongAnswer(f"08.lora_forward: for in={in_features}, out={out_features}, rank={rank}, alpha={alpha:g} "
                                  f"your output differs from LoRALinear's by up to {float((got - expected).abs().max()):.3g}")
    return ("Your forward equals labkit's LoRALinear on four shapes and ranks: W x + b + (alpha / rank) B A x, "
            "with the update as two thin matmuls.")


exercises.register(CodeExercise(
    name="08.lora_forward",
    task=("Complete lora_forward(x, weight, bias, lora_A, lora_B, alpha) below: the output of a LoRA layer whose "
          "frozen Linear has weight (out, in) and bias (out,), with lora_A (rank, in) and lora_B (out, rank). "
          "x is (..., in); return (..., out). The update is scaled by alpha / rank."),
    checker=_check_lora_forward,
    reference=lora_forward_solution,
))


# --- 09: the order the measurements suggest -----------------------------------------------------------------


def measured_order_solution(alone):
    """Training stages first, then inference ones; within each, the smallest memory ratio x time ratio first."""
    return sorted(alone, key=lambda name: (alone[name]["inference"],
                                           alone[name]["memory_ratio"] * alone[name]["time_ratio"]))


_ORDER_CASES = (  # stage -> what it did alone on the baseline (ratios to the baseline's peak memory and epoch time)
    {"larger batch": (3.6, 0.9, False), "mixed precision": (0.7, 0.6, False), "checkpointing": (0.8, 1.4, False),
     "8-bit optimizer": (0.9, 1.02, False), "freezing": (0.5, 0.55, False), "quantization": (1.0, 1.0, True)},
    {"quantization": (1.0, 1.0, True), "pruning": (1.0, 0.99, True), "freezing": (0.9, 0.8, False),
     "checkpointing": (0.5, 1.3, False), "larger batch": (1.8, 0.4, False)},
)


def _alone_frame(case: dict):
    """`recipe.measured_order`'s inputs for ``case``: stages and an alone frame with the baseline first."""
    keys = {"larger batch": ("batch_size", 256), "mixed precision": ("precision", "auto"),
            "checkpointing": ("checkpointing", True), "8-bit optimizer": ("optimizer", "adamw8bit"),
            "freezing": ("freeze", "medium"), "quantization": ("quantize", "int8_static"),
            "pruning": ("prune_amount", 0.5)}
    stages = [recipe.Stage(name, {keys[name][0]: keys[name][1]}) for name in case]
    rows = [{"peak_memory_bytes": 1.0, "epoch_time_s": 1.0, "error": None}]
    rows += [{"peak_memory_bytes": m, "epoch_time_s": t, "error": None} for m, t, _ in case.values()]
    return stages, pd.DataFrame(rows)


def _check_measured_order(order) -> str:
    for case in _ORDER_CASES:
        alone = {name: {"memory_ratio": m, "time_ratio": t, "inference": inf} for name, (m, t, inf) in case.items()}
        stages, frame = _alone_frame(case)
        expected = [stage.name for stage in recipe.measured_order(stages, frame)]
        try:
            got = list(order({k: dict(v) for k, v in alone.items()}))
        except NotImplementedError:
            raise
        except (TypeError, KeyError) as error:
            raise WrongAnswer(f"09.measured_order: {type(error).__name__}: {error}. Hint: alone[name] is a dict with "
                              "memory_ratio, time_ratio and inference") from None
        if sorted(got) != sorted(expected):
            raise WrongAnswer(f"09.measured_order: return every stage name once; got {got}")
        descending = sorted(alone, key=lambda n: (alone[n]["inference"], -alone[n]["memory_ratio"] * alone[n]["time_ratio"]))
        if got in (list(reversed(expected)), descending):
            raise WrongAnswer("09.measured_order: reversed: the smallest ratio (the most saved) comes first")
        inference = [name for name in got if alone[name]["inference"]]
        if got[-len(inference):] != inference:
            raise WrongAnswer("09.measured_order: the inference stages (quantization, pruning) act on the trained model "
                              "and go after every training stage")
        if got != expected:
            by_memory = sorted(alone, key=lambda n: (alone[n]["inference"], alone[n]["memory_ratio"]))
            hint = ("you ranked by memory alone; rank by memory ratio x time ratio" if got == by_memory else
                    "rank by memory ratio x time ratio, smallest first")
            raise WrongAnswer(f"09.measured_order: expected {expected}, got {got}: {hint}")
    return ("Your order equals labkit's measured_order on two recipes: training stages by memory x time, the most "
            "saved first, then the inference stages.")


exercises.register(CodeExercise(
    name="09.measured_order",
    task=("Complete measured_order(alone): alone maps each stage's name to what it did alone on the baseline, a dict "
          "with memory_ratio and time_ratio (new / baseline peak memory and epoch time) and inference (True for a "
          "stage that acts on the trained model: quantization, pruning). Return the stage names in the order to "
          "stack them: every training stage before the inference ones; within each group, the one that saved the "
          "most (the smallest memory_ratio x time_ratio) first."),
    checker=_check_measured_order,
    reference=measured_order_solution,
))

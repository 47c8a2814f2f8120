"""The code exercises: each reference solution passes, an untouched skeleton is "not attempted", and the
usual mistakes fail with a hint that names them."""

import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from labkit.exercises import WrongAnswer
from labkit.labs.catalog import all_exercises
from labkit.labs.recipe.exercises import measured_order_solution
from labkit.labs.start_here.exercises import time_steps_solution

exercises = all_exercises()  # every notebook's, by name
check = exercises.check

CODE = ["00.timer", "01.amp_step", "02.accumulate", "03.checkpoint", "04.global", "05.param_groups", "06.per_channel",
        "07.shard", "08.lora_forward", "09.measured_order"]


@pytest.mark.parametrize("name", CODE)
def test_the_reference_solution_passes(name, capsys):
    message = check(name, exercises.get(name).reference)
    assert message.startswith(f"{name}: correct!")
    assert str(message) in capsys.readouterr().out


@pytest.mark.parametrize("name", CODE)
def test_an_untouched_skeleton_is_not_attempted(name):
    def skeleton(*args, **kwargs):
        raise NotImplementedError  # YOUR CODE

    assert check(name, skeleton).startswith(f"{name}: not attempted yet. Replace the `raise NotImplementedError`")


def _timer(sync_after_warmup: bool, sync_each_step: bool):
    def time_steps(step, sync, warmup=3, repeats=10):
        for _ in range(warmup):
            step()
        if sync_after_warmup:
            sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            if sync_each_step:
                sync()
            times.append(time.perf_counter() - start)
        return times

    return time_steps


@pytest.mark.parametrize("sync_after_warmup, sync_each_step, hint", [
    (True, False, "the clock was read before the queued work finished"),
    (False, False, "the clock was read before the queued work finished"),
    (False, True, "the warm-up's queued work landed in it"),
])
def test_timer_mistakes_are_named(sync_after_warmup, sync_each_step, hint):
    with pytest.raises(WrongAnswer, match=hint):
        check("00.timer", _timer(sync_after_warmup, sync_each_step))
    check("00.timer", _timer(True, True))  # both: right


def test_a_right_timer_passes_on_a_busy_machine():
    """A stall inside a timed step (another process took the core) is no mistake of the timer's."""

    def stalled(step, sync, warmup=3, repeats=10):
        for _ in range(warmup):
            step()
        sync()
        times = []
        for i in range(repeats):
            start = time.perf_counter()
            step()
            sync()
            if i == 2:
                time.sleep(0.09)  # longer than 0.6 x a warm-up step, the old check's threshold
            times.append(time.perf_counter() - start)
        return times

    assert "warm-up excluded" in check("00.timer", stalled)


def test_a_timer_that_times_the_warm_up_is_caught():
    def times_everything(step, sync, warmup=3, repeats=10):
        return time_steps_solution(step, sync, warmup=0, repeats=warmup + repeats)

    with pytest.raises(WrongAnswer, match="11 times returned for repeats=8"):
        check("00.timer", times_everything)


def _amp_step(unscale=True, update=True, via_scaler=True):
    def step(model, images, labels, optimizer, scaler, dtype, max_norm=1.0):
        with torch.autocast(images.device.type, dtype=dtype):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        if unscale:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer) if via_scaler else optimizer.step()
        if update:
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step


@pytest.mark.parametrize("mistake, hint", [
    (dict(unscale=False),
     r"in fp16, the gradients the optimizer got differ .* call scaler.unscale_\(optimizer\) before clipping"),
    (dict(update=False), r"your function raised RuntimeError: unscale_\(\) is being called after step\(\)"),
    (dict(via_scaler=False), r"your step still stepped the optimizer.*scaler.step\(optimizer\)"),
])
def test_amp_step_mistakes_are_named(mistake, hint):
    with pytest.raises(WrongAnswer, match=hint):
        check("01.amp_step", _amp_step(**mistake))


def test_accumulation_divided_by_k_fails_for_unequal_micro_batches():
    def divide_by_k(model, micro_batches):
        for images, labels in micro_batches:
            (F.cross_entropy(model(images), labels) / len(micro_batches)).backward()

    with pytest.raises(WrongAnswer, match=r"micro-batches of \(5, 11, 16\) samples .* weight each micro-batch's mean "
                                          r"loss by its share of the samples"):
        check("02.accumulate", divide_by_k)


def test_accumulation_that_forgets_to_divide_fails_already_for_equal_ones():
    def summed(model, micro_batches):
        for images, labels in micro_batches:
            F.cross_entropy(model(images), labels).backward()

    with pytest.raises(WrongAnswer, match=r"micro-batches of \(8, 8, 8, 8\) samples"):
        check("02.accumulate", summed)


def test_a_forward_that_does_not_checkpoint_is_caught():
    with pytest.raises(WrongAnswer, match="nothing was checkpointed"):
        check("03.checkpoint", lambda blocks, x: blocks(x))


def test_a_forward_that_drops_a_block_is_caught():
    def skips_one(blocks, x):
        for block in list(blocks)[:-1]:
            x = checkpoint(block, x, use_reentrant=False)
        return x

    with pytest.raises(WrongAnswer, match="output differs from blocks"):
        check("03.checkpoint", skips_one)


def test_layer_wise_masks_are_caught_as_not_global():
    def layer_wise(model, amount):
        masks = {}
        for name, m in model.named_modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                w, k = m.weight.detach().abs(), round(amount * m.weight.numel())
                masks[name] = w > w.flatten().kthvalue(k).values if k else torch.ones_like(w, dtype=torch.bool)
        return masks

    with pytest.raises(WrongAnswer, match="each layer by its own threshold"):
        check("04.global", layer_wise)


def test_an_off_by_one_threshold_is_caught():
    def keeps_the_kth(model, amount):
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        scores = torch.cat([m.weight.detach().abs().flatten() for _, m in layers])
        k = max(1, round(amount * scores.numel()))
        threshold = scores.kthvalue(k).values
        return {n: m.weight.detach().abs() >= threshold for n, m in layers}  # keeps the k-th smallest too

    with pytest.raises(WrongAnswer, match="smallest magnitudes of the whole model go"):
        check("04.global", keeps_the_kth)
    with pytest.raises(WrongAnswer, match="one mask per Conv2d/Linear layer"):
        check("04.global", lambda model, amount: {"stem.0": torch.ones(1)})


def _groups(order="head_first", power_offset=0, skip=(), same_lr=False):
    from labkit.models import named_stages

    def param_groups(model, lr, decay):
        stages = list(named_stages(model))
        stages = stages[::-1] if order == "head_first" else stages
        groups = []
        for depth, (name, stage) in enumerate(stages):
            params = [p for p in stage.parameters() if p.requires_grad]
            if params and name not in skip:
                groups.append({"params": params, "lr": lr if same_lr else lr * decay ** (depth + power_offset)})
        return groups

    return param_groups


@pytest.mark.parametrize("mistake, hint", [
    (_groups(order="stem_first"), "head gets lr 6.25e-05, expected 0.001. Hint: the head trains at the full lr"),
    (_groups(power_offset=1), "head gets lr 0.0005, expected 0.001"),
    (_groups(skip=("head",)), "the trainable parameters of head are in no group"),
    (_groups(same_lr=True), "block3 gets lr 0.001, expected 0.0005. Hint: the stage k places below the head gets "
                            "lr \\* decay\\*\\*k"),
])
def test_param_group_mistakes_are_named(mistake, hint):
    with pytest.raises(WrongAnswer, match=hint):
        check("05.param_groups", mistake)


def test_a_parameter_in_two_groups_is_caught():
    def twice(model, lr, decay):
        params = [p for p in model.parameters() if p.requires_grad]
        return [{"params": params, "lr": lr}, {"params": params[:1], "lr": lr}]

    with pytest.raises(WrongAnswer, match="is in two groups"):
        check("05.param_groups", twice)
    with pytest.raises(WrongAnswer, match="return a list of dicts, each with 'params'"):
        check("05.param_groups", lambda model, lr, decay: model.parameters())


def _per_channel(divisor=127.5, per_tensor=False, reshape=True):
    def per_channel_int8(weight):
        w = weight.detach().float()
        amax = w.abs().amax() if per_tensor else w.reshape(w.shape[0], -1).abs().amax(dim=1)
        scale = amax / divisor
        shaped = scale.reshape((-1,) + (1,) * (w.dim() - 1)) if reshape and not per_tensor else scale
        return torch.clamp(torch.round(w / shaped), -128, 127).to(torch.int8), scale.reshape(-1)

    return per_channel_int8


@pytest.mark.parametrize("mistake, hint", [
    (_per_channel(divisor=127), r"your scale is max\|w\| / 127; torch's symmetric observers use max\|w\| / 127.5"),
    (_per_channel(per_tensor=True), "one scale for the whole tensor is per-tensor quantization"),
    (lambda w: (w, ), r"return a pair \(q, scale\)"),
    (lambda w: (w[:1], torch.ones(w.shape[0])), "q must have the weight's shape"),
])
def test_per_channel_mistakes_are_named(mistake, hint):
    with pytest.raises(WrongAnswer, match=hint):
        check("06.per_channel", mistake)


def _shard(contiguous=False, fixed_epoch=False, no_shuffle=False):
    def my_shard(n, world, rank, seed, epoch):
        if no_shuffle:
            return list(range(rank, n // world * world, world))
        generator = torch.Generator().manual_seed(seed + (0 if fixed_epoch else epoch))
        order = torch.randperm(n, generator=generator).tolist()
        if contiguous:
            block = n // world
            return order[rank * block:(rank + 1) * block]
        return order[rank:n // world * world:world]

    return my_shard


@pytest.mark.parametrize("mistake, hint", [
    (_shard(contiguous=True), "a contiguous block; DistributedSampler interleaves"),
    (_shard(fixed_epoch=True), "the same order in every epoch"),
    (_shard(no_shuffle=True), "your indices are in order"),
])
def test_shard_mistakes_are_named(mistake, hint):
    with pytest.raises(WrongAnswer, match=hint):
        check("07.shard", mistake)


@pytest.mark.parametrize("mistake, hint", [
    (lambda x, w, b, A, B, alpha: torch.nn.functional.linear(x, w, b), "the frozen layer's alone"),
    (lambda x, w, b, A, B, alpha: torch.nn.functional.linear(x, w, b) + x @ A.T @ B.T, "the update is unscaled"),
    (lambda x, w, b, A, B, alpha: torch.nn.functional.linear(x, w, b) + x @ A.T @ B.T * alpha * A.shape[0],
     "scaled by alpha x rank"),
    (lambda x, w, b, A, B, alpha: torch.nn.functional.linear(x, w, b) + x @ A @ B, r"x @ A.T is \(..., rank\)"),
])
def test_lora_forward_mistakes_are_named(mistake, hint):
    with pytest.raises(WrongAnswer, match=hint):
        check("08.lora_forward", mistake)


def _by(key):
    return lambda alone: sorted(alone, key=key(alone))


@pytest.mark.parametrize("mistake, hint", [
    (_by(lambda a: lambda n: (a[n]["inference"], -a[n]["memory_ratio"] * a[n]["time_ratio"])), "the most saved"),
    (lambda alone: list(reversed(measured_order_solution(alone))), "reversed"),
    (_by(lambda a: lambda n: a[n]["memory_ratio"] * a[n]["time_ratio"]), "go after every training stage"),
    (_by(lambda a: lambda n: (a[n]["inference"], a[n]["memory_ratio"])), "ranked by memory alone"),
    (lambda alone: list(alone)[:-1], "every stage name once"),
    (lambda alone: sorted(alone, key=lambda n: alone[n]["memory"]), "KeyError"),
])
def test_measured_order_mistakes_are_named(mistake, hint):
    with pytest.raises(WrongAnswer, match=hint):
        check("09.measured_order", mistake)

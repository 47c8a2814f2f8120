import contextlib
import dataclasses
import json
import threading

import pytest
import torch

import labkit
from labkit import train
from labkit.errors import ConfigError, NonFiniteLossError
from labkit.kinds import vision
from labkit.result import MEMORY_CATEGORIES


def test_fit_measures_everything(tiny_cfg):
    res = labkit.fit(tiny_cfg)
    prof = labkit.profile()
    untimed = prof.warmup_steps + train.PROFILING_STEPS
    assert res.ok and res.steps == 6 and len(res.losses) == 6
    assert res.timed_steps == 6 - untimed == len(res.step_times_s)
    assert res.step_time_s > 0 and res.step_time_p10_s <= res.step_time_s <= res.step_time_p90_s
    assert res.throughput == pytest.approx(tiny_cfg.batch_size / res.step_time_s)
    assert set(res.memory) == set(MEMORY_CATEGORIES) and res.memory["activations"] > 0
    assert res.memory["parameters"] == sum(p.numel() * 4 for p in res.model.parameters()) + sum(
        b.numel() * b.element_size() for b in res.model.buffers())
    assert res.peak_memory_bytes == sum(res.memory_at_peak.values()) and res.reserved_memory_bytes is None
    assert res.flops_per_step > 0 and res.achieved_flops == pytest.approx(res.flops_per_step / res.step_time_s)
    assert res.peak_flops is None and res.mfu is None  # CPU: no datasheet peak
    assert 0.0 <= res.accuracy <= 1.0
    assert res.num_params == res.num_trainable_params > 0 and res.model_size_bytes > 4 * res.num_params
    assert res.precision_used == "fp32" and res.tf32 is False and res.env["device"] == "cpu"
    payload = json.loads(json.dumps(res.to_dict()))
    assert labkit.RunResult.from_dict(payload).to_dict() == res.to_dict()


class _ThreadedDataParallel(torch.nn.DataParallel):
    """DataParallel as it runs on two GPUs, on the CPU: the replica's forward in another thread."""

    def __init__(self, module):
        super().__init__(module, device_ids=[])

    def forward(self, *inputs):
        out = {}
        thread = threading.Thread(target=lambda: out.update(y=self.module(*inputs)))
        thread.start()
        thread.join()
        return out["y"]


def test_flops_are_counted_under_data_parallel_threads(tiny_cfg):
    """torch's FLOP counter sees only its own thread; DataParallel's replicas run in others."""
    cfg = tiny_cfg.replace(evaluate=False)
    plain = labkit.fit(cfg)
    torch.manual_seed(cfg.seed)
    model = labkit.models.build(cfg.model, train.run_splits(cfg)["train"].num_classes)[0]
    threaded = labkit.fit(cfg, model=_ThreadedDataParallel(model))
    assert threaded.flops_per_step == plain.flops_per_step > 0


def test_flops_per_step_scale_with_batch(tiny_cfg):
    small = labkit.fit(tiny_cfg.replace(evaluate=False))
    large = labkit.fit(tiny_cfg.replace(batch_size=64, evaluate=False))
    assert large.flops_per_step == 2 * small.flops_per_step


def test_loss_falls_and_accuracy_beats_chance(tiny_cfg):
    res = labkit.fit(tiny_cfg.replace(max_steps=40, train_size=512, lr=2e-3))
    first, last = sum(res.losses[:5]) / 5, sum(res.losses[-5:]) / 5
    assert last < 0.8 * first
    assert res.accuracy > 0.2  # chance is 0.1


def test_fit_is_deterministic_for_a_seed(tiny_cfg):
    a, b = labkit.fit(tiny_cfg), labkit.fit(tiny_cfg)
    c = labkit.fit(tiny_cfg.replace(seed=1))
    assert a.losses == b.losses and a.losses != c.losses


def test_bf16_and_grad_accum_and_clip_run(tiny_cfg):
    # batch 8: bf16 is emulated on most CPUs, a step of batch 32 takes seconds there
    res = labkit.fit(tiny_cfg.replace(precision="bf16", batch_size=8, grad_accum=2, grad_clip=1.0, evaluate=False))
    assert res.precision_used == "bf16" and all(torch.isfinite(torch.tensor(res.losses)))


def test_non_finite_loss_stops_and_names_the_step(tiny_cfg, monkeypatch):
    real = vision.F.cross_entropy
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setattr(vision.F, "cross_entropy", poisoned)
    with pytest.raises(NonFiniteLossError, match=r"the loss became nan at step 5 .*lower the learning rate"):
        labkit.fit(tiny_cfg)


def test_too_few_steps_for_timing(tiny_cfg):
    untimed = labkit.profile().warmup_steps + train.PROFILING_STEPS
    with pytest.raises(ConfigError, match=rf"max_steps={untimed} is not allowed: enough for more than {untimed}"):
        labkit.fit(tiny_cfg.replace(max_steps=untimed))


def test_batch_larger_than_dataset(tiny_cfg):
    with pytest.raises(ConfigError, match=r"batch_size=256 is not allowed: at most train_size=128"):
        labkit.fit(tiny_cfg.replace(batch_size=256))


def test_run_splits_follow_the_config_and_the_profile(tiny_cfg):
    prof = labkit.profile()
    splits = train.run_splits(tiny_cfg)
    assert [len(splits[k]) for k in ("train", "val", "test")] == [128, prof.val_size, prof.test_size]
    assert train.run_splits(tiny_cfg) is splits  # loaded once per session and size
    too_big = tiny_cfg.replace(batch_size=256)
    with pytest.raises(ConfigError, match=r"batch_size=256 is not allowed: at most train_size=128"):
        train.run_splits(too_big)
    assert len(train.run_splits(too_big, training=False)["test"]) == prof.test_size  # inference needs no batch of it


def test_on_step_callback_and_epochs(tiny_cfg):
    seen = []
    res = labkit.fit(tiny_cfg.replace(max_steps=None, epochs=2), on_step=lambda s, n: seen.append((s, n)))
    per_epoch = 128 // 32
    assert res.steps == 2 * per_epoch and seen[-1] == (2 * per_epoch, 2 * per_epoch) and len(seen) == res.steps


def test_fp16_runs_with_an_enabled_grad_scaler(tiny_cfg):
    trainer = train.Trainer(tiny_cfg.replace(precision="fp16", batch_size=8))  # fp16 is emulated on most CPUs
    assert trainer.scaler.is_enabled()
    res = trainer.run(progress=False)
    assert res.precision_used == "fp16" and all(torch.isfinite(torch.tensor(res.losses)))


def test_grad_clip_limits_the_update():
    """With plain SGD a clipped step moves each weight by at most lr * max_norm."""
    cfg = labkit.RunConfig(optimizer="sgd", momentum=0.0, lr=0.1, batch_size=32, max_steps=4, train_size=128,
                           evaluate=False)
    torch.manual_seed(cfg.seed)
    start = {k: v.clone() for k, v in train.models.build("small_cnn", 10)[0].state_dict().items()}

    def largest_change(res):
        end = res.model.state_dict()
        return max((end[k].float() - start[k].float()).abs().max().item() for k in start
                   if k.endswith("weight") and not k.startswith("head"))

    clipped = labkit.fit(cfg.replace(grad_clip=1e-6))
    free = labkit.fit(cfg)
    assert largest_change(clipped) <= 4 * 0.1 * 1e-6 * 1.01
    assert largest_change(free) > 1e-3


def test_tf32_setting_is_recorded_in_the_run(tiny_cfg):
    on = labkit.fit(tiny_cfg.replace(tf32=True, evaluate=False))
    off = labkit.fit(tiny_cfg.replace(tf32=False, evaluate=False))
    assert on.env["tf32_matmul"] is True and on.env["tf32_conv"] is True and on.tf32 is True
    assert off.env["tf32_matmul"] is False and off.env["tf32_conv"] is False


def test_single_sample_micro_batch_with_batchnorm(tiny_cfg):
    with pytest.raises(ConfigError, match=r"batch_size=4 is not allowed: at least 2 samples per micro-batch"):
        labkit.fit(tiny_cfg.replace(batch_size=4, grad_accum=4))


def test_a_cached_result_has_no_model_but_says_so(tiny_cfg):
    assert labkit.RunResult(config=tiny_cfg.to_dict()).model is None


class RecordingDDP(torch.nn.Module):
    """Stands in for DistributedDataParallel: records, per forward and per backward, whether sync was off."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.syncing, self.forwards, self.backwards = inner, True, [], []
        next(inner.parameters()).register_hook(lambda grad: self.backwards.append(self.syncing))

    def forward(self, x):
        self.forwards.append(self.syncing)
        return self.inner(x)

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True


def test_step_skips_gradient_sync_on_all_but_the_last_micro_batch(tiny_cfg):
    trainer = train.Trainer(tiny_cfg.replace(grad_accum=4))
    trainer.model = RecordingDDP(trainer.model)
    images, labels = next(iter(trainer.loader))
    trainer.step(images, labels)
    assert trainer.model.forwards == [False, False, False, True]
    assert trainer.model.backwards == [False, False, False, True]
    trainer.model.forwards.clear()
    trainer.model.backwards.clear()
    trainer.cfg = tiny_cfg  # grad_accum=1: the only micro-batch is the last one and syncs
    trainer.step(images, labels)
    assert trainer.model.forwards == [True] and trainer.model.backwards == [True]


def test_lr_warmup_raises_the_lr_linearly_over_the_first_steps(tiny_cfg):
    trainer = train.Trainer(tiny_cfg.replace(lr=1e-3, lr_warmup_steps=4))
    used = []
    real_step = trainer.optimizer.step

    def step(*args, **kwargs):
        used.append(trainer.optimizer.param_groups[0]["lr"])
        return real_step(*args, **kwargs)

    trainer.optimizer.step = step
    for images, labels in trainer.batches(6):
        trainer.step(images, labels)
    assert used == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    # Without warm-up the lr is untouched; and warm-up changes training itself.
    plain = labkit.fit(tiny_cfg.replace(evaluate=False))
    warm = labkit.fit(tiny_cfg.replace(evaluate=False, lr_warmup_steps=4))
    assert plain.losses[0] == warm.losses[0] and plain.losses[1:] != warm.losses[1:]


def test_lr_warmup_must_be_shorter_than_the_run(tiny_cfg):
    with pytest.raises(ConfigError, match=r"lr_warmup_steps=6 is not allowed: fewer than the run's 6 optimizer steps"):
        labkit.fit(tiny_cfg.replace(lr_warmup_steps=6))


def test_trainer_checkpoints_the_models_blocks_when_asked(tiny_cfg):
    plain = train.Trainer(tiny_cfg)
    assert "forward" not in vars(plain.model)
    checkpointed = train.Trainer(tiny_cfg.replace(checkpointing=2))
    assert checkpointed.model.labkit_checkpoint_segments == [["stem", "block1"], ["block2", "block3"]]
    images, labels = next(iter(plain.loader))
    assert torch.equal(plain.step(images, labels), checkpointed.step(images, labels))


@pytest.fixture
def emulated_limit(monkeypatch):
    """The ci profile with a limit of 4 steps for runs the device can only emulate."""
    monkeypatch.setitem(labkit.env.PROFILES, "ci", dataclasses.replace(labkit.env.PROFILES["ci"], emulated_steps=4))


@pytest.mark.parametrize("steps, epochs", [(8, None), (None, 2)])
def test_an_emulated_run_trains_fewer_steps_and_says_so(tiny_cfg, monkeypatch, capsys, emulated_limit, steps, epochs):
    from labkit.techniques import precision

    monkeypatch.setattr(precision, "cpu_fp16_native", lambda: False)  # an AVX2-only laptop
    cfg = tiny_cfg.replace(precision="fp16", batch_size=8, max_steps=steps, epochs=epochs or 1, evaluate=False)
    res = labkit.fit(cfg, progress=False)
    planned = 8 if steps else 2 * (cfg.train_size // cfg.batch_size)
    assert (res.steps, res.planned_steps, res.timed_steps) == (4, planned, 1)  # 1 warm-up + 2 profiling + 1 timed
    assert len(res.losses) == 4
    assert f"fp16 is emulated here, so this run trained 4 of its {planned} steps" in " ".join(res.warnings)
    assert f"trained 4 of its {planned} steps" in " ".join(capsys.readouterr().out.split())


def test_a_native_precision_is_never_cut(tiny_cfg, monkeypatch, emulated_limit):
    from labkit.techniques import precision

    monkeypatch.setattr(precision, "cpu_bf16_native", lambda: True)
    res = labkit.fit(tiny_cfg.replace(precision="bf16", batch_size=8, max_steps=8, evaluate=False), progress=False)
    assert (res.steps, res.planned_steps) == (8, None)
    res = labkit.fit(tiny_cfg.replace(max_steps=8, evaluate=False), progress=False)  # fp32
    assert (res.steps, res.planned_steps) == (8, None)


def test_fit_trains_a_given_model_in_place(tiny_cfg):
    model = labkit.models.build("small_cnn", 10, pretrained=False)[0]
    before = [p.detach().clone() for p in model.parameters()]
    res = labkit.fit(tiny_cfg, model=model, progress=False)
    assert res.model is model and res.weights == "given"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    other = labkit.models.build("resnet18", 10, pretrained=False)[0]
    with pytest.raises(ConfigError,
                       match=r"model='ResNet' is not allowed: a model built by labkit.models.build\('small_cnn'"):
        labkit.fit(tiny_cfg, model=other)


def test_a_frozen_run_trains_only_the_unfrozen_stages(tiny_cfg):
    trainer = labkit.train.Trainer(tiny_cfg.replace(freeze="heavy"))
    stages = dict(labkit.models.named_stages(trainer.model))
    head_and_block3 = {id(p) for name in ("block3", "head") for p in stages[name].parameters()}
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == head_and_block3  # the optimizer was built after the freeze
    frozen_bn = [m for name in ("stem", "block1", "block2") for m in stages[name].modules()
                 if isinstance(m, torch.nn.BatchNorm2d)]
    before = [bn.running_mean.clone() for bn in frozen_bn]
    res = trainer.run(progress=False)
    assert res.num_trainable_params == sum(p.numel() for name in ("block3", "head") for p in stages[name].parameters())
    assert all(map(labkit.techniques.freezing.is_frozen_batchnorm, frozen_bn)) and stages["block3"][0][1].training
    assert all(torch.equal(bn.running_mean, b) for bn, b in zip(frozen_bn, before, strict=True))
    assert res.memory["gradients"] == 4 * res.num_trainable_params  # fp32: one gradient per trainable parameter


def test_the_steps_the_grad_scaler_skips_are_counted():
    trainer = labkit.train.Trainer(labkit.RunConfig(model="small_cnn", precision="fp16", device="cpu", max_steps=6))
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.scaler.scale(torch.ones(()))  # as the loop's backward does first: the scaler starts its scale
    for p in params:
        p.grad = torch.zeros_like(p)
    params[0].grad[...] = float("inf")  # an fp16 overflow: the scaler skips the step and halves its scale
    trainer.update()
    for p in params:
        p.grad = torch.zeros_like(p)
    trainer.update()
    assert trainer.skipped_steps == 1
    assert labkit.RunResult(config={}).skipped_steps is None  # fp32 runs have no scaler: nothing to skip

"""`fit(cfg) -> RunResult`: the one training loop every notebook uses.

Order of steps in a run: ``warmup_steps`` plain steps (untimed), one step under the FLOP counter,
one step under the memory tracker (both untimed, and real training steps), then the timed steps.
Instruments never run inside a timed step.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import data, measure, models, text
from .config import RunConfig
from .env import Profile, env_report, profile, resolve_device, set_tf32
from .errors import ConfigError, NonFiniteLossError
from .evaluation import evaluate, evaluate_tokens, exports, score_inference
from .messages import note
from .result import RunResult
from .techniques import distributed
from .techniques.accumulation import sync_context
from .techniques.checkpointing import apply_checkpointing
from .techniques.freezing import freeze
from .techniques.lora import add_lora, lora_layers
from .techniques.optimizers import build_optimizer, warmup_lr
from .techniques.precision import autocast, grad_scaler, resolve_precision
from .train_lm import accumulate_tokens, checkpoint_layers, compile_layers, step_flops_extra, text_splits

PROFILING_STEPS = 2  # one FLOP-counting step, one memory-tracking step
CHECK_LOSS_EVERY = 10  # reading the loss synchronises the GPU, so check it every few steps, not every step


@functools.lru_cache(maxsize=4)
def _splits(name: str, train_size: int, val_size: int, test_size: int) -> dict:
    # Data is generated/loaded with a fixed seed so that runs with different seeds see the same data;
    # cfg.seed changes initialisation of new layers and the order of batches.
    return data.load_splits(name, train_size=train_size, val_size=val_size, test_size=test_size, seed=0)


def run_splits(cfg: RunConfig, prof: Profile | None = None, training: bool = True) -> dict:
    """The train/val/test splits a run of ``cfg`` uses, loaded once per session and size.

    ``cfg.train_size`` (else the profile's) training samples and the profile's validation and test sizes.

    Args:
        cfg: the run.
        prof: the profile (default: the active one).
        training: check that one batch of ``cfg`` fits in the training set (False: only the test split is used).

    Example:
        >>> run_splits(cfg)["test"].num_classes
        10
    """
    prof = prof or profile()
    train_size, val_size, test_size = cfg.train_size or prof.train_size, prof.val_size, prof.test_size
    if models.is_language_model(cfg.model):  # pydoc_text's 2,608 paragraphs cap a profile's sizes
        train_size, val_size, test_size = text.split_sizes(cfg.dataset, train_size, val_size, test_size)
        train_size = cfg.train_size or train_size
    if training and cfg.batch_size > train_size:
        raise ConfigError("batch_size", cfg.batch_size, f"at most train_size={train_size} (the training set's size)")
    if models.is_language_model(cfg.model):
        seq_len = text.resolve_seq_len(cfg.dataset, cfg.seq_len)
        hub_model = cfg.model if cfg.model in models.HUB_MODELS and cfg.pretrained else None
        return text_splits(cfg.dataset, train_size, val_size, test_size, seq_len, hub_model)
    return _splits(cfg.dataset, train_size, prof.val_size, prof.test_size)


def emulated_step_limit(prof: Profile) -> int:
    """The most steps a run in an emulated precision trains at ``prof`` (at least one timed step)."""
    return max(prof.emulated_steps, prof.warmup_steps + PROFILING_STEPS + 1)


def total_steps(cfg: RunConfig, steps_per_epoch: int) -> int:
    return cfg.max_steps if cfg.max_steps is not None else cfg.epochs * steps_per_epoch


def _check_losses(values: torch.Tensor, first_step: int, precision: str) -> None:
    """Raise `NonFiniteLossError` at the first non-finite loss in ``values`` (1-based steps from ``first_step``)."""
    if values.numel() == 0:
        return
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0])
        raise NonFiniteLossError(first_step + bad, float(values[bad]), precision)


def _given_weights(model: torch.nn.Module, cfg: RunConfig) -> models.WeightsInfo:
    """Check that a model handed to `Trainer` is the one ``cfg`` names; its weights are "given"."""
    name = getattr(models.unwrap(model), "labkit_name", None)
    if name != cfg.model:
        raise ConfigError("model", type(model).__name__,
                          f"a model built by labkit.models.build({cfg.model!r}, ...) (or a copy of one), since "
                          f"cfg.model={cfg.model!r}; this one is {name!r}")
    return models.WeightsInfo("given")


def prepare_model(model: torch.nn.Module, cfg: RunConfig) -> torch.nn.Module:
    """What ``cfg``'s technique fields do to a model before training: LoRA adapters, checkpointing, freezing.

    A model that already has LoRA layers (e.g. QLoRA's 4-bit base, built by hand) keeps them; ``cfg.lora_rank``
    must then be None or their rank.
    """
    if cfg.lora_rank is not None:
        existing = {layer.rank for layer in lora_layers(model).values()}
        if existing and existing != {cfg.lora_rank}:
            raise ConfigError("lora_rank", cfg.lora_rank,
                              f"None or {sorted(existing)}: the given model already has LoRA layers of that rank")
        if not existing:
            try:
                add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, cfg.lora_dropout)
            except ConfigError as error:  # name the config field the learner set
                raise ConfigError(f"lora_{error.field}", error.value, error.allowed) from None
    if cfg.checkpointing is not False and models.is_language_model(cfg.model):
        checkpoint_layers(model, cfg)  # each decoder layer, by transformers' own method
    elif cfg.checkpointing is not False:
        apply_checkpointing(model, cfg.checkpointing)
    if cfg.freeze not in (None, "none"):
        freeze(model, cfg.freeze)
    return model


class Trainer:
    """Everything one run needs, set up from a `RunConfig`: data, model, optimizer, precision, one step.

    `fit` drives it; experiments that need single steps (`labkit.labs.start_here.timing_demo`,
    `labkit.capacity.step_memory`) reuse its step. Techniques plug in here through config fields.
    """

    def __init__(self, cfg: RunConfig, model: torch.nn.Module | None = None,
                 bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB, strategy: str = "ddp"):
        """Args: cfg: the run. model: train this model instead of building ``cfg.model`` (e.g. a pruned copy,
        for a recovery fine-tune); it must be the architecture ``cfg.model`` names, on any device.
        bucket_cap_mb: DistributedDataParallel's gradient bucket size, in a process group (see below).
        strategy: in a process group, ``ddp`` (every rank holds the whole model) or ``fsdp`` (FSDP2's
            ``fully_shard`` on every block: each rank holds 1/N of the weights, gradients and optimizer state).

        Inside a process group (a torchrun worker, `labkit.worker`) the run is data parallel:
        ``cfg.batch_size`` is the global batch, each of the N ranks takes batch_size / N of it from a
        ``DistributedSampler``, the model is wrapped in DDP, and losses, FLOPs and accuracy are combined
        over the ranks; ``result.distributed`` holds each rank's figures.
        """
        if strategy not in distributed.STRATEGIES:
            raise ConfigError("strategy", strategy, f"one of {list(distributed.STRATEGIES)}")
        self.cfg = cfg
        self.strategy = strategy
        self.profile = profile()
        self.world_size = distributed.world_size()
        self.language = models.is_language_model(cfg.model)
        if self.language and (self.world_size > 1 or distributed.active()):
            raise ConfigError("model", cfg.model, f"a vision model ({models.available()}) in a process group",
                              "language models train in one process until issue 28's next slice")
        self.device = resolve_device(cfg.device)
        if self.world_size > 1 or distributed.active():
            if self.device.type == "cuda":  # one GPU per process
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", distributed.rank())))
            if cfg.batch_size % (self.world_size * cfg.grad_accum):
                raise ConfigError("batch_size", cfg.batch_size,
                                  f"a multiple of world_size x grad_accum = {self.world_size} x {cfg.grad_accum} "
                                  "(the global batch is split evenly over the ranks, then into micro-batches)")
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)  # CUDA events and synchronise act on the current device
        set_tf32(cfg.tf32)  # before the report, so that the recorded TF32 state is this run's
        self.env = env_report(cfg.device)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.warnings: list[str] = []
        if self.precision.warning:
            note(self.precision.warning)
            self.warnings.append(self.precision.warning)
        # Memory already held on the GPU before this run (earlier runs' models, a notebook's tensors, the
        # cuBLAS workspaces every process allocates once) is not this run's: peaks are reported above this
        # baseline. A model handed in already on the GPU is the run's own: its tensors come off the baseline.
        measure.warm_up_libraries(self.device)
        measure.reset_memory(self.device)
        self.baseline_bytes = measure.allocated_now(self.device)
        self.baseline_reserved_bytes = measure.reserved_now(self.device)

        self.splits = run_splits(cfg, self.profile)
        self.train_split = self.splits["train"]

        torch.manual_seed(cfg.seed)
        if model is None:
            model, self.weights = models.build_for_split(cfg.model, self.train_split, cfg.pretrained,
                                                        cfg.attn_implementation)
        else:
            self.weights = _given_weights(model, cfg)
            self.baseline_bytes = max(0, self.baseline_bytes - measure.tensor_bytes(model, self.device))
        self.rank_batch = cfg.batch_size // self.world_size  # samples each rank takes per optimizer step
        micro_batch = self.rank_batch // cfg.grad_accum
        if micro_batch < 2 and models.has_batchnorm(model):
            raise ConfigError("batch_size", cfg.batch_size,
                              f"at least 2 samples per micro-batch (batch_size / (world_size x grad_accum) = "
                              f"{micro_batch}): "
                              f"{cfg.model} has BatchNorm, which needs more than one value per channel")
        if self.weights.warning:
            self.warnings.append(self.weights.warning)
        prepare_model(model, cfg)  # before the optimizer, which takes the parameters left to train
        memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
        self.model = model.to(self.device, memory_format=memory_format)
        compile_warning = compile_layers(self.model, cfg, self.device) if self.language else None
        self.compiled = cfg.compile and compile_warning is None
        if compile_warning:
            self.warnings.append(compile_warning)
        self.sampler = self.allreduce_counter = None
        if distributed.active():
            self._go_data_parallel(bucket_cap_mb)
        self.model.train()
        self.optimizer = build_optimizer(self.model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum,
                                         cfg.optimizer_impl)
        self.scaler = grad_scaler(self.precision, self.device)
        self.optimizer_steps = 0  # steps taken so far; drives the learning-rate warm-up
        self.timed_counts = text.TokenCounts()  # tokens of the timed steps (language models)
        if self.language:  # rows of token ids, padded or packed (`labkit.text.batching`)
            self.loader = text.make_token_loader(self.train_split, self.rank_batch, cfg.packing, shuffle=True,
                                                 seed=cfg.seed, drop_last=True)
            if len(self.loader) == 0:
                raise ConfigError("batch_size", cfg.batch_size, f"at most {len(self.loader.dataset)}, the rows "
                                  f"{cfg.dataset}'s training split makes with packing={cfg.packing!r}")
            return
        self.loader = data.make_loader(self.train_split, batch_size=self.rank_batch, shuffle=True, seed=cfg.seed,
                                       drop_last=True, sampler=self.sampler, pin_memory=self.device.type == "cuda")

    def _go_data_parallel(self, bucket_cap_mb: float) -> None:
        """DDP around the model (or FSDP2 shards), this rank's sampler, a counter of the gradient all-reduces."""
        self.sampler = distributed.sampler(len(self.train_split), seed=self.cfg.seed)
        if self.strategy == "fsdp":
            # Each stage that is a child module of its own (a ResNet's stem is four children, not one) is a
            # shard unit; the root's fully_shard takes the rest.
            children = list(self.model.children())
            blocks = [stage for _, stage in models.named_stages(self.model)[:-1]
                      if any(stage is child for child in children)]
            self.model = distributed.shard(self.model, blocks)
            return
        model, warning = distributed.sync_batchnorm(self.model, self.device)
        if warning and self.world_size > 1:
            self.warnings.append(warning)
            if distributed.is_main():
                note(warning)
        self.model = distributed.wrap(model, self.device, bucket_cap_mb)
        self.allreduce_counter = distributed.AllReduceCounter()
        self.model.register_comm_hook(self.allreduce_counter, distributed.counting_allreduce_hook)

    def step(self, images, labels: torch.Tensor | None = None) -> torch.Tensor:
        """One optimizer step over ``grad_accum`` micro-batches; returns the loss (a detached tensor).

        Takes images and labels, or for a language model one `labkit.text.TokenBatch`. Applies the learning-rate
        warm-up (``cfg.lr_warmup_steps``) and, under DDP, skips the gradient all-reduce on all but the last
        micro-batch (`labkit.techniques.accumulation.sync_context`).
        """
        step_loss = self.accumulate(images, labels)
        self.update()
        return step_loss

    def accumulate(self, images, labels: torch.Tensor | None = None) -> torch.Tensor:
        """The backward passes of one step's ``grad_accum`` micro-batches, gradients summed; returns the loss.

        A language model's micro-batch loss is its summed token loss over the step's total label tokens
        (`labkit.techniques.token_loss`), so the accumulated gradient is the whole batch's.
        """
        cfg, device = self.cfg, self.device
        if self.language:
            return accumulate_tokens(self.model, images, cfg, self.precision, device, self.scaler,
                                     measure.new_micro_batch)
        x = data.to_model_input(images, self.train_split, device, cfg.channels_last, cfg.image_size)
        y = labels.to(device, non_blocking=True)
        step_loss = torch.zeros((), device=device)
        last = cfg.grad_accum - 1
        for index, (micro_x, micro_y) in enumerate(zip(x.chunk(cfg.grad_accum), y.chunk(cfg.grad_accum), strict=True)):
            if index:
                measure.new_micro_batch()
            # Under DDP, gradients are all-reduced in the last micro-batch's backward only. DDP decides
            # whether to sync during the forward pass, so the context covers forward and backward.
            with sync_context(self.model, last_micro_batch=index == last):
                with autocast(self.precision, device):
                    loss = F.cross_entropy(self.model(micro_x), micro_y) / cfg.grad_accum
                self.scaler.scale(loss).backward()
            step_loss += loss.detach().float()
        return step_loss

    def update(self) -> None:
        """The optimizer step on the accumulated gradients (warm-up, clipping, scaler), then zero them."""
        cfg = self.cfg
        warmup_lr(self.optimizer, cfg.lr, self.optimizer_steps, cfg.lr_warmup_steps)
        self.optimizer_steps += 1
        if cfg.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def _record_step(self, losses: torch.Tensor, index: int, batch) -> None:
        losses[index] = self.step(batch) if self.language else self.step(*batch)

    def _count_flops(self, step: Callable[[], None]) -> int:
        """FLOPs of ``step()``. ``nn.DataParallel`` runs its replicas in threads, where torch's FLOP counter (a
        thread-local dispatch mode) sees nothing: that step runs the module it wraps on the whole batch instead,
        the same optimizer step on one device, whose FLOPs are the replicas' together."""
        wrapper = self.model
        if not isinstance(wrapper, torch.nn.DataParallel):
            return measure.count_flops(step)
        self.model = wrapper.module
        try:
            return measure.count_flops(step)
        finally:
            self.model = wrapper

    def batches(self, steps: int):
        """``steps`` training batches, starting a new (reshuffled) epoch when one runs out."""
        count = epoch = 0
        while count < steps:
            if self.sampler is not None:
                self.sampler.set_epoch(epoch)  # else every epoch repeats the first one's order
            epoch += 1
            for batch in self.loader:
                yield batch
                count += 1
                if count == steps:
                    return

    def run(self, on_step: Callable[[int, int], None] | None = None, progress: bool = True) -> RunResult:
        """Train and measure; see `fit`."""
        cfg, device, prof = self.cfg, self.device, self.profile
        steps = planned = total_steps(cfg, len(self.loader))
        untimed = prof.warmup_steps + PROFILING_STEPS
        if self.precision.emulated and steps > emulated_step_limit(prof):
            steps = emulated_step_limit(prof)
            cut = (f"{self.precision.name} is emulated here, so this run trained {steps} of its {planned} steps "
                   f"(the {prof.name} profile's limit for emulated runs, to keep the notebook's time); its step "
                   f"time and memory are measured as usual, its accuracy is after {steps} steps")
            note(cut)
            self.warnings.append(cut)
        if steps <= untimed:
            field = "max_steps" if cfg.max_steps is not None else "epochs"
            raise ConfigError(field, getattr(cfg, field),
                              f"enough for more than {untimed} optimizer steps ({prof.warmup_steps} warm-up + "
                              f"{PROFILING_STEPS} profiling steps are never timed); this gives {steps}")
        if cfg.lr_warmup_steps >= planned:
            raise ConfigError("lr_warmup_steps", cfg.lr_warmup_steps,
                              f"fewer than the run's {planned} optimizer steps",
                              "A warm-up as long as the run never trains at the full lr")
        timer = measure.StepTimer(device)
        progress = progress and distributed.is_main()  # one progress bar per job, rank 0's
        reduces_before = None  # (all-reduces, bytes) counted before the first timed step
        # One buffer for every step's loss, allocated up front: keeping a small tensor alive per step
        # scatters the heap on CPU and measurably slowed the following steps (about 7 % here).
        losses = torch.full((steps,), float("nan"), device=device)
        flops = None
        first_step = measure.StepTimer(device)
        breakdown = measure.MemoryBreakdown(note="not measured")
        bar = tqdm(total=steps, desc=f"{cfg.model} {self.precision.name} bs{cfg.batch_size}",
                   disable=not progress or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true"),
                   leave=False)
        measure.reset_memory(device)
        start_wall = time.perf_counter()
        for index, batch in enumerate(self.batches(steps)):
            record_step = functools.partial(self._record_step, losses, index, batch)
            if index == prof.warmup_steps:
                flops = self._count_flops(record_step)
                if self.language:  # the CPU SDPA kernel's FLOPs, which torch's counter misses
                    flops += step_flops_extra(self.model, batch, device)
            elif index == prof.warmup_steps + 1:
                breakdown = measure.track_step_memory(record_step, self.model, self.optimizer, device)
                measure.reset_peak(device)  # CUDA peak statistics cover the timed steps only
            elif index >= untimed:
                if reduces_before is None and self.allreduce_counter is not None:
                    reduces_before = (self.allreduce_counter.calls, self.allreduce_counter.bytes)
                timer.start()
                record_step()
                timer.stop()
                if self.language:
                    self.timed_counts += batch.counts()
            elif index == 0 and self.compiled:  # the step that compiles: timed apart, never a timed step
                first_step.start()
                record_step()
                first_step.stop()
            else:
                record_step()
            done = index + 1
            if done % CHECK_LOSS_EVERY == 0 or done == steps:
                first = (done - 1) // CHECK_LOSS_EVERY * CHECK_LOSS_EVERY
                _check_losses(losses[first:done], first + 1, self.precision.name)
            bar.update(1)
            if on_step is not None:
                on_step(done, steps)
        measure.synchronize(device)
        train_time_s = time.perf_counter() - start_wall
        bar.close()
        if distributed.active():  # the job's loss per step (the mean over the ranks' shares) and its FLOPs
            losses = distributed.all_reduce_mean(losses)
            if flops is not None:
                flops = int(distributed.all_reduce_sum(torch.tensor(flops, dtype=torch.float64, device=device)))
        result = self._result(steps, timer.times_s(), losses.cpu().tolist(), flops, breakdown, train_time_s)
        if self.compiled:  # the first step's time above a typical step's: what compiling cost
            result.compile_time_s = max(0.0, first_step.times_s()[0] - result.step_time_s)
        result.planned_steps = planned if planned != steps else None
        if distributed.active():
            result.distributed = self._rank_figures(result, reduces_before, len(timer.times_s()))
        return result

    def _rank_figures(self, result: RunResult, reduces_before: tuple[int, int] | None, timed_steps: int) -> dict:
        """The job's figures and each rank's own, gathered on every rank. All-reduces and their bytes are counted
        over the timed steps only: DDP's first steps use other buckets (it rebuilds them after the first one)."""
        counter = self.allreduce_counter
        timed = counter is not None and reduces_before is not None
        reduces = (counter.calls - reduces_before[0]) / timed_steps if timed else None
        reduced_bytes = (counter.bytes - reduces_before[1]) / timed_steps if timed else None
        mine = {"rank": distributed.rank(), "step_time_s": result.step_time_s, "train_time_s": result.train_time_s,
                "peak_memory_bytes": result.peak_memory_bytes, "weights_sha256": distributed.weights_sha256(
                    models.unwrap(self.model)), "allreduces_per_step": reduces,
                **{f"{part}_sha256": distributed.weights_sha256(models.unwrap(self.model), part)
                   for part in ("parameters", "buffers")},
                "samples_per_step": self.rank_batch, "device": str(self.device),
                "parameter_bytes": sum(distributed.local_numel(p) * p.element_size() for p in self.model.parameters()),
                "optimizer_state_bytes": sum(distributed.local_numel(t) * t.element_size()
                                             for state in self.optimizer.state.values() for t in state.values()
                                             if torch.is_tensor(t) and t.dim() > 0)}
        ranks = distributed.all_gather(mine)
        ddp = self.model
        return {"world_size": self.world_size, "backend": torch.distributed.get_backend(), "strategy": self.strategy,
                "weights_sha256": [r["weights_sha256"] for r in ranks], "ranks": ranks,
                "bucket_cap_mb": ddp.bucket_bytes_cap / 2**20 if hasattr(ddp, "bucket_bytes_cap") else None,
                "allreduce_bytes_per_step": reduced_bytes,
                "samples_per_rank": self.rank_batch}

    def _result(self, steps, times, losses, flops, breakdown, train_time_s) -> RunResult:
        cfg, device = self.cfg, self.device
        median, p10, p90 = measure.spread(times)
        if device.type == "cuda":
            peak, reserved = measure.cuda_peak_memory(device)
            peak, reserved = max(0, peak - self.baseline_bytes), max(0, reserved - self.baseline_reserved_bytes)
        else:
            peak, reserved = breakdown.total_peak_bytes, None
        if not cfg.evaluate:
            accuracy = None
        elif self.language:
            accuracy = evaluate_tokens(self.model, self.splits["test"], device, self.precision)
        else:
            accuracy = evaluate(self.model, self.splits["test"], cfg, device, self.precision,
                                shard=self.strategy == "ddp")
        num_params, num_trainable = measure.count_parameters(self.model)
        achieved = flops / median if flops and median > 0 else None
        peak_flops = measure.peak_flops(self.env.get("gpu"), self.precision.name, cfg.tf32)
        if peak_flops is not None:
            peak_flops *= self.world_size  # the FLOPs are the whole job's, on world_size devices
        result = RunResult(
            config=cfg.to_dict(), env=dict(self.env), precision_used=self.precision.name, tf32=cfg.tf32,
            steps=steps, timed_steps=len(times), step_time_s=median, step_time_p10_s=p10, step_time_p90_s=p90,
            step_times_s=times, throughput=cfg.batch_size / median if median > 0 else math.nan,
            train_time_s=train_time_s, peak_memory_bytes=peak, reserved_memory_bytes=reserved,
            memory=breakdown.peak_by_category, memory_at_peak=breakdown.at_peak, memory_note=breakdown.note,
            accuracy=accuracy, losses=losses,
            flops_per_step=flops, achieved_flops=achieved, peak_flops=peak_flops,
            mfu=achieved / peak_flops if achieved and peak_flops else None,
            model_size_bytes=measure.model_size_bytes(models.unwrap(self.model)), num_params=num_params,
            num_trainable_params=num_trainable, weights=self.weights.source, warnings=list(self.warnings),
        )
        if self.language and times:  # tokens over the timed steps' time: pad shares vary from batch to batch
            counts = self.timed_counts
            result.tokens_per_s, result.real_tokens_per_s = counts.tokens / sum(times), counts.real_tokens / sum(times)
            result.pad_fraction = counts.pad_fraction
        result.model = models.unwrap(self.model)
        if exports(cfg) and distributed.is_main():
            result.inference = score_inference(result.model, cfg, self.splits)
        return result


def fit(cfg: RunConfig, on_step: Callable[[int, int], None] | None = None, progress: bool = True,
        model: torch.nn.Module | None = None) -> RunResult:
    """Train ``cfg.model`` on ``cfg.dataset`` as ``cfg`` says and measure it.

    Args:
        cfg: the run.
        on_step: called as ``on_step(step, total_steps)`` after each optimizer step (e.g. a widget bar).
        progress: show a tqdm progress bar (``TQDM_DISABLE=1`` hides it too).
        model: train this model instead of building ``cfg.model`` (see `Trainer`); it is trained in place.

    Returns:
        A `RunResult`; the trained model is attached as ``result.model`` (not serialised).

    Example:
        >>> res = labkit.fit(labkit.RunConfig(model="small_cnn", max_steps=50))
        >>> res.step_time_s, res.peak_memory_bytes, res.accuracy
    """
    return Trainer(cfg, model=model).run(on_step=on_step, progress=progress)

"""`fit(cfg) -> RunResult`: the one training loop every notebook uses.

The loop knows batches, not model families: a kind (`labkit.kinds`) sets the run up and answers its questions about
a batch (to a device, micro-batches, the summed loss and the count it divides by), so an image step and a token step
are the same code. A run follows a per-step plan (`step_plan`): ``warmup_steps`` plain steps (untimed), one step under
the FLOP counter, one under the memory tracker (both untimed, and real training steps), then the timed steps.
Instruments never run inside a timed step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from . import measure, models, text
from .config import RunConfig
from .env import Profile, env_report, profile, resolve_device, set_tf32
from .errors import ConfigError, NonFiniteLossError
from .evaluation import exports, score_inference
from .kinds import Batch, given_weights, kind_for, prepare_model
from .messages import note
from .result import RunResult
from .runsetup import build_model, run_splits
from .techniques import distributed
from .techniques.accumulation import sync_context
from .techniques.optimizers import build_optimizer, warmup_lr
from .techniques.precision import autocast, grad_scaler, resolve_precision

PROFILING_STEPS = 2  # one FLOP-counting step, one memory-tracking step
CHECK_LOSS_EVERY = 10  # reading the loss synchronises the GPU, so check it every few steps, not every step
# The phases of a run's steps (`step_plan`), each carried out by the Trainer method of the same name.
WARMUP, COMPILE, FLOPS, MEMORY, TIMED = "warmup", "compile", "flops", "memory", "timed"


def emulated_step_limit(prof: Profile) -> int:
    """The most steps a run in an emulated precision trains at ``prof`` (at least one timed step)."""
    return max(prof.emulated_steps, prof.warmup_steps + PROFILING_STEPS + 1)


def total_steps(cfg: RunConfig, steps_per_epoch: int) -> int:
    return cfg.max_steps if cfg.max_steps is not None else cfg.epochs * steps_per_epoch


def step_plan(steps: int, warmup_steps: int, compiled: bool = False) -> list[str]:
    """What each of a run's ``steps`` optimizer steps does: `WARMUP` (untimed), `FLOPS` and `MEMORY` (profiled,
    untimed), then `TIMED`; a compiled run's first warm-up step is `COMPILE` (timed apart, never a timed step).

    Example:
        >>> step_plan(6, warmup_steps=2, compiled=True)
        ['compile', 'warmup', 'flops', 'memory', 'timed', 'timed']
    """
    plan = [WARMUP] * warmup_steps + [FLOPS, MEMORY] + [TIMED] * (steps - warmup_steps - PROFILING_STEPS)
    if compiled and plan[0] == WARMUP:
        plan[0] = COMPILE
    return plan[:steps]


def _check_losses(values: torch.Tensor, first_step: int, precision: str) -> None:
    """Raise `NonFiniteLossError` at the first non-finite loss in ``values`` (1-based steps from ``first_step``)."""
    if values.numel() == 0:
        return
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0])
        raise NonFiniteLossError(first_step + bad, float(values[bad]), precision)


def _data_report(split) -> dict | None:
    """What was done to a learner's own data (`labkit.text.own_data.OwnDataReport`), None for labkit's datasets."""
    report = getattr(split, "report", None)
    return None if report is None else report.to_dict()


def _check_group_options(strategy: str, token_mean: str) -> None:
    if strategy not in distributed.STRATEGIES:
        raise ConfigError("strategy", strategy, f"one of {list(distributed.STRATEGIES)}")
    if token_mean not in distributed.TOKEN_MEANS:
        raise ConfigError("token_mean", token_mean, f"one of {list(distributed.TOKEN_MEANS)}")


@dataclass
class _Measures:
    """What a run's instruments collect over its steps."""

    timer: measure.StepTimer
    first_step: measure.StepTimer
    flops: int | None = None
    breakdown: measure.MemoryBreakdown = field(default_factory=lambda: measure.MemoryBreakdown(note="not measured"))
    reduces_before: tuple[int, int] | None = None  # (all-reduces, bytes) counted before the first timed step
    counts: text.TokenCounts = field(default_factory=text.TokenCounts)  # tokens of the timed steps


class Trainer:
    """Everything one run needs, set up from a `RunConfig`: data, model, optimizer, precision, one step.

    `fit` drives it; experiments that need single steps (`labkit.labs.start_here.timing_demo`,
    `labkit.capacity.step_memory`) reuse its step. Techniques plug in here through config fields.
    """

    def __init__(self, cfg: RunConfig, model: torch.nn.Module | None = None,
                 bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB, strategy: str = "ddp", data=None,
                 tokenizer=None, token_mean: str = "global"):
        """Args: cfg: the run. model: train this model instead of building ``cfg.model`` (e.g. a pruned copy,
        for a recovery fine-tune); it must be the architecture ``cfg.model`` names, on any device. data, tokenizer:
        a learner's own records (``dataset="given"``) and their model's tokenizer (see `fit`).
        bucket_cap_mb: DistributedDataParallel's gradient bucket size, in a process group (see below).
        strategy: in a process group, ``ddp`` (every rank holds the whole model) or ``fsdp`` (FSDP2's
            ``fully_shard`` on every block: each rank holds 1/N of the weights, gradients and optimizer state).
        token_mean: a language model's loss in a process group: the ``global`` batch's token mean, or each
            ``rank``'s own (the pitfall; see `loss_divisor`).

        Inside a process group (a torchrun worker, `labkit.worker`) the run is data parallel:
        ``cfg.batch_size`` is the global batch, each of the N ranks takes batch_size / N of it from a
        ``DistributedSampler``, the model is wrapped in DDP, and losses, FLOPs and accuracy are combined
        over the ranks; ``result.distributed`` holds each rank's figures.
        """
        _check_group_options(strategy, token_mean)
        self.cfg, self.strategy, self.token_mean, self.profile = cfg, strategy, token_mean, profile()
        self.kind = kind_for(cfg, data, tokenizer)
        self.world_size = distributed.world_size()
        self.kind.check_world(cfg, self.world_size, distributed.active())
        self._place()
        self._start_memory()
        self.splits = run_splits(cfg, self.profile, kind=self.kind)
        self.train_split = self.splits["train"]
        self._build(model)
        self.sampler = self.allreduce_counter = None
        if distributed.active():
            self._go_data_parallel(bucket_cap_mb)
        self.model.train()
        self.optimizer = build_optimizer(self.model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum,
                                         cfg.optimizer_impl)
        self.scaler = grad_scaler(self.precision, self.device)
        self.optimizer_steps = 0  # steps taken so far; drives the learning-rate warm-up
        self.skipped_steps = 0  # steps the GradScaler skipped (fp16: inf/NaN gradients), the scale halved
        self.loader = self.kind.loader(self.train_split, self.rank_batch, cfg, self.sampler, self.device)
        if self.sampler is not None:  # the loader's own: packed rows get a sampler over the rows they make
            self.sampler = self.loader.sampler.sampler

    def _place(self) -> None:
        """The device (one GPU per process in a group), TF32, the environment report and the precision."""
        cfg, grouped = self.cfg, self.world_size > 1 or distributed.active()
        self.device = resolve_device(cfg.device)
        if grouped and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", distributed.rank())))
        if grouped and cfg.batch_size % (self.world_size * cfg.grad_accum):
            raise ConfigError("batch_size", cfg.batch_size,
                              f"a multiple of world_size x grad_accum = {self.world_size} x {cfg.grad_accum} "
                              "(the global batch is split evenly over the ranks, then into micro-batches)")
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)  # CUDA events and synchronise act on the current device
        set_tf32(cfg.tf32)  # before the report, so that the recorded TF32 state is this run's
        self.env = env_report(cfg.device)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.warnings: list[str] = []
        self._warn(self.precision.warning)

    def _warn(self, warning: str | None, show: bool = True) -> None:
        if warning:
            if show:
                note(warning)
            self.warnings.append(warning)

    def _start_memory(self) -> None:
        """Memory already held on the GPU before this run (earlier runs' models, a notebook's tensors, the cuBLAS
        workspaces every process allocates once) is not this run's: peaks are reported above this baseline."""
        measure.warm_up_libraries(self.device)
        measure.reset_memory(self.device)
        self.baseline_bytes = measure.allocated_now(self.device)
        self.baseline_reserved_bytes = measure.reserved_now(self.device)

    def _build(self, model: torch.nn.Module | None) -> None:
        """The model (built, or given: a model handed in already on the GPU is the run's own, so its tensors come
        off the baseline), its techniques, then on its device."""
        cfg = self.cfg
        if model is None:
            model, self.weights = build_model(cfg, self.kind, self.train_split)
        else:
            torch.manual_seed(cfg.seed)  # the techniques' own random draws (LoRA's A) as with a built model
            self.weights = given_weights(model, cfg)
            self.baseline_bytes = max(0, self.baseline_bytes - measure.tensor_bytes(model, self.device))
        self.rank_batch = cfg.batch_size // self.world_size  # samples each rank takes per optimizer step
        micro_batch = self.rank_batch // cfg.grad_accum
        if micro_batch < 2 and models.has_batchnorm(model):
            raise ConfigError("batch_size", cfg.batch_size,
                              f"at least 2 samples per micro-batch (batch_size / (world_size x grad_accum) = "
                              f"{micro_batch}): {cfg.model} has BatchNorm, which needs more than one value per "
                              "channel")
        self._warn(self.weights.warning, show=False)
        prepare_model(model, cfg)  # before the optimizer, which takes the parameters left to train
        memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
        self.model = model.to(self.device, memory_format=memory_format)
        compile_warning = self.kind.on_device(self.model, cfg, self.device)
        self.compiled = cfg.compile and compile_warning is None
        self._warn(compile_warning, show=False)

    def _go_data_parallel(self, bucket_cap_mb: float) -> None:
        """DDP around the model (or FSDP2 shards), this rank's sampler, a counter of the gradient all-reduces."""
        self.sampler = distributed.sampler(len(self.train_split), seed=self.cfg.seed)
        if self.strategy == "fsdp":
            distributed.check_shardable(self.model)
            self.model = distributed.shard(self.model, self.kind.shard_units(self.model))
            return
        model, warning = distributed.sync_batchnorm(self.model, self.device)
        if self.world_size > 1:
            self._warn(warning, show=distributed.is_main())
        self.model = distributed.wrap(model, self.device, bucket_cap_mb)
        self.allreduce_counter = distributed.AllReduceCounter()
        self.model.register_comm_hook(self.allreduce_counter, distributed.counting_allreduce_hook)

    def step(self, batch, labels: torch.Tensor | None = None) -> torch.Tensor:
        """One optimizer step over ``grad_accum`` micro-batches; returns the loss (a detached tensor).

        Takes one loader item (images and labels, or a language model's `labkit.text.TokenBatch`). Applies the
        learning-rate warm-up (``cfg.lr_warmup_steps``) and, under DDP, skips the gradient all-reduce on all but the
        last micro-batch (`labkit.techniques.accumulation.sync_context`).
        """
        step_loss = self.accumulate(batch, labels)
        self.update()
        return step_loss

    def accumulate(self, batch, labels: torch.Tensor | None = None) -> torch.Tensor:
        """The backward passes of one step's ``grad_accum`` micro-batches, gradients summed; returns the loss.

        Each micro-batch's loss is its SUM (over samples, or label tokens) divided by the whole step's count, so the
        accumulated gradient is the whole batch's: the per-sample mean of an image batch and the token-normalised
        loss of a token batch (`labkit.techniques.token_loss`) are the same code.
        """
        cfg, device = self.cfg, self.device
        batch: Batch = self.kind.batch(batch, labels)
        # counted where the loader made the batch (the host), before it moves: a count read back from the GPU would
        # make every timed step wait for the GPU to finish the steps queued before it
        total = self.loss_divisor(batch.loss_count())
        micro_batches = self.kind.to_device(batch, self.train_split, cfg, device).split(cfg.grad_accum)
        step_loss = torch.zeros((), device=device)
        for index, micro in enumerate(micro_batches):
            if index:
                measure.new_micro_batch()
            # Under DDP, gradients are all-reduced in the last micro-batch's backward only. DDP decides
            # whether to sync during the forward pass, so the context covers forward and backward.
            with sync_context(self.model, last_micro_batch=index == len(micro_batches) - 1):
                with autocast(self.precision, device):
                    loss = self.kind.loss_sum(self.model, micro, cfg) / total
                self.scaler.scale(loss).backward()
            step_loss += loss.detach().float()
        return step_loss

    def loss_divisor(self, count: int) -> int | torch.Tensor:
        """What each micro-batch's summed loss divides by: the step's count (at least 1); in a process group of a
        language model, the job's label tokens over the ranks (`labkit.techniques.distributed.loss_divisor`), so
        that the averaged gradients are the global batch's token mean whatever each rank holds."""
        if self.world_size > 1 and self.kind.uneven_counts and self.token_mean == "global":
            return distributed.loss_divisor(count, self.device)
        return max(count, 1)

    def update(self) -> None:
        """The optimizer step on the accumulated gradients (warm-up, clipping, scaler), then zero them."""
        cfg = self.cfg
        warmup_lr(self.optimizer, cfg.lr, self.optimizer_steps, cfg.lr_warmup_steps)
        self.optimizer_steps += 1
        if cfg.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if scale is not None and self.scaler.get_scale() < scale:  # found inf/NaN: the step was skipped
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)

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

    # The phases of `step_plan`: each runs ``record()`` (one optimizer step, its loss recorded) its own way.
    def warmup(self, record: Callable[[], None], item, m: _Measures) -> None:
        record()

    def compile(self, record: Callable[[], None], item, m: _Measures) -> None:
        """The step that compiles, timed apart: what compiling cost is its time above a typical step's."""
        m.first_step.start()
        record()
        m.first_step.stop()

    def flops(self, record: Callable[[], None], item, m: _Measures) -> None:
        m.flops = self._count_flops(record) + self.kind.extra_flops(self.model, self.kind.batch(item), self.device)

    def memory(self, record: Callable[[], None], item, m: _Measures) -> None:
        tracked = measure.track_step_memory(record, self.model, self.optimizer, self.device)
        m.breakdown = measure.with_untracked(tracked, "gradients", distributed.bucket_bytes(self.model),
                                             "DDP's gradient buckets")
        measure.reset_peak(self.device)  # CUDA peak statistics cover the timed steps only

    def timed(self, record: Callable[[], None], item, m: _Measures) -> None:
        if m.reduces_before is None and self.allreduce_counter is not None:
            m.reduces_before = (self.allreduce_counter.calls, self.allreduce_counter.bytes)
        m.timer.start()
        record()
        m.timer.stop()
        m.counts += self.kind.batch(item).counts()

    def _planned_steps(self) -> tuple[int, int]:
        """(steps this run trains, steps it was asked for): an emulated precision trains at most the profile's."""
        cfg, prof = self.cfg, self.profile
        steps = planned = total_steps(cfg, len(self.loader))
        untimed = prof.warmup_steps + PROFILING_STEPS
        if self.precision.emulated and steps > emulated_step_limit(prof):
            steps = emulated_step_limit(prof)
            self._warn(f"{self.precision.name} is emulated here, so this run trained {steps} of its {planned} steps "
                       f"(the {prof.name} profile's limit for emulated runs, to keep the notebook's time); its step "
                       f"time and memory are measured as usual, its accuracy is after {steps} steps")
        if steps <= untimed:
            name = "max_steps" if cfg.max_steps is not None else "epochs"
            raise ConfigError(name, getattr(cfg, name),
                              f"enough for more than {untimed} optimizer steps ({prof.warmup_steps} warm-up + "
                              f"{PROFILING_STEPS} profiling steps are never timed); this gives {steps}")
        if cfg.lr_warmup_steps >= planned:
            raise ConfigError("lr_warmup_steps", cfg.lr_warmup_steps,
                              f"fewer than the run's {planned} optimizer steps",
                              "A warm-up as long as the run never trains at the full lr")
        return steps, planned

    def _record(self, losses: torch.Tensor, index: int, item) -> None:
        losses[index] = self.step(item)

    def _check(self, losses: torch.Tensor, done: int, steps: int) -> None:
        if done % CHECK_LOSS_EVERY == 0 or done == steps:
            first = (done - 1) // CHECK_LOSS_EVERY * CHECK_LOSS_EVERY
            _check_losses(losses[first:done], first + 1, self.precision.name)

    def _bar(self, steps: int, progress: bool) -> tqdm:
        progress = progress and distributed.is_main()  # one progress bar per job, rank 0's
        return tqdm(total=steps, desc=f"{self.cfg.model} {self.precision.name} bs{self.cfg.batch_size}",
                    disable=not progress or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true"), leave=False)

    def run(self, on_step: Callable[[int, int], None] | None = None, progress: bool = True) -> RunResult:
        """Train and measure; see `fit`."""
        device = self.device
        steps, planned = self._planned_steps()
        plan = step_plan(steps, self.profile.warmup_steps, self.compiled)
        m = _Measures(measure.StepTimer(device), measure.StepTimer(device))
        # One buffer for every step's loss, allocated up front: keeping a small tensor alive per step
        # scatters the heap on CPU and measurably slowed the following steps (about 7 % here).
        losses = torch.full((steps,), float("nan"), device=device)
        bar = self._bar(steps, progress)
        measure.reset_memory(device)
        start_wall = time.perf_counter()
        for index, (phase, item) in enumerate(zip(plan, self.batches(steps), strict=True)):
            getattr(self, phase)(functools.partial(self._record, losses, index, item), item, m)
            self._check(losses, index + 1, steps)
            bar.update(1)
            if on_step is not None:
                on_step(index + 1, steps)
        measure.synchronize(device)
        train_time_s = time.perf_counter() - start_wall
        bar.close()
        return self._finish(steps, planned, losses, m, train_time_s)

    def _finish(self, steps: int, planned: int, losses: torch.Tensor, m: _Measures, train_time_s: float) -> RunResult:
        """The run's result; in a process group the job's loss per step (the ranks' mean), FLOPs and rank figures."""
        flops = m.flops
        if distributed.active():
            losses = distributed.all_reduce_mean(losses)
            if flops is not None:
                flops = int(distributed.all_reduce_sum(torch.tensor(flops, dtype=torch.float64, device=self.device)))
        result = self._result(steps, m.timer.times_s(), losses.cpu().tolist(), flops, m.breakdown, train_time_s)
        if self.compiled:  # the first step's time above a typical step's: what compiling cost
            result.compile_time_s = max(0.0, m.first_step.times_s()[0] - result.step_time_s)
        result.planned_steps = planned if planned != steps else None
        if distributed.active():
            result.distributed = self._rank_figures(result, m, len(m.timer.times_s()))
        # the job's tokens (every rank's) over this rank's timed time: the ranks step together
        counts = sum((text.TokenCounts(**r["counts"]) for r in result.distributed["ranks"]), text.TokenCounts()) \
            if distributed.active() else m.counts
        if counts.tokens and result.timed_steps:  # token batches: pad shares vary from batch to batch
            total_s = sum(result.step_times_s)
            result.tokens_per_s, result.real_tokens_per_s = counts.tokens / total_s, counts.real_tokens / total_s
            result.pad_fraction = counts.pad_fraction
        return result

    def _rank_figures(self, result: RunResult, m: _Measures, timed_steps: int) -> dict:
        """The job's figures and each rank's own, gathered on every rank: its tokens over the timed steps and their
        rate, its memory by category at its peak (FSDP2's shards are a rank's 1/N), its parameter, gradient and
        optimizer-state bytes. All-reduces and their bytes are counted over the timed steps only: DDP's first steps
        use other buckets (it rebuilds them after the first one)."""
        counter, unwrapped, reduces_before = self.allreduce_counter, models.unwrap(self.model), m.reduces_before
        timed = counter is not None and reduces_before is not None
        timed_s = sum(result.step_times_s)
        mine = {"rank": distributed.rank(), "step_time_s": result.step_time_s, "train_time_s": result.train_time_s,
                "peak_memory_bytes": result.peak_memory_bytes, "memory": dict(result.memory or {}),
                "memory_at_peak": dict(result.memory_at_peak or {}), "counts": dataclasses.asdict(m.counts),
                "tokens_per_s": m.counts.tokens / timed_s if m.counts.tokens and timed_s else None,
                "real_tokens_per_s": m.counts.real_tokens / timed_s if m.counts.tokens and timed_s else None,
                "gradient_bytes": sum(distributed.local_numel(p) * p.element_size() for p in self.model.parameters()
                                      if p.requires_grad),
                "weights_sha256": distributed.weights_sha256(unwrapped),
                "allreduces_per_step": (counter.calls - reduces_before[0]) / timed_steps if timed else None,
                **{f"{part}_sha256": distributed.weights_sha256(unwrapped, part) for part in ("parameters", "buffers")},
                "samples_per_step": self.rank_batch, "device": str(self.device),
                "parameter_bytes": sum(distributed.local_numel(p) * p.element_size() for p in self.model.parameters()),
                "optimizer_state_bytes": sum(distributed.local_numel(t) * t.element_size()
                                             for state in self.optimizer.state.values() for t in state.values()
                                             if torch.is_tensor(t) and t.dim() > 0)}
        ranks = distributed.all_gather(mine)
        sample = distributed.weights_sample(unwrapped)  # a collective under FSDP2: on every rank
        return {"world_size": self.world_size, "weights_sample": sample, "backend": torch.distributed.get_backend(),
                "strategy": self.strategy,
                "weights_sha256": [r["weights_sha256"] for r in ranks], "ranks": ranks,
                "bucket_cap_mb": self.model.bucket_bytes_cap / 2**20 if hasattr(self.model, "bucket_bytes_cap")
                else None,
                "allreduce_bytes_per_step": (counter.bytes - reduces_before[1]) / timed_steps if timed else None,
                "samples_per_rank": self.rank_batch}

    def _peaks(self, breakdown: measure.MemoryBreakdown) -> tuple[int, int | None]:
        """The run's peak allocated (and reserved) bytes above its baseline: the allocator's on CUDA, else tracked."""
        if self.device.type != "cuda":
            return breakdown.total_peak_bytes, None
        peak, reserved = measure.cuda_peak_memory(self.device)
        return max(0, peak - self.baseline_bytes), max(0, reserved - self.baseline_reserved_bytes)

    def _result(self, steps, times, losses, flops, breakdown, train_time_s) -> RunResult:
        cfg = self.cfg
        median, p10, p90 = measure.spread(times)
        peak, reserved = self._peaks(breakdown)
        scores = self.kind.evaluate(self.model, self.splits, cfg, self.device, self.precision,
                                    self.strategy == "ddp") if cfg.evaluate else {}
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
            **scores, data=_data_report(self.train_split), losses=losses, flops_per_step=flops, achieved_flops=achieved,
            peak_flops=peak_flops,
            mfu=achieved / peak_flops if achieved and peak_flops else None,
            model_size_bytes=measure.model_size_bytes(models.unwrap(self.model)), num_params=num_params,
            num_trainable_params=num_trainable, weights=self.weights.source, warnings=list(self.warnings),
            skipped_steps=self.skipped_steps if self.scaler.is_enabled() else None,
        )
        result.model = models.unwrap(self.model)
        if exports(cfg) and distributed.is_main():
            result.inference = score_inference(result.model, cfg, self.splits)
        return result


def fit(cfg: RunConfig, on_step: Callable[[int, int], None] | None = None, progress: bool = True,
        model: torch.nn.Module | None = None, data=None, tokenizer=None) -> RunResult:
    """Train ``cfg.model`` on ``cfg.dataset`` as ``cfg`` says and measure it.

    Args:
        cfg: the run.
        on_step: called as ``on_step(step, total_steps)`` after each optimizer step (e.g. a widget bar).
        progress: show a tqdm progress bar (``TQDM_DISABLE=1`` hides it too).
        model: train this model instead of building ``cfg.model`` (see `Trainer`); it is trained in place.
        data: with ``dataset="given"``, a learner's records: a ``datasets.Dataset``, a list of strings or of records.
        tokenizer: the tokenizer of the language model passed as ``model`` (a transformers tokenizer).

    Returns:
        A `RunResult`; the trained model is attached as ``result.model`` (not serialised).

    Example:
        >>> res = labkit.fit(labkit.RunConfig(model="small_cnn", max_steps=50))
        >>> res.step_time_s, res.peak_memory_bytes, res.accuracy
    """
    return Trainer(cfg, model=model, data=data, tokenizer=tokenizer).run(on_step=on_step, progress=progress)

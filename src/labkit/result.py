"""`RunResult`: what one training run measured, JSON-serialisable."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .config import RunConfig

MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


@dataclass
class RunResult:
    """The measurements of one `labkit.fit` run.

    Times are seconds, memory and sizes bytes, throughput samples per second.

    Attributes:
        config: the `RunConfig` as a dict; env: the `labkit.env_report()` dict.
        steps: optimizer steps trained; planned_steps: the steps the config asked for when the run was
            cut short because its precision is emulated here (`Profile.emulated_steps`), else None.
        step_time_s: median time of one optimizer step over the timed steps (warm-up excluded).
        step_time_p10_s, step_time_p90_s: spread of the timed steps; step_times_s: all of them.
        throughput: samples per second, batch_size / step_time_s.
        peak_memory_bytes: on CUDA ``max_memory_allocated`` over the timed steps; on CPU the tracked tensors' peak.
        reserved_memory_bytes: CUDA caching-allocator reserve at its peak (None on CPU: there is no cache).
        memory: each category's own peak over a training step (parameters, gradients, optimizer_state,
            activations, other).
        memory_at_peak: the composition at the moment of the total peak.
        accuracy: test accuracy after training (None when ``evaluate=False``).
        losses: training loss per optimizer step.
        flops_per_step: FLOPs of one optimizer step (forward + backward), counted by FlopCounterMode.
        achieved_flops: flops_per_step / step_time_s; peak_flops: the device's datasheet peak for the
            precision used (None when unknown); mfu: achieved / peak.
        model_size_bytes: serialised state_dict size; num_params / num_trainable_params: parameter counts.
        weights: where the starting weights came from; warnings: what the run warned about.
        error: why the run failed (sweeps record failures as rows).
        distributed: for a data-parallel run (`labkit.labs.distributed.launch`), the job: ``world_size``,
            ``backend``, ``weights_sha256`` (one per rank), ``ranks`` (each rank's own figures),
            ``bucket_cap_mb``, ``allreduce_bytes_per_step``; None for a run in one process. Step time,
            throughput, loss, FLOPs and accuracy are then the job's; peak memory is rank 0's.
        inference: when the config prunes or quantizes for inference (``prune_amount``, ``quantize``), the
            deployed copy's figures (`labkit.train.score_inference`): ``method`` (in words), ``accuracy`` (test),
            ``size_bytes`` (serialised), ``nonzero_share`` (of the Conv/Linear weights, before quantization),
            ``device``; ``accuracy`` and ``model_size_bytes`` above stay the trained float model's. None otherwise.
    """

    config: dict
    env: dict = field(default_factory=dict)
    precision_used: str = "fp32"
    tf32: bool = False
    steps: int = 0
    planned_steps: int | None = None
    timed_steps: int = 0
    step_time_s: float = math.nan
    step_time_p10_s: float = math.nan
    step_time_p90_s: float = math.nan
    step_times_s: list = field(default_factory=list)
    throughput: float = math.nan
    train_time_s: float = math.nan
    peak_memory_bytes: int | None = None
    reserved_memory_bytes: int | None = None
    memory: dict = field(default_factory=dict)
    memory_at_peak: dict = field(default_factory=dict)
    memory_note: str | None = None
    accuracy: float | None = None
    losses: list = field(default_factory=list)
    flops_per_step: int | None = None
    achieved_flops: float | None = None
    peak_flops: float | None = None
    mfu: float | None = None
    model_size_bytes: int | None = None
    num_params: int | None = None
    num_trainable_params: int | None = None
    weights: str | None = None
    warnings: list = field(default_factory=list)
    error: str | None = None
    distributed: dict | None = None
    inference: dict | None = None

    model = None  # the trained model after `labkit.fit` (not serialised; None for cached or reference runs)

    @property
    def cfg(self) -> RunConfig:
        return RunConfig.from_dict(self.config)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> RunResult:
        return cls(**values)

    def summary(self) -> dict:
        """The headline numbers: time, memory, accuracy, size (plus throughput and FLOP/s)."""
        return {
            "step_time_ms": self.step_time_s * 1e3,
            "throughput": self.throughput,
            "peak_memory_MiB": None if self.peak_memory_bytes is None else self.peak_memory_bytes / 2**20,
            "accuracy": self.accuracy,
            "model_size_MiB": None if self.model_size_bytes is None else self.model_size_bytes / 2**20,
            "achieved_TFLOPs": None if self.achieved_flops is None else self.achieved_flops / 1e12,
        }

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{_fmt(v)}</td></tr>"
                       for k, v in self.summary().items())
        head = f"<b>{self.config.get('model')} on {self.config.get('dataset')}</b>"
        if self.error:
            head += f" <span style='color:#b00'>failed: {self.error}</span>"
        return f"{head}<table>{rows}</table>"


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)

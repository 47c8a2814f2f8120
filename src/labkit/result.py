"""`RunResult`: what one training run measured, JSON-serialisable.

Details of some `RunResult` fields:

- ``planned_steps``: the steps the config asked for when the run was cut short because its precision is
  emulated here (`Profile.emulated_steps`), else None.
- ``distributed``: for a data-parallel run (`labkit.launcher.launch`), the job: ``world_size``,
  ``backend``, ``weights_sha256`` (one per rank), ``ranks`` (each rank's own figures), ``bucket_cap_mb``,
  ``allreduce_bytes_per_step``; None for a run in one process. Step time, throughput, loss, FLOPs and accuracy
  are then the job's; peak memory is rank 0's.
- ``inference``: when the config prunes or quantizes for inference (``prune_amount``, ``quantize``), the
  deployed copy's figures (`labkit.evaluation.score_inference`): ``method`` (in words), ``accuracy`` (test),
  ``size_bytes`` (serialised), ``nonzero_share`` (of the Conv/Linear weights, before quantization),
  ``device``; ``accuracy`` and ``model_size_bytes`` stay the trained float model's. None otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .config import RunConfig

MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


@dataclass
class RunResult:
    """The measurements of one `labkit.fit` run.

    Times are seconds, memory and sizes bytes, throughput samples per second. Each field's comment says what it
    holds; the module docstring has the details of ``planned_steps``, ``distributed`` and ``inference``.
    """

    config: dict  # the `RunConfig` as a dict
    env: dict = field(default_factory=dict)  # the `labkit.env_report()` dict
    precision_used: str = "fp32"  # the precision the run used (``auto`` resolved)
    tf32: bool = False  # whether TF32 was allowed
    steps: int = 0  # optimizer steps trained
    planned_steps: int | None = None  # the steps the config asked for, when an emulated precision cut the run short
    timed_steps: int = 0  # the steps timed (warm-up excluded)
    step_time_s: float = math.nan  # median time of one optimizer step over the timed steps
    step_time_p10_s: float = math.nan  # spread of the timed steps: 10th percentile
    step_time_p90_s: float = math.nan  # and 90th percentile
    step_times_s: list = field(default_factory=list)  # every timed step's time
    throughput: float = math.nan  # samples per second, batch_size / step_time_s
    train_time_s: float = math.nan  # wall-clock time of the whole training loop
    # on CUDA ``max_memory_allocated`` over the timed steps; on CPU the tracked tensors' peak
    peak_memory_bytes: int | None = None
    reserved_memory_bytes: int | None = None  # CUDA caching-allocator reserve at its peak (None on CPU: no cache)
    memory: dict = field(default_factory=dict)  # each of `MEMORY_CATEGORIES`' own peak over a training step
    memory_at_peak: dict = field(default_factory=dict)  # the composition at the moment of the total peak
    memory_note: str | None = None  # why the memory breakdown is missing, if it is
    accuracy: float | None = None  # test accuracy after training (None when ``evaluate=False``)
    losses: list = field(default_factory=list)  # training loss per optimizer step
    flops_per_step: int | None = None  # FLOPs of one optimizer step (forward + backward), by FlopCounterMode
    achieved_flops: float | None = None  # flops_per_step / step_time_s
    peak_flops: float | None = None  # the device's datasheet peak for the precision used (None when unknown)
    mfu: float | None = None  # achieved / peak
    model_size_bytes: int | None = None  # serialised state_dict size
    num_params: int | None = None  # parameter count
    num_trainable_params: int | None = None  # trainable parameter count
    weights: str | None = None  # where the starting weights came from
    warnings: list = field(default_factory=list)  # what the run warned about
    error: str | None = None  # why the run failed (sweeps record failures as rows)
    distributed: dict | None = None  # a data-parallel run's job (see the module docstring); None in one process
    inference: dict | None = None  # the pruned or quantized copy's figures (see the module docstring), else None
    # language models (None otherwise): over the timed steps, all tokens and the real (not padding) ones per second
    tokens_per_s: float | None = None
    real_tokens_per_s: float | None = None
    pad_fraction: float | None = None  # the share of padding among the timed steps' tokens
    compile_time_s: float | None = None  # torch.compile's time, kept out of step time (None: not compiled)
    test_loss: float | None = None  # the test split's mean token cross-entropy (nats), language models
    perplexity: float | None = None  # exp(test_loss)
    data: dict | None = None  # a learner's own data: what was done to it (`labkit.text.own_data.OwnDataReport`)
    skipped_steps: int | None = None  # fp16: optimizer steps the GradScaler skipped (inf/NaN); None without a scaler

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

"""How labkit measures: step timers, peak memory and its breakdown, FLOPs, model size, latency.

Rules every number follows: warm-up is excluded; GPU work is synchronised before a time is read
(CUDA events); peak memory comes from the allocator (``max_memory_allocated``), never from the
cache (``memory_reserved``), and on CPU from an exact accounting of live tensors.

One module each: `timing`, `memory`, `counts`, and `compare`: whether two measurements differ beyond their noise.
"""

from .compare import VERDICTS, Comparison, Measured, compare
from .counts import PEAK_FLOPS, accuracy_noise, count_flops, count_parameters, model_size_bytes, peak_flops
from .memory import (
    MemoryBreakdown,
    allocated_now,
    cuda_peak_memory,
    inference_peak_bytes,
    new_micro_batch,
    optimizer_state_bytes,
    reserved_now,
    tensor_bytes,
    track_step_memory,
    with_untracked,
)
from .timing import (
    Latency,
    StepTimer,
    TimingPitfalls,
    in_turns,
    measure_latency,
    ratio_band,
    reset_memory,
    reset_peak,
    separated,
    spread,
    synchronize,
    timing_pitfalls,
    warm_up_libraries,
)

__all__ = ["VERDICTS", "Comparison", "Latency", "Measured", "MemoryBreakdown", "PEAK_FLOPS", "StepTimer",
           "TimingPitfalls", "accuracy_noise", "compare",
           "allocated_now", "count_flops", "count_parameters", "in_turns", "cuda_peak_memory", "inference_peak_bytes",
           "measure_latency", "model_size_bytes", "new_micro_batch", "optimizer_state_bytes", "peak_flops",
           "ratio_band", "reserved_now", "reset_memory", "reset_peak", "separated", "spread", "synchronize",
           "tensor_bytes", "timing_pitfalls", "track_step_memory", "warm_up_libraries", "with_untracked"]

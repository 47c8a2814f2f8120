"""Notebook 01 (mixed precision): its experiments, and one verdict line per finding from their live numbers.

- `numerics`: `formats` (fp32, fp16 and bf16 side by side), `gradient_underflow` (what fp16 zeroes, with and
  without loss scaling), `scaler_trace` (the GradScaler's scale and skipped steps), `autocast_dtypes` (autocast's
  op lists, probed).
- `language`: `lm_compare` (fp32 against the low precision on the profile's language model) and
  `fp16_weights_pitfall` (a model loaded in fp16, trained under fp16 autocast with a GradScaler).
- `comparison`: `compare` and `table` (the same fine-tune in fp32, fp32 + TF32, fp16 + GradScaler and bf16), and
  the verdicts `summary`, `tf32_finding`, `memory_savings`, `channels_last_finding`, `scaler_finding`, `advice`.

A speed difference is called real only when the two runs' step-time spreads (10th to 90th percentile of the
timed steps) do not overlap. The mechanism (autocast, the GradScaler, `run_in_fp32`) is in
`labkit.techniques.precision`; the explanations are in the notebook.
"""

from .comparison import (
    LOW_SETUPS,
    SETUPS,
    SPEEDUP_SOURCE,
    advice,
    channels_last_finding,
    compare,
    faster,
    has_tf32,
    low_setup,
    memory_savings,
    own_saving_finding,
    own_saving_numbers,
    peak_fraction,
    scaler_finding,
    setup_label,
    speed_phrase,
    speedup,
    speedup_band,
    speedups,
    summary,
    table,
    tf32_finding,
)
from .language import fp16_weights_pitfall, lm_compare, lm_finding
from .numerics import (
    AUTOCAST_PROBES,
    FP16_MAX,
    FP16_SMALLEST_NORMAL,
    FP16_SMALLEST_SUBNORMAL,
    autocast_dtypes,
    formats,
    gradient_underflow,
    scaler_trace,
)

__all__ = [
    "AUTOCAST_PROBES", "FP16_MAX", "FP16_SMALLEST_NORMAL", "FP16_SMALLEST_SUBNORMAL", "LOW_SETUPS", "SETUPS",
    "SPEEDUP_SOURCE", "advice", "autocast_dtypes", "channels_last_finding", "compare", "faster", "formats",
    "gradient_underflow", "has_tf32", "low_setup", "memory_savings", "own_saving_finding", "own_saving_numbers",
    "peak_fraction", "scaler_finding", "scaler_trace", "setup_label", "speed_phrase", "speedup", "speedup_band",
    "speedups", "summary", "table", "tf32_finding", "fp16_weights_pitfall", "lm_compare", "lm_finding",
]

"""How much fits: training memory computed per parameter, measured per step, predicted per batch size,
and the largest batch within a budget.

- `training_memory`, `model_training_memory`: the bytes-per-parameter accounting (weights, gradients,
  optimizer state, master weights), for any parameter count or exactly for a real model.
- `step_memory`: one measured training step at a batch size (the measurement `labkit.fit` reports as
  ``peak_memory_bytes``); `memory_model`, `estimate_memory`, `fit_linear_memory`: memory is about
  ``fixed + bytes_per_sample * batch_size``; measure it, fit it, predict it.
- `batch_search` / `find_max_batch_size`: the largest batch whose training step fits in a memory budget
  (or, on a GPU without a budget, does not run out of memory), with the back-off of
  `labkit.techniques.oom_backoff`.

- `lm_training_memory`: a language model's fine-tuning memory by formula (full, LoRA, QLoRA; activations per decoder
  layer, logits), for the hub models and labkit's Llamas.

One module each: `accounting`, `steps`, `search`, `estimate`, `lm_memory`.
"""

from .accounting import COMPONENTS, WEIGHT_BYTES, model_training_memory, training_memory
from .estimate import (
    LADDER_MAX,
    LADDER_START,
    SLOPE_TOLERANCE,
    LinearMemory,
    MemoryModel,
    estimate_memory,
    fit_linear_memory,
    memory_model,
)
from .lm_memory import METHODS, decoder_shape, lm_training_memory, lora_parameters
from .search import batch_search, find_max_batch_size
from .steps import StepMemory, state_bytes, step_memory

__all__ = ["METHODS", "decoder_shape", "lm_training_memory", "lora_parameters",
           "COMPONENTS", "LADDER_MAX", "LADDER_START", "SLOPE_TOLERANCE", "WEIGHT_BYTES", "LinearMemory", "MemoryModel",
           "StepMemory", "batch_search", "estimate_memory", "find_max_batch_size", "fit_linear_memory", "memory_model",
           "model_training_memory", "state_bytes", "step_memory", "training_memory"]

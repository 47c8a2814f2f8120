"""The language-model workload that notebooks measure speed and memory on, by profile (DESIGN.md): labkit's
shipped ``tiny_llama`` at ``ci``, the config-built ``tiny_llama_10m`` at ``quick``, SmolLM2-135M's architecture at
``full`` (busy enough on a T4 for a technique's effect to show), all from random weights: speed and memory do not
depend on them. Notebook 10 teaches on it; notebook 01 gives mixed precision one language-model arm on it.
"""

from __future__ import annotations

from .config import RunConfig
from .env import profile
from .train import PROFILING_STEPS

LM_SPEED_MODELS = {"ci": "tiny_llama", "quick": "tiny_llama_10m", "full": "smollm2_135m"}
MAX_TIMED_STEPS = 6


def lm_speed_model() -> str:
    """The profile's language model for speed and memory (`LM_SPEED_MODELS`)."""
    return LM_SPEED_MODELS[profile().name]


def lm_speed_config(**fields) -> RunConfig:
    """A random-weight Llama (`lm_speed_model`) on pydoc_text, packed rows at the dataset's default length, 4 rows a
    step, the profile's timed steps (at most `MAX_TIMED_STEPS`), no evaluation.

    Args:
        fields: any `RunConfig` field, e.g. ``precision="bf16"`` or ``checkpointing=True``.

    Example:
        >>> lm_speed_config(precision="bf16").model  # at ci
        'tiny_llama'
    """
    prof = profile()
    base = {"model": lm_speed_model(), "dataset": "pydoc_text", "packing": "pack", "batch_size": 4,
            "pretrained": False, "evaluate": False, "train_size": 64,
            "max_steps": prof.warmup_steps + PROFILING_STEPS + min(prof.repeats, MAX_TIMED_STEPS)}
    return RunConfig(**{**base, **fields})

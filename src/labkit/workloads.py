"""The language-model workloads that several notebooks share, by profile (DESIGN.md).

- `lm_speed_config`: speed and memory. labkit's shipped ``tiny_llama`` at ``ci``, the config-built
  ``tiny_llama_10m`` at ``quick``, SmolLM2-135M's architecture at ``full`` (busy enough on a T4 for a technique's
  effect to show), all from random weights: speed and memory do not depend on them. Notebooks 01, 02, 03, 10.
- `lm_finetune_config`: a fine-tune whose quality counts. The pretrained ``tiny_llama`` at ``ci`` and ``quick``,
  SmolLM2-135M's pretrained weights at ``full`` (its own tokenizer online), on ``digits_sort``, scored by exact
  match. Notebooks 06 and 08.
"""

from __future__ import annotations

from .config import RunConfig
from .env import Profile, profile
from .train import PROFILING_STEPS

LM_SPEED_MODELS = {"ci": "tiny_llama", "quick": "tiny_llama_10m", "full": "smollm2_135m"}
LM_FINETUNE_MODELS = {"ci": "tiny_llama", "quick": "tiny_llama", "full": "smollm2_135m"}
FINETUNE_DATASET = "digits_sort"
FINETUNE_LR = 1e-3
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


def lm_finetune_config(prof: Profile | None = None, **fields) -> RunConfig:
    """The profile's pretrained language model (`LM_FINETUNE_MODELS`) fine-tuned in full on ``digits_sort``.

    Args:
        prof: the profile (default: the active one); its steps and data sizes.
        fields: any `RunConfig` field.

    Example:
        >>> lm_finetune_config(labkit.profile("ci")).model
        'tiny_llama'
    """
    prof = prof or profile()
    base = {"model": LM_FINETUNE_MODELS[prof.name], "dataset": FINETUNE_DATASET, "pretrained": True,
            "lr": FINETUNE_LR, "max_steps": prof.max_steps}
    return RunConfig(**{**base, **fields})

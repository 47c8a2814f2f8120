"""Section 8 of notebook 08: the panel's run, one LoRA fine-tune through the cache."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ... import results
from ...config import RunConfig
from ...errors import ConfigError
from ...messages import wrap
from ...units import mib
from .base import ALPHA, LORA_LR, TARGETS, targets_label


@dataclass
class LoRARun:
    """One panel run: a LoRA fine-tune's headline numbers."""

    lora_rank: int
    lora_alpha: float
    targets: str
    num_trainable_params: int
    trainable_share: float
    peak_memory_bytes: int | None
    mem_optimizer_state_bytes: int | None
    step_time_s: float
    tokens_per_s: float | None
    exact_match: float | None
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return wrap(f"LoRA rank {self.lora_rank} on {self.targets}, alpha {self.lora_alpha:g}: "
                    f"{self.num_trainable_params:,} trainable ({self.trainable_share:.2%}), peak "
                    f"{mib(self.peak_memory_bytes)}, {self.step_time_s * 1e3:.0f} ms a step, exact match "
                    f"{self.exact_match:.1%}")


def panel_config(cfg: RunConfig) -> RunConfig:
    """The panel's starting point: LoRA rank 8 on q and v (a dropdown's value), alpha 16, at LoRA's learning rate."""
    return cfg.replace(lora_rank=8, lora_targets="q_proj,v_proj", lora_alpha=ALPHA, lr=LORA_LR)


def panel_run(cfg: RunConfig, on_step=None, progress: bool = False) -> LoRARun:
    """Fine-tune ``cfg`` (its ``lora_rank``, ``lora_alpha``, ``lora_targets``) through the cache; the panel's run.

    Args:
        cfg: the config; ``lora_targets`` may be a key of `TARGETS` (the panel's dropdown), run as its layers so
            that a setting the sweep ran comes from the cache. on_step, progress: passed to the fit.
    """
    if cfg.lora_rank is None:
        raise ConfigError("lora_rank", cfg.lora_rank, "a positive integer (the panel trains LoRA adapters)")
    if isinstance(cfg.lora_targets, str):
        cfg = cfg.replace(lora_targets=TARGETS.get(cfg.lora_targets, (cfg.lora_targets,)))
    result = results.cached_fit(cfg, progress=progress, on_step=on_step)
    return LoRARun(lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, targets=targets_label(cfg.lora_targets),
                   num_trainable_params=result.num_trainable_params,
                   trainable_share=result.num_trainable_params / result.num_params,
                   peak_memory_bytes=result.peak_memory_bytes,
                   mem_optimizer_state_bytes=result.memory.get("optimizer_state"), step_time_s=result.step_time_s,
                   tokens_per_s=result.tokens_per_s, exact_match=result.accuracy, warnings=list(result.warnings))

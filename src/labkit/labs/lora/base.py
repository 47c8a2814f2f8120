"""What every section of notebook 08 shares: the language-model workload, LoRA's settings, the optional libraries."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import warnings

from torch import nn

from ...config import RunConfig
from ...env import Profile, import_bitsandbytes
from ...errors import UnsupportedError
from ...project import peft_torchao_problem, torchao_requirement
from ...runsetup import build_model, set_up
from ...techniques import quantization
from ...techniques.lora import ALL_LINEAR
from ...workloads import lm_finetune_config

# QLoRA's model and whether it starts pretrained (tiny_llama_10m is for speed and memory: labkit ships no weights)
QLORA_MODELS = {"ci": ("tiny_llama", True), "quick": ("tiny_llama_10m", False), "full": ("qwen2.5_1.5b", True)}
ATTENTION = ("q_proj", "v_proj")  # the LoRA paper's choice: the query and value projections of every layer
TARGETS = {"q_proj,v_proj": ATTENTION, ALL_LINEAR: ALL_LINEAR}  # the panel's and the sweep's choices
ALPHA = 16.0
# LoRA trains a few small matrices from zero (B) and wants a larger step than full fine-tuning, which moves
# every pretrained weight (the paper used 4e-4 to 5e-4 for LoRA on RoBERTa-base against 1e-5 to 3e-5 in full).
LORA_LR = 3e-3
MERGE_RANK = 8  # merge_comparison's fine-tune, kept with its weights by rank_sweep
# The sweep's ranks per target set and profile, each with MERGE_RANK; at ci two on q,v (the exercise reads two). At
# full each rank is a SmolLM2 fine-tune of 1.4 min on a T4: seven ranks on two target sets took 38 minutes.
RANKS = {"ci": {"q_proj,v_proj": (2, 8), ALL_LINEAR: (8,)}, "quick": (1, 8, 64), "full": (1, 8, 64)}


def workload(prof: Profile | None = None) -> RunConfig:
    """The notebook's fine-tune: the profile's pretrained language model on ``digits_sort`` in full."""
    return lm_finetune_config(prof)


def targets_label(targets) -> str:
    """``("q_proj", "v_proj")`` -> ``"q_proj,v_proj"``; ``"all-linear"`` stays."""
    return targets if isinstance(targets, str) else ",".join(targets)


def lora_config(cfg: RunConfig, rank: int, targets="q_proj,v_proj", alpha: float = ALPHA,
                lr: float = LORA_LR) -> RunConfig:
    """``cfg`` with LoRA adapters of ``rank`` on ``targets`` (a key of `TARGETS` or layer-name suffixes)."""
    targets = TARGETS.get(targets, targets) if isinstance(targets, str) else targets
    return cfg.replace(lora_rank=rank, lora_targets=targets, lora_alpha=alpha, lr=lr)


def fresh_model(cfg: RunConfig, pretrained: bool = False) -> nn.Module:
    """``cfg.model`` as the loop builds it for ``cfg``'s data (on the CPU): random weights, or its pretrained start."""
    setup = set_up(cfg, model=False, training=False)  # the run's tokenizer, even for random weights
    return build_model(cfg.replace(pretrained=pretrained and cfg.pretrained), setup.kind, setup.train)[0]


def quiet_import(name: str):
    """Import ``name`` (peft, transformers) or say how to install it, without their import-time notices."""
    if importlib.util.find_spec(name) is None:
        raise UnsupportedError("library", name, f"{name} is not installed",
                               "pip install 'labkit-finetune[lora]' (peft and transformers) and restart the kernel")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    # PEFT 0.21 reads a transformers attribute that transformers 5 deprecated; nothing for a learner to change
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
    if importlib.util.find_spec("bitsandbytes") is not None:  # peft imports it: its notices would land in the cell
        import_bitsandbytes()
    module = importlib.import_module(name)
    if name == "peft":  # said here, not as PEFT's ImportError in the middle of get_peft_model
        problem = peft_torchao_problem(module.__version__, quantization.installed_version("torchao"))
        if problem is not None:
            raise UnsupportedError("torchao", quantization.installed_version("torchao"), problem,
                                   f'the torchao built for this torch: %pip install "{torchao_requirement()}", then '
                                   "restart the kernel (08's setup cell does this on Colab and Kaggle)")
    if name == "transformers":  # its loading bars would print under the cell on every load
        module.utils.logging.disable_progress_bar()
        module.logging.set_verbosity_error()  # "newly initialized classifier" is expected: it is a new task
    return module


def library_versions() -> str:
    """The versions of PEFT, transformers and bitsandbytes here (or that they are missing)."""
    parts = []
    for name in ("peft", "transformers", "bitsandbytes"):
        version = quantization.installed_version(name)
        parts.append(f"{name} {version}" if version else f"{name}: not installed")
    return ", ".join(parts)

"""Notebook 08 (LoRA and QLoRA): its experiments and the findings worded from their live numbers.

- `SeedLoRALayer`, `seed_snippet_problems`: the seed's layer, kept wrong on purpose, and what goes wrong with it.
- `target_table`, `paper_count`: trainable parameters per rank and targets without training; the LoRA paper's
  294,912 for a RoBERTa-base-sized model with rank 8 on query and value (built from a config, no download).
- `to_peft`, `copy_adapters`, `peft_comparison`: ``peft.get_peft_model`` on the same model, the same trainable
  parameters, and with the same A and B the same outputs and gradients.
- `rank_sweep`, `sweep_finding`: rank 1-64 on the attention projections and on every Linear layer against full
  fine-tuning and head-only: trainable share, optimizer state, activations, step time, accuracy.
- `transformer_source`, `transformer_finetune`: a transformers model with PEFT (a hub model at ``full`` online, a
  model saved locally from a small config otherwise: the same code path).
- `qlora_comparison`, `qlora_finding`: the base in 4-bit NF4 (bitsandbytes) against a bf16 base, LoRA on both.
- `merge_comparison`, `merge_finding`: merged against unmerged inference, outputs and latency.
- `panel_run`, `LoRARun`: the panel; `own_count_numbers`: exercise ``08.own_count``.

The mechanism is in `labkit.techniques.lora`. PEFT and transformers (the ``lora`` extra) are imported only
by the functions that use them, so that ``import labkit`` never pays for them.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import logging
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ... import config, data, measure, models, results, train
from ...config import RunConfig
from ...data import cache_dir
from ...env import Profile, env_report, import_bitsandbytes, is_online, profile, resolve_device
from ...errors import ConfigError, UnsupportedError
from ...inference import example_batch, latencies
from ...measure import accuracy_noise
from ...messages import worded, wrap
from ...techniques import quantization
from ...techniques.lora import (
    ALL_LINEAR,
    LoRALinear,
    add_lora,
    lora_layers,
    matching_linears,
    merge_and_unload,
)
from ...techniques.precision import autocast, resolve_precision
from ...units import mib
from ...validate import is_int

VIT = "tiny_vit"
ATTENTION = ("qkv",)  # tiny_vit computes q, k and v with one Linear (as timm's ViT does)
TARGETS = {"qkv": ATTENTION, ALL_LINEAR: ALL_LINEAR}  # the panel's and the sweep's choices
ALPHA = 16.0
# LoRA trains a few small matrices from zero (B) and wants a larger step than full fine-tuning, which moves
# every pretrained weight (the paper used 4e-4 to 5e-4 for LoRA on RoBERTa-base against 1e-5 to 3e-5 in full).
LORA_LR = 3e-3
MERGE_RANK = 8  # merge_comparison's fine-tune, kept with its weights by rank_sweep
RANKS = {"ci": (2, 8), "quick": (1, 8, 64), "full": (1, 2, 4, 8, 16, 32, 64)}  # each with MERGE_RANK
# QLoRA's runs take this share of the profile's steps: memory and step time settle within a few steps, and the
# bases are compared with each other, at the same steps.
QLORA_STEP_SHARE = 0.5
# The LoRA paper's RoBERTa-base row (Hu et al. 2021, table 2): rank 8 on W_q and W_v of 12 layers of width 768.
PAPER = {"layers": 12, "hidden": 768, "rank": 8, "targets": ("query", "value"), "trainable": 294_912}
HUB_MODEL = "google/vit-base-patch16-224-in21k"  # ImageNet-21k pretrained ViT-base (86 M), on Colab/Kaggle
SMALL_VIT = {"image_size": 32, "patch_size": 4, "hidden_size": 128, "num_hidden_layers": 4,
             "num_attention_heads": 4, "intermediate_size": 256}  # the offline stand-in, tiny_vit's size
TRANSFORMER_STEPS = {"ci": 8, "quick": 40, "full": 150}
LATENCY_BATCH = 64


# --- optional libraries ----------------------------------------------------------------------------------


def _quiet_import(name: str):
    """Import ``name`` (peft, transformers) or say how to install it. peft imports torchao and bitsandbytes when
    they are installed, whose import-time notices would otherwise land under the notebook cell."""
    if importlib.util.find_spec(name) is None:
        raise UnsupportedError("library", name, f"{name} is not installed",
                               "pip install 'labkit-finetune[lora]' (peft and transformers) and restart the kernel")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    # PEFT 0.21 reads a transformers attribute that transformers 5 deprecated; nothing for a learner to change
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
    if importlib.util.find_spec("bitsandbytes") is not None:
        import_bitsandbytes()
    module = importlib.import_module(name)
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


# --- workload -------------------------------------------------------------------------------------------


def workload(prof: Profile | None = None) -> RunConfig:
    """The notebook's fine-tune: labkit's pretrained ``tiny_vit`` on the profile's data and steps (full fine-tuning).

    Example:
        >>> cfg = workload(labkit.profile("ci")); cfg.model
        'tiny_vit'
    """
    return config.baseline(prof or profile(), model=VIT, image_size=None)


def targets_label(targets) -> str:
    """``("qkv",)`` -> ``"qkv"``; ``"all-linear"`` stays."""
    return targets if isinstance(targets, str) else ",".join(targets)


def lora_config(cfg: RunConfig, rank: int, targets="qkv", alpha: float = ALPHA, lr: float = LORA_LR) -> RunConfig:
    """``cfg`` with LoRA adapters of ``rank`` on ``targets`` (a key of `TARGETS` or layer-name suffixes).

    Example:
        >>> lora_config(workload(), 8, "qkv").lora_targets
        ('qkv',)
    """
    targets = TARGETS.get(targets, targets) if isinstance(targets, str) else targets
    return cfg.replace(lora_rank=rank, lora_targets=targets, lora_alpha=alpha, lr=lr)


# --- 1. the mechanism -----------------------------------------------------------------------------------


class SeedLoRALayer(nn.Module):
    """The seed's LoRA layer, kept as it was: wrong on purpose (see seed_snippet_problems)."""

    def __init__(self, in_features, out_features, rank=4):
        super().__init__()
        self.A = nn.Parameter(torch.randn(in_features, rank))
        self.B = nn.Parameter(torch.zeros(rank, out_features))

    def forward(self, x):
        return x @ self.weight.T + x @ self.A @ self.B


def seed_snippet() -> str:
    """The seed's layer as source text (`SeedLoRALayer`)."""
    return inspect.getsource(SeedLoRALayer)


def _error_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def seed_snippet_problems(in_features: int = 128, out_features: int = 384, rank: int = 4,
                          alpha: float = ALPHA) -> pd.DataFrame:
    """Run the seed's layer and say, problem by problem, what happens, beside what a correct layer does.

    Example:
        >>> seed_snippet_problems()[["problem", "what happens"]]
    """
    torch.manual_seed(0)
    x = torch.randn(4, in_features)
    seed = SeedLoRALayer(in_features, out_features, rank)
    rows = []
    try:
        seed(x)
        happened = "it ran"
    except AttributeError as error:
        happened = _error_line(error)
    rows.append({"problem": "self.weight is never defined (no frozen base layer)", "what happens": happened,
                 "correct layer": "wraps the pretrained nn.Linear and freezes it"})
    base = nn.Linear(in_features, out_features)
    rows.append({"problem": "A is in x rank, B rank x out: transposed against nn.Linear's (out, in)",
                 "what happens": _merge_transposed(rank),
                 "correct layer": "A is rank x in, B out x rank: B @ A has W's shape, merging is W + s B A"})
    good = LoRALinear(base, rank, alpha)
    seed.B.data.normal_()  # as after some training
    good.lora_B.data.copy_(seed.B.data.T)
    with torch.no_grad():
        seed_update = (x @ seed.A @ seed.B).norm()
        good_update = ((x @ seed.A @ seed.B) * good.scaling).norm()
    rows.append({"problem": f"no alpha / rank scaling (here {alpha:g} / {rank} = {alpha / rank:g})",
                 "what happens": f"the update is {float(seed_update / good_update):.3g}x the scaled one, and its "
                                 "size changes with the rank, so every rank needs its own learning rate",
                 "correct layer": "y = W x + b + (alpha / rank) B A x"})
    a_std = float(seed.A.detach().std())
    rows.append({"problem": "A starts from randn (std 1)",
                 "what happens": f"A's std is {a_std:.2f}, {a_std / float(good.lora_A.detach().std()):.0f}x nn.Linear's",
                 "correct layer": "Kaiming-uniform A (as nn.Linear's weight), zero B: starts equal to the base"})
    return pd.DataFrame(rows)


def _merge_transposed(rank: int) -> str:
    """Merging the seed's update (A @ B, in x out) into W (out x in): an error, or worse, silence on a square layer."""
    torch.manual_seed(0)
    wide = nn.Linear(128, 384)
    A, B = torch.randn(128, rank), torch.randn(rank, 384)
    try:
        wide.weight.data + A @ B
        wide_says = "runs"
    except RuntimeError:
        wide_says = "is a RuntimeError on a 128 -> 384 layer (W is 384 x 128, A @ B is 128 x 384)"
    square = nn.Linear(128, 128)
    A, B = torch.randn(128, rank) * 0.1, torch.randn(rank, 128) * 0.1
    x = torch.randn(8, 128)
    with torch.no_grad():
        unmerged = square(x) + x @ A @ B
        merged = F.linear(x, square.weight + A @ B, square.bias)
    return (f"merging W + A @ B {wide_says}; a square 128 -> 128 layer merges without an error but adds the "
            f"transpose: outputs off by up to {float((merged - unmerged).abs().max()):.3g}")


# --- 2. trainable parameters without training ------------------------------------------------------------


def _fresh_model(cfg: RunConfig, pretrained: bool = False) -> nn.Module:
    """``cfg.model`` with ``cfg``'s classes: random weights, or its pretrained start (``cfg.pretrained``)."""
    split = train.run_splits(cfg, training=False)["train"]
    torch.manual_seed(cfg.seed)
    return models.build(cfg.model, split.num_classes, pretrained=pretrained and cfg.pretrained)[0]


def target_table(cfg: RunConfig, ranks=(1, 8, 64), targets=tuple(TARGETS)) -> pd.DataFrame:
    """Trainable parameters of ``cfg.model`` with LoRA at each rank on each target set (no training).

    Columns: targets, rank, layers (adapted), trainable (adapters plus the head), share (of the model).

    Example:
        >>> target_table(workload(), ranks=(1, 8))
    """
    rows = []
    for label in targets:
        for rank in ranks:
            model = add_lora(_fresh_model(cfg), rank, ALPHA, TARGETS.get(label, label))
            total, trainable = measure.count_parameters(model)
            rows.append({"targets": label, "rank": rank, "layers": len(lora_layers(model)), "trainable": trainable,
                         "adapters": sum(p.numel() for n, p in model.named_parameters() if "lora_" in n),
                         "share": trainable / total})
    return pd.DataFrame(rows)


def paper_count(rank: int = PAPER["rank"], targets=PAPER["targets"]) -> dict:
    """The LoRA paper's RoBERTa-base count, checked: a RoBERTa-base-sized model (12 layers, hidden 768) built from
    a config with random weights on the ``meta`` device (no download, no memory), LoRA by `add_lora` and by PEFT.

    Returns:
        dict: layers, hidden, rank, targets, adapted (layers), trainable (adapters only: the paper counts no
        head), peft_trainable, paper (294,912 for rank 8), total (the model's parameters).
    """
    transformers = _quiet_import("transformers")
    peft = _quiet_import("peft")
    roberta = transformers.RobertaConfig(num_hidden_layers=PAPER["layers"], hidden_size=PAPER["hidden"])
    with torch.device("meta"):
        ours = add_lora(transformers.RobertaModel(roberta, add_pooling_layer=False), rank, ALPHA, targets)
        theirs = peft.get_peft_model(transformers.RobertaModel(roberta, add_pooling_layer=False),
                                     peft.LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=list(targets)))
    total, trainable = measure.count_parameters(ours)
    return {"layers": roberta.num_hidden_layers, "hidden": roberta.hidden_size, "rank": rank,
            "targets": ",".join(targets), "adapted": len(lora_layers(ours)), "trainable": trainable,
            "peft_trainable": measure.count_parameters(theirs)[1],
            "paper": PAPER["trainable"] * rank // PAPER["rank"], "total": total - trainable}


# --- 3. against PEFT ---------------------------------------------------------------------------------------


def _head_module_names(model: nn.Module) -> list[str]:
    """PEFT's ``modules_to_save`` for a labkit model: its head stage (trained in full, as `add_lora` does)."""
    head = models.named_stages(model)[-1][1]
    return [name for name, m in model.named_modules() if m is head]


def to_peft(model: nn.Module, rank: int, alpha: float, targets, dropout: float = 0.0) -> nn.Module:
    """``peft.get_peft_model`` on a copy of ``model`` with the targets `add_lora` takes (and a labkit model's head
    in ``modules_to_save``).

    Example:
        >>> peft_model = to_peft(model, 8, 16, ["qkv"])
    """
    peft = _quiet_import("peft")
    names = matching_linears(model, targets)  # the same layers add_lora adapts; errors named the same way
    labkit_head = getattr(models.unwrap(model), "labkit_name", None) is not None
    lora = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=names,
                           modules_to_save=_head_module_names(model) if labkit_head else None)
    return peft.get_peft_model(copy.deepcopy(model), lora)


def copy_adapters(ours: nn.Module, theirs: nn.Module) -> int:
    """Copy every `LoRALinear`'s A and B into the PEFT model's ``lora_A`` / ``lora_B``; returns how many layers."""
    copied = 0
    for name, layer in lora_layers(ours).items():
        target = theirs.base_model.model.get_submodule(name)
        with torch.no_grad():
            target.lora_A["default"].weight.copy_(layer.lora_A)
            target.lora_B["default"].weight.copy_(layer.lora_B)
        copied += 1
    return copied


def peft_comparison(cfg: RunConfig, rank: int = 8, targets=tuple(TARGETS)) -> pd.DataFrame:
    """labkit's `add_lora` against ``peft.get_peft_model`` on ``cfg.model``'s pretrained weights, per target set:
    trainable parameters of each, and with the same A and B (B set to random values, as after training) the
    largest output and gradient differences over a training batch.
    """
    rows = []
    split = train.run_splits(cfg)["train"]
    x = data.to_model_input(split.images[:16], split, "cpu")
    y = split.labels[:16]
    for label in targets:
        pretrained = _fresh_model(cfg, pretrained=True)
        theirs = to_peft(pretrained, rank, ALPHA, TARGETS.get(label, label))
        ours = add_lora(copy.deepcopy(pretrained), rank, ALPHA, TARGETS.get(label, label))
        for layer in lora_layers(ours).values():
            nn.init.normal_(layer.lora_B, std=0.02)
        copy_adapters(ours, theirs)
        outputs, grads = [], []
        for model in (ours, theirs):
            model.train()
            out = model(x)
            F.cross_entropy(out, y).backward()
            outputs.append(out.detach())
            # PEFT's names: base_model.model.<layer>.lora_A.default.weight; labkit's: <layer>.lora_A
            grads.append({n.removeprefix("base_model.model.").replace(".default.weight", ""): p.grad
                          for n, p in model.named_parameters() if "lora_" in n})
        grad_diff = max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0])
        rows.append({"targets": label, "rank": rank, "layers": len(lora_layers(ours)),
                     "labkit_trainable": measure.count_parameters(ours)[1],
                     "peft_trainable": measure.count_parameters(theirs)[1],
                     "max_output_diff": float((outputs[0] - outputs[1]).abs().max()),
                     "max_grad_diff": grad_diff, "max_grad": max(float(g.abs().max()) for g in grads[0].values())})
    return pd.DataFrame(rows)


# --- 4. the sweep ------------------------------------------------------------------------------------------


def sweep_configs(cfg: RunConfig, ranks=None, targets=tuple(TARGETS)) -> dict[str, RunConfig]:
    """The sweep's runs by label: full fine-tuning, head-only, and LoRA at each rank on each target set."""
    ranks = RANKS[profile().name] if ranks is None else tuple(ranks)
    for rank in ranks:
        if not is_int(rank) or rank < 1:
            raise ConfigError("ranks", list(ranks), "positive integers (LoRA ranks), e.g. [1, 4, 16, 64]")
    runs = {"full fine-tune": cfg, "head only": cfg.replace(freeze="head_only", lr=LORA_LR)}
    for label in targets:
        for rank in ranks:
            runs[f"LoRA {label} r{rank}"] = lora_config(cfg, rank, label)
    return runs


def rank_sweep(cfg: RunConfig, ranks=None, targets=tuple(TARGETS), refresh: bool = False,
               progress: bool = True) -> pd.DataFrame:
    """Fine-tune ``cfg`` in full, head-only, and with LoRA at each rank on each target set (same steps and data).

    Columns: setup, method (full / head only / LoRA), targets, rank, num_trainable_params, trainable_share,
    mem_optimizer_state_bytes, mem_gradients_bytes, mem_activations_bytes, peak_memory_bytes, step_time_s,
    accuracy, lr, error.

    Example:
        >>> frame = rank_sweep(workload(), ranks=(2, 16))
    """
    runs = sweep_configs(cfg, ranks, targets)
    keep = lora_config(cfg, MERGE_RANK, "qkv")  # with its weights too: merge_comparison starts from this fine-tune
    others = [c for c in runs.values() if c != keep]
    done = dict(zip(others, results.run_configs(others, refresh=refresh, progress=progress), strict=True))
    if keep in runs.values():
        done[keep] = results.cached_model(keep, refresh=refresh, progress=progress)[1]
    frame = results.to_frame([done[c] for c in runs.values()])
    frame.insert(0, "setup", list(runs))
    frame["method"] = ["LoRA" if label.startswith("LoRA") else label for label in runs]
    frame["targets"] = [targets_label(c.lora_targets) if c.lora_rank else "-" for c in runs.values()]
    frame["rank"] = [c.lora_rank or 0 for c in runs.values()]
    frame["trainable_share"] = frame.num_trainable_params / frame.num_params
    return frame


def sweep_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The sweep's columns a reader compares, in display units (MiB, ms, %)."""
    shown = pd.DataFrame({
        "setup": frame.setup, "trainable": frame.num_trainable_params,
        "trainable %": (frame.trainable_share * 100).round(2),
        "optimizer state MiB": (frame.mem_optimizer_state_bytes / 2**20).round(2),
        "activations MiB": (frame.mem_activations_bytes / 2**20).round(1),
        "peak MiB": (frame.peak_memory_bytes / 2**20).round(1),
        "step ms": (frame.step_time_s * 1e3).round(1), "accuracy %": (frame.accuracy * 100).round(1)})
    return shown


def sweep_chart_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The sweep's LoRA rows, plus full fine-tuning and head-only drawn flat across the LoRA ranks (each one run,
    repeated at every rank so that it shows as a line to compare with), ``targets`` naming each line."""
    lora = frame[frame.method == "LoRA"]
    ranks = sorted(lora["rank"].unique())
    flat = [frame[frame.method == method].iloc[[0] * len(ranks)].assign(rank=ranks, targets=method)
            for method in ("full fine-tune", "head only") if (frame.method == method).any()]
    return pd.concat([lora, *flat], ignore_index=True)


def _row(frame: pd.DataFrame, setup: str) -> pd.Series:
    return frame.set_index("setup").loc[setup]


@worded
def sweep_finding(frame: pd.DataFrame, test_size: int | None = None) -> str:
    """What the sweep shows, worded from its numbers: parameters, state, activations, time, accuracy."""
    ok = frame[frame.error.isna()]
    full, head = _row(ok, "full fine-tune"), _row(ok, "head only")
    lora = ok[ok.method == "LoRA"]
    test_size = test_size or profile().test_size
    noise = accuracy_noise(float(full.accuracy), test_size)
    best = lora.loc[lora.accuracy.idxmax()]
    smallest = lora.loc[lora.num_trainable_params.idxmin()]
    lines = [
        f"Trainable parameters: {smallest.num_trainable_params:,} ({smallest.trainable_share:.1%}, {smallest.setup}) to "
        f"{lora.num_trainable_params.max():,} ({lora.trainable_share.max():.1%}) with LoRA, against "
        f"{int(full.num_trainable_params):,} in full; optimizer state {mib(smallest.mem_optimizer_state_bytes)} to "
        f"{mib(lora.mem_optimizer_state_bytes.max())} against {mib(full.mem_optimizer_state_bytes)}.",
    ]
    act = lora.mem_activations_bytes / full.mem_activations_bytes
    by_targets = "; ".join(f"on {t} {act[lora.targets == t].min():.2f}x to {act[lora.targets == t].max():.2f}x"
                           for t in dict.fromkeys(lora.targets))
    lines.append(f"Activations kept for the backward pass, against full fine-tuning's {mib(full.mem_activations_bytes)}: "
                 f"{by_targets}; head only {head.mem_activations_bytes / full.mem_activations_bytes:.2f}x. A frozen "
                 "Linear keeps no input for its own weight gradient; a LoRA layer keeps its input and A x for the "
                 "adapters' gradients.")
    step = lora.step_time_s / full.step_time_s
    faster = step.min() < 0.95
    lines.append(f"Step time: {step.min():.2f}x to {step.max():.2f}x full fine-tuning's "
                 f"({full.step_time_s * 1e3:.0f} ms): "
                 + ("LoRA saves the frozen weights' gradient matmuls" if faster else "no saving here")
                 + (", and the small adapter matmuls cost more than their FLOPs suggest." if step.max() > 1.0 else "."))
    gap = float(full.accuracy - best.accuracy)
    verdict = ("within the noise of" if abs(gap) <= noise else "below" if gap > 0 else "above")
    lines.append(f"Accuracy: full {full.accuracy:.1%}, head only {head.accuracy:.1%}, best LoRA {best.accuracy:.1%} "
                 f"({best.setup}): {verdict} full fine-tuning (noise ±{noise:.1%} on {test_size} test images).")
    return "\n".join(lines)


# --- 5. a transformers model with PEFT ---------------------------------------------------------------------


def transformer_source(prof: Profile | None = None) -> tuple[str, str]:
    """Where the transformers model comes from: ``(source, what)``. At ``full`` with the network, the hub's
    `HUB_MODEL`; otherwise a transformers ViT of `SMALL_VIT`'s size holding labkit's pretrained ``tiny_vit`` weights
    (`small_vit_from_tiny_vit`), saved once under the data cache and loaded by the same ``from_pretrained`` call."""
    prof = prof or profile()
    if prof.name == "full" and is_online():
        return HUB_MODEL, f"{HUB_MODEL} from the Hugging Face hub (ImageNet-21k pretrained)"
    folder = cache_dir() / "models" / f"small_vit-{results.code_fingerprint()}"
    if not (folder / "config.json").exists():
        small_vit_from_tiny_vit().save_pretrained(folder)
    return str(folder), (f"a transformers ViT saved locally ({SMALL_VIT['num_hidden_layers']} layers, width "
                         f"{SMALL_VIT['hidden_size']}) holding labkit's pretrained tiny_vit weights")


def small_vit_from_tiny_vit() -> nn.Module:
    """A transformers ``ViTForImageClassification`` with labkit's pretrained ``tiny_vit`` weights: the patch embedding,
    positions, each block's LayerNorms, q, k, v (tiny_vit's fused ``qkv`` split in three), output projection and MLP,
    and the final LayerNorm. transformers' ViT adds a class token (zeros here) and classifies from it, where tiny_vit
    averages the tokens, so the two agree block for block, not logit for logit (`labkit`'s tests check the blocks).

    Layers are matched in module order (Linear layers q, k, v, output, fc1, fc2 per block; LayerNorms before and
    after), which is the same in transformers 4 (``query``/``value``) and 5 (``q_proj``/``v_proj``).
    """
    transformers = _quiet_import("transformers")
    ours = models.build(VIT, 10, pretrained=True)[0]
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(**SMALL_VIT, num_labels=10, layer_norm_eps=1e-5))
    theirs = vit.vit
    blocks = [ours.get_submodule(f"block{i + 1}") for i in range(SMALL_VIT["num_hidden_layers"])]
    dim = SMALL_VIT["hidden_size"]
    sources = []
    for block in blocks:
        qkv = block.attn.qkv
        sources += [(qkv.weight[i * dim:(i + 1) * dim], qkv.bias[i * dim:(i + 1) * dim]) for i in range(3)]
        sources += [(m.weight, m.bias) for m in (block.attn.proj, block.mlp[0], block.mlp[2])]
    linears = [m for m in theirs.modules() if isinstance(m, nn.Linear)]
    norms = [m for m in theirs.modules() if isinstance(m, nn.LayerNorm)]
    norm_sources = [m for block in blocks for m in (block.norm1, block.norm2)] + [ours.head[0]]
    if len(linears) != len(sources) or len(norms) != len(norm_sources):
        raise UnsupportedError("transformers", transformers.__version__, "its ViT's layers do not line up with "
                               "tiny_vit's", "the hub model (full profile, online)")
    with torch.no_grad():
        for target, (weight, bias) in zip(linears, sources, strict=True):
            target.weight.copy_(weight)
            target.bias.copy_(bias)
        for target, source in zip(norms, norm_sources, strict=True):
            target.weight.copy_(source.weight)
            target.bias.copy_(source.bias)
        embeddings = theirs.embeddings
        embeddings.patch_embeddings.projection.weight.copy_(ours.stem.proj.weight)
        embeddings.patch_embeddings.projection.bias.copy_(ours.stem.proj.bias)
        embeddings.position_embeddings[:, 1:].copy_(ours.stem.position)
        embeddings.position_embeddings[:, :1].zero_()
        embeddings.cls_token.zero_()
    return vit


def load_transformer(source: str, num_labels: int) -> nn.Module:
    """``AutoModelForImageClassification.from_pretrained(source)`` with a new ``num_labels`` classifier."""
    transformers = _quiet_import("transformers")
    return transformers.AutoModelForImageClassification.from_pretrained(source, num_labels=num_labels,
                                                                         ignore_mismatched_sizes=True)


def attention_targets(model: nn.Module) -> list[str]:
    """The query and value projections' names in a transformers model: ``query``/``value`` (transformers 4's ViT,
    BERT, RoBERTa) or ``q_proj``/``v_proj`` (transformers 5's ViT, LLaMA-style models)."""
    for pair in (["query", "value"], ["q_proj", "v_proj"]):
        try:
            matching_linears(model, pair)
            return pair
        except ConfigError:
            continue
    raise ConfigError("model", type(model).__name__, "a transformer with query/value or q_proj/v_proj Linear layers")


def transformer_finetune(cfg: RunConfig, rank: int = 8, steps: int | None = None, refresh: bool = False) -> dict:
    """Fine-tune a transformers ViT (`transformer_source`) with PEFT's LoRA on query and value for ``steps`` steps.

    Returns a dict: source, what, params, peft_trainable, labkit_trainable (`add_lora` with the same targets on
    the same model plus its classifier), first_loss, last_loss, step_time_s, accuracy, image_size.
    """
    steps = TRANSFORMER_STEPS[profile().name] if steps is None else steps
    if not is_int(steps) or steps < 1:
        raise ConfigError("steps", steps, "a positive integer (optimizer steps)")
    source, what = transformer_source()
    key = f"{results.cache_key(cfg, env_report(cfg.device))}-transformer-{Path(source).name.split('-')[0]}-r{rank}-{steps}"
    return results.cached_record(key, lambda: _transformer_run(cfg, source, what, rank, steps), refresh=refresh)


def _transformer_run(cfg: RunConfig, source: str, what: str, rank: int, steps: int) -> dict:
    peft = _quiet_import("peft")
    splits = train.run_splits(cfg)
    num_labels = splits["train"].num_classes
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = load_transformer(source, num_labels)
    targets = attention_targets(model)
    ours = add_lora(copy.deepcopy(model), rank, ALPHA, targets)
    ours.classifier.requires_grad_(True)  # PEFT's modules_to_save trains it in full; so does labkit's add_lora here
    lora = peft.LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=targets, modules_to_save=["classifier"])
    model = peft.get_peft_model(model, lora).to(device)
    size = model.base_model.model.config.image_size
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LORA_LR)
    loader = data.make_loader(splits["train"], batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed, drop_last=True)
    precision = resolve_precision(cfg.precision, device)
    losses, times, batches = [], [], iter(())
    model.train()
    for _ in range(steps):
        try:
            images, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            images, labels = next(batches)
        x = data.to_model_input(images, splits["train"], device, size=None if size == data.IMAGE_SHAPE[-1] else size)
        measure.synchronize(device)
        start = time.perf_counter()
        with autocast(precision, device):
            loss = F.cross_entropy(model(pixel_values=x).logits, labels.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        measure.synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach()))
    model.eval()
    correct = 0
    test = splits["test"]
    with torch.no_grad():
        for start in range(0, len(test.images), 256):
            x = data.to_model_input(test.images[start:start + 256], test, device, size=None if size == data.IMAGE_SHAPE[-1] else size)
            correct += int((model(pixel_values=x).logits.argmax(1).cpu() == test.labels[start:start + 256]).sum())
    timed = times[1:] or times  # the first step is warm-up (allocations, kernel choice)
    total, trainable = measure.count_parameters(model)
    return {"source": source, "what": what, "params": int(total - trainable), "peft_trainable": int(trainable),
            "labkit_trainable": int(measure.count_parameters(ours)[1]), "first_loss": losses[0],
            "last_loss": sum(losses[-3:]) / len(losses[-3:]), "step_time_s": sorted(timed)[len(timed) // 2],
            "accuracy": correct / len(test.images), "image_size": int(size), "steps": steps,
            "targets": ",".join(targets)}


@worded
def transformer_finding(record: dict) -> str:
    """One line per fact of the transformers run, from its numbers."""
    lines = [f"Model: {record['what']}.",
             f"PEFT trains {record['peft_trainable']:,} of {record['params'] + record['peft_trainable']:,} parameters; "
             f"labkit's add_lora on the same layers and classifier: {record['labkit_trainable']:,}"
             + (" (the same)." if record["peft_trainable"] == record["labkit_trainable"] else " (they differ).")]
    fell = record["last_loss"] < record["first_loss"]
    lines.append(f"Loss {record['first_loss']:.3f} -> {record['last_loss']:.3f} over {record['steps']} steps "
                 f"({'falling' if fell else 'not falling'}), {record['step_time_s'] * 1e3:.0f} ms a step at "
                 f"{record['image_size']}x{record['image_size']}, test accuracy {record['accuracy']:.1%}.")
    return "\n".join(lines)


# --- 6. QLoRA -----------------------------------------------------------------------------------------------


def _base_linear_bytes(model: nn.Module) -> int:
    """Bytes of the frozen base Linear layers' weights (4-bit ones with their block scales)."""
    total = 0
    for layer in lora_layers(model).values():
        weight = layer.base.weight
        total += weight.numel() * weight.element_size()
        state = getattr(weight, "quant_state", None)
        if state is not None:  # one scale per block of 64; double quantization stores them in 8 bits plus their own
            total += state.absmax.numel() * state.absmax.element_size()
            nested = getattr(state, "state2", None)
            if nested is not None:
                total += nested.absmax.numel() * nested.absmax.element_size() + nested.code.numel() * nested.code.element_size()
    return total


NF4 = "NF4 base (QLoRA)"
# bits per weight of NF4 with double quantization: 4-bit codes, an 8-bit scale per block of 64, a float32 scale per
# 256 of those (QLoRA's recipe and bitsandbytes' default)
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
NF4_FLOAT32 = "NF4 base, float32 out"


def _bf16_out(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    return output.to(torch.bfloat16)


def qlora_models(cfg: RunConfig, rank: int = 8) -> dict[str, nn.Module | str]:
    """LoRA (``all-linear``, rank ``rank``, adapters in bf16) on copies of the pretrained model whose body Linear
    layers are: bf16 (``bf16 base``); 4-bit NF4, bitsandbytes' ``Linear4bit`` computing in bf16, passing bf16 on as a
    bf16 model does (`NF4`, QLoRA); and the same NF4 layers as bitsandbytes ships them, which return their input's
    dtype, float32 after a LayerNorm under autocast (`NF4_FLOAT32`). Where NF4 cannot run, its value is the reason."""
    device = resolve_device(cfg.device)
    model = _fresh_model(cfg, pretrained=True)
    bf16 = copy.deepcopy(model)
    for name in matching_linears(bf16, ALL_LINEAR):
        bf16.get_submodule(name).to(torch.bfloat16)
    built = {"bf16 base": add_lora(bf16, rank, ALPHA, ALL_LINEAR, dtype=torch.bfloat16).to(device)}
    reason = quantization.supported("nf4_bnb", device)
    head = [name for name, m in model.named_modules() if m is models.named_stages(model)[-1][1]]
    for setup in (NF4, NF4_FLOAT32):
        if reason is not None:
            built[setup] = reason
            continue
        nf4 = quantization.quantize(model.to(device), "nf4_bnb", keep_float=head)
        for layer in nf4.modules():
            if hasattr(layer, "compute_dtype"):  # QLoRA computes in bf16 (labkit's quantize picks float32 on a CPU)
                layer.compute_dtype = torch.bfloat16
                if setup == NF4:
                    layer.register_forward_hook(_bf16_out)
        built[setup] = add_lora(nf4, rank, ALPHA, ALL_LINEAR, dtype=torch.bfloat16)
    return built


def qlora_comparison(cfg: RunConfig, rank: int = 8, refresh: bool = False) -> pd.DataFrame:
    """Fine-tune LoRA on each of `qlora_models` for ``cfg``'s steps, in bf16 autocast (cached).

    Columns: setup, base_weight_bytes (the frozen Linear weights), peak_memory_bytes, mem_parameters_bytes,
    step_time_s, accuracy, num_trainable_params, error (why NF4 did not run here, if it did not).
    """
    prof = profile()
    fewest = prof.warmup_steps + train.PROFILING_STEPS + 2  # a few timed steps after the untimed ones
    steps = max(fewest, math.ceil((cfg.max_steps or prof.max_steps) * QLORA_STEP_SHARE))
    run_cfg = cfg.replace(precision="bf16", lr=LORA_LR, max_steps=steps, epochs=1)
    return results.cached_frame("lora-qlora", [run_cfg], lambda: pd.DataFrame(_qlora_rows(run_cfg, rank)),
                                refresh=refresh, rank=rank)


def _qlora_rows(cfg: RunConfig, rank: int) -> list[dict]:
    rows = []
    for setup, model in qlora_models(cfg, rank).items():
        if isinstance(model, str):
            rows.append({"setup": setup, "error": model})
            continue
        base_bytes = _base_linear_bytes(model)
        result = train.fit(cfg, model=model, progress=False)
        rows.append({"setup": setup, "base_weight_bytes": base_bytes, "peak_memory_bytes": result.peak_memory_bytes,
                     "mem_parameters_bytes": result.memory.get("parameters"),
                     "mem_activations_bytes": result.memory.get("activations"), "step_time_s": result.step_time_s,
                     "accuracy": result.accuracy, "num_trainable_params": result.num_trainable_params,
                     "precision_used": result.precision_used, "steps": result.steps, "error": result.error,
                     "warnings": " ".join(result.warnings)})
    return rows


def qlora_table(frame: pd.DataFrame) -> pd.DataFrame:
    """`qlora_comparison`'s columns in display units (MiB, ms, %)."""
    if "base_weight_bytes" not in frame:  # NF4 did not run here: the setups and why
        return frame[["setup", "error"]]
    return pd.DataFrame({"setup": frame.setup, "frozen Linear MiB": (frame.base_weight_bytes / 2**20).round(2),
                         "activations MiB": (frame.mem_activations_bytes / 2**20).round(1),
                         "peak MiB": (frame.peak_memory_bytes / 2**20).round(1),
                         "step ms": (frame.step_time_s * 1e3).round(1), "accuracy %": (frame.accuracy * 100).round(1),
                         "error": frame.error.fillna("")})


@worded
def qlora_finding(frame: pd.DataFrame) -> str:
    """What the 4-bit base saved and cost here, and what its float32 outputs cost; or why it did not run."""
    rows = frame.set_index("setup")
    bf16, nf4, passthrough = rows.loc["bf16 base"], rows.loc[NF4], rows.loc[NF4_FLOAT32]
    if isinstance(nf4.get("error"), str) and nf4.get("error"):
        return f"QLoRA did not run here: {nf4.error}. The bf16 base alone: peak {mib(bf16.peak_memory_bytes)}."
    share = nf4.base_weight_bytes / bf16.base_weight_bytes
    saved = bf16.peak_memory_bytes - nf4.peak_memory_bytes
    weights_saved = bf16.base_weight_bytes - nf4.base_weight_bytes
    lines = [f"The frozen Linear weights: {mib(bf16.base_weight_bytes)} in bf16, {mib(nf4.base_weight_bytes)} in NF4 "
             f"with its block scales ({share:.0%}; each layer also keeps a small fixed table); at 7 B parameters: "
             f"{7e9 * 2 / 1e9:.0f} GB in bf16, {7e9 * NF4_BITS / 8 / 1e9:.1f} GB in NF4 ({NF4_BITS:.3f} bits a weight).",
             f"Peak training memory: {mib(bf16.peak_memory_bytes)} -> {mib(nf4.peak_memory_bytes)} "
             f"({nf4.peak_memory_bytes / bf16.peak_memory_bytes:.2f}x): "
             + (f"{mib(saved)} less, of which the weights were {mib(weights_saved)}; the activations "
                f"({mib(bf16.mem_activations_bytes)}) are most of this model's peak" if saved > 0 else
                "no saving: the weights are a small part of this model's peak, which activations dominate") + ".",
             f"With bitsandbytes' layers as shipped (they return their input's dtype: float32 after a LayerNorm under "
             f"autocast) the activations kept for backward are {mib(passthrough.mem_activations_bytes)} against "
             f"{mib(nf4.mem_activations_bytes)}, and the peak {mib(passthrough.peak_memory_bytes)}.",
             f"Step time {bf16.step_time_s * 1e3:.0f} -> {nf4.step_time_s * 1e3:.0f} ms "
             f"({nf4.step_time_s / bf16.step_time_s:.2f}x); accuracy {bf16.accuracy:.1%} -> {nf4.accuracy:.1%}."]
    return "\n".join(lines)


# --- 7. merged against unmerged inference -------------------------------------------------------------------


def merge_comparison(cfg: RunConfig, rank: int = MERGE_RANK, targets="qkv", refresh: bool = False) -> pd.DataFrame:
    """The fine-tuned LoRA model (`lora_config`, cached) unmerged and merged (`merge_and_unload`), against the plain
    base model (timed first and again last: the machine's noise): CPU latency at batch 64 (timed in turns) and the
    largest output difference from the unmerged model. Measured once, then read from the cache.
    """
    lora_cfg = lora_config(cfg, rank, targets)
    return results.cached_frame("lora-merge", [lora_cfg], lambda: _measure_merge(cfg, lora_cfg), refresh=refresh)


def _measure_merge(cfg: RunConfig, lora_cfg: RunConfig) -> pd.DataFrame:
    trained, _ = results.cached_model(lora_cfg, progress=False)
    unmerged = copy.deepcopy(trained).cpu().eval()
    merged = merge_and_unload(copy.deepcopy(unmerged))
    base = _fresh_model(cfg, pretrained=True).eval()
    x = example_batch(cfg, LATENCY_BATCH, device=torch.device("cpu"))
    # the base twice, first and last: how far two timings of one model differ here (the machine's noise)
    times = latencies([base, unmerged, merged, copy.deepcopy(base)], x)
    with torch.no_grad():
        reference = unmerged(x)
        diffs = [math.nan, 0.0, float((merged(x) - reference).abs().max()), math.nan]
    return pd.DataFrame({"setup": ["base model (no adapters)", "LoRA, unmerged", "LoRA, merged", "base model, timed again"],
                         "latency_s": times, "vs_base": [t / times[0] for t in times], "max_output_diff": diffs,
                         "lora_layers": [0, len(lora_layers(unmerged)), len(lora_layers(merged)), 0]})


def merge_table(frame: pd.DataFrame) -> pd.DataFrame:
    """`merge_comparison`'s columns in display units."""
    return pd.DataFrame({"setup": frame.setup, "latency ms": (frame.latency_s * 1e3).round(2),
                         "vs base": frame.vs_base.round(3), "largest output difference": frame.max_output_diff.map(
                             lambda d: "-" if math.isnan(d) else f"{d:.1e}"), "LoRA layers": frame.lora_layers})


@worded
def merge_finding(frame: pd.DataFrame) -> str:
    rows = frame.set_index("setup")
    unmerged, merged = rows.loc["LoRA, unmerged"], rows.loc["LoRA, merged"]
    noise = abs(rows.loc["base model, timed again"].vs_base - 1)
    within = abs(merged.vs_base - 1) <= max(noise, 0.02)
    return (f"Unmerged: {unmerged.vs_base:.2f}x the base model's latency (two extra thin matmuls per adapted layer); "
            f"merged: {merged.vs_base:.2f}x, with the same layers as the base"
            + (", the same within the noise" if within else "")
            + f" (the base timed twice differed by {noise:.0%}); merged outputs within {merged.max_output_diff:.1e} of "
            "the unmerged model's (float rounding).")


# --- 8. the panel and the exercise ---------------------------------------------------------------------------


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
    accuracy: float | None
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return wrap(f"LoRA rank {self.lora_rank} on {self.targets}, alpha {self.lora_alpha:g}: "
                f"{self.num_trainable_params:,} trainable ({self.trainable_share:.2%}), peak "
                f"{mib(self.peak_memory_bytes)}, {self.step_time_s * 1e3:.0f} ms a step, accuracy "
                f"{self.accuracy:.1%}")


def panel_config(cfg: RunConfig) -> RunConfig:
    """The panel's starting point: LoRA rank 8 on ``qkv``, alpha 16, at LoRA's learning rate."""
    return cfg.replace(lora_rank=8, lora_targets="qkv", lora_alpha=ALPHA, lr=LORA_LR)


def panel_run(cfg: RunConfig, on_step=None, progress: bool = False) -> LoRARun:
    """Fine-tune ``cfg`` (its ``lora_rank``, ``lora_alpha``, ``lora_targets``) through the cache; the panel's run."""
    if cfg.lora_rank is None:
        raise ConfigError("lora_rank", cfg.lora_rank, "a positive integer (the panel trains LoRA adapters)")
    result = results.cached_fit(cfg, progress=progress, on_step=on_step)
    return LoRARun(lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, targets=targets_label(cfg.lora_targets),
                   num_trainable_params=result.num_trainable_params,
                   trainable_share=result.num_trainable_params / result.num_params,
                   peak_memory_bytes=result.peak_memory_bytes,
                   mem_optimizer_state_bytes=result.memory.get("optimizer_state"), step_time_s=result.step_time_s,
                   accuracy=result.accuracy, warnings=list(result.warnings))


def own_count_numbers(frame: pd.DataFrame, targets: str = "qkv") -> dict:
    """Exercise ``08.own_count``'s numbers from the learner's sweep: the trainable parameters at the two ranks of
    ``targets`` furthest apart, and a rank to predict."""
    rows = frame[(frame.targets == targets) & frame.error.isna()].sort_values("rank")
    if len(rows) < 2:
        raise ConfigError("frame", f"{len(rows)} LoRA rows on {targets}", "a sweep with at least two ranks")
    low, high = rows.iloc[0], rows.iloc[-1]
    return {"rank_low": int(low["rank"]), "trainable_low": int(low.num_trainable_params),
            "rank_high": int(high["rank"]), "trainable_high": int(high.num_trainable_params),
            "rank_new": int(high["rank"]) * 2}


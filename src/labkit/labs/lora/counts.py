"""Sections 2 and 3 of notebook 08: trainable parameters without training, the LoRA paper's count, and PEFT.

`target_table` counts the trainable parameters per rank and target set; `paper_count` rebuilds the paper's
294,912 for a RoBERTa-base-sized model (rank 8 on query and value) from a config on the ``meta`` device, by
`add_lora` and by PEFT; `peft_comparison` gives both the same A and B and compares outputs and gradients.
"""

from __future__ import annotations

import copy

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ... import data, measure, models, train
from ...config import RunConfig
from ...techniques.lora import add_lora, lora_layers, matching_linears
from .base import ALPHA, TARGETS, fresh_model, quiet_import

# The LoRA paper's RoBERTa-base row (Hu et al. 2021, table 2): rank 8 on W_q and W_v of 12 layers of width 768.
PAPER = {"layers": 12, "hidden": 768, "rank": 8, "targets": ("query", "value"), "trainable": 294_912}


def target_table(cfg: RunConfig, ranks=(1, 8, 64), targets=tuple(TARGETS)) -> pd.DataFrame:
    """Trainable parameters of ``cfg.model`` with LoRA at each rank on each target set, without training.

    Args:
        cfg: the workload. ranks: the LoRA ranks. targets: keys of `TARGETS` or layer-name suffixes.

    Returns:
        DataFrame: targets, rank, layers (adapted), adapter_params, trainable_params (adapters and head),
        trainable_share (of the model's parameters).
    """
    rows = []
    for label in targets:
        for rank in ranks:
            model = add_lora(fresh_model(cfg), rank, ALPHA, TARGETS.get(label, label))
            total, trainable = measure.count_parameters(model)
            rows.append({"targets": label, "rank": rank, "layers": len(lora_layers(model)),
                         "adapter_params": sum(p.numel() for n, p in model.named_parameters() if "lora_" in n),
                         "trainable_params": trainable, "trainable_share": trainable / total})
    return pd.DataFrame(rows)


def paper_count(rank: int = PAPER["rank"], targets=PAPER["targets"]) -> dict:
    """The LoRA paper's RoBERTa-base count, by `add_lora` and by PEFT, on random weights on the ``meta`` device.

    Args:
        rank: the LoRA rank. targets: the adapted layers' names.

    Returns:
        dict: layers, hidden, rank, targets, adapted (layers), trainable (adapters only: the paper counts no head),
        peft_trainable, paper (294,912 for rank 8), total (the model's parameters).
    """
    transformers = quiet_import("transformers")
    peft = quiet_import("peft")
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


def _head_module_names(model: nn.Module) -> list[str]:
    """PEFT's ``modules_to_save`` for a labkit model: its head stage (trained in full, as `add_lora` does)."""
    head = models.named_stages(model)[-1][1]
    return [name for name, m in model.named_modules() if m is head]


def to_peft(model: nn.Module, rank: int, alpha: float, targets, dropout: float = 0.0) -> nn.Module:
    """``peft.get_peft_model`` on a copy of ``model``, adapting the layers `add_lora` would.

    Args:
        model: the model (a labkit model's head goes to ``modules_to_save``). rank, alpha, dropout: LoRA's.
        targets: layer-name suffixes, as `add_lora` takes them.

    Example:
        >>> peft_model = to_peft(model, 8, 16, ["qkv"])
    """
    peft = quiet_import("peft")
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
    """`add_lora` against ``peft.get_peft_model`` on ``cfg.model``'s pretrained weights, per target set.

    Args:
        cfg: the workload. rank: the LoRA rank. targets: keys of `TARGETS` or layer-name suffixes.

    Returns:
        DataFrame: targets, rank, layers, labkit_trainable_params, peft_trainable_params, and with the same A and
        B (B random, as after training) over a training batch: max_output_diff, max_grad_diff, max_grad.
    """
    rows = []
    split = train.run_splits(cfg)["train"]
    x = data.to_model_input(split.images[:16], split, "cpu")
    y = split.labels[:16]
    for label in targets:
        pretrained = fresh_model(cfg, pretrained=True)
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
                     "labkit_trainable_params": measure.count_parameters(ours)[1],
                     "peft_trainable_params": measure.count_parameters(theirs)[1],
                     "max_output_diff": float((outputs[0] - outputs[1]).abs().max()),
                     "max_grad_diff": grad_diff, "max_grad": max(float(g.abs().max()) for g in grads[0].values())})
    return pd.DataFrame(rows)

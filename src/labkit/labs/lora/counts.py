"""Sections 2 and 3 of notebook 08: trainable parameters without training, the LoRA paper's count, and PEFT.

`target_table` counts the trainable parameters per rank and target set; `paper_count` rebuilds the paper's
294,912 for a RoBERTa-base-sized model (rank 8 on query and value) from a config on the ``meta`` device, by
`add_lora` and by PEFT; `peft_comparison` gives both the same A and B on the language model and compares outputs
and gradients; `peft_roundtrip` saves PEFT's adapter with ``save_pretrained``, loads it onto a fresh base, merges
it, and weighs the adapter's file against the model's.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from ... import measure, text, train
from ...config import RunConfig
from ...messages import worded
from ...techniques.lora import add_lora, lora_layers, matching_linears, merge_and_unload, trained_head
from ...techniques.token_loss import forward_inputs, token_loss_sum
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


def _head_module_names(model: nn.Module) -> list[str] | None:
    """PEFT's ``modules_to_save``: the stage `add_lora` trains in full (`trained_head`), or None (a language model)."""
    head = trained_head(model)
    return None if head is None else [name for name, m in model.named_modules() if m is head]


def to_peft(model: nn.Module, rank: int, alpha: float, targets, dropout: float = 0.0) -> nn.Module:
    """``peft.get_peft_model`` on a copy of ``model``, adapting the layers `add_lora` would and training the same head.

    Args:
        model: the model. rank, alpha, dropout: LoRA's. targets: layer-name suffixes, as `add_lora` takes them.

    Example:
        >>> peft_model = to_peft(model, 8, 16, ["q_proj", "v_proj"])
    """
    peft = quiet_import("peft")
    names = matching_linears(model, targets)  # the same layers add_lora adapts; errors named the same way
    lora = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=names,
                           modules_to_save=_head_module_names(model))
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


def _example_batch(cfg: RunConfig, rows: int = 16) -> text.TokenBatch:
    """The first ``rows`` training examples, padded to the longest (the model's input and labels)."""
    split = train.run_splits(cfg)["train"]
    return text.collate([split[i] for i in range(min(rows, len(split)))])


def _loss(model: nn.Module, batch: text.TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(**forward_inputs(batch)).logits
    return logits, token_loss_sum(logits, batch.labels) / batch.counts().label_tokens


def _random_b(model: nn.Module) -> nn.Module:
    """B random, as after training (a zero B would hide the update and its A gradients)."""
    torch.manual_seed(0)
    for layer in lora_layers(model).values():
        nn.init.normal_(layer.lora_B, std=0.02)
    return model


def peft_comparison(cfg: RunConfig, rank: int = 8, targets=tuple(TARGETS)) -> pd.DataFrame:
    """`add_lora` against ``peft.get_peft_model`` on ``cfg.model``'s pretrained weights, per target set.

    Args:
        cfg: the workload. rank: the LoRA rank. targets: keys of `TARGETS` or layer-name suffixes.

    Returns:
        DataFrame: targets, rank, layers, labkit_trainable_params, peft_trainable_params, and with the same A and
        B (B random, as after training) over a training batch: max_output_diff (logits), max_grad_diff, max_grad.
    """
    rows = []
    batch = _example_batch(cfg)
    for label in targets:
        pretrained = fresh_model(cfg, pretrained=True)
        theirs = to_peft(pretrained, rank, ALPHA, TARGETS.get(label, label))
        ours = _random_b(add_lora(copy.deepcopy(pretrained), rank, ALPHA, TARGETS.get(label, label)))
        copy_adapters(ours, theirs)
        outputs, grads = [], []
        for model in (ours, theirs):
            model.train()
            logits, loss = _loss(model, batch)
            loss.backward()
            outputs.append(logits.detach())
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


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def peft_roundtrip(cfg: RunConfig, rank: int = 8, targets="q_proj,v_proj") -> dict:
    """Save a PEFT adapter with ``save_pretrained``, load it onto a fresh base, merge it; sizes and output checks.

    Args:
        cfg: the workload. rank, targets: the adapter's (a key of `TARGETS` or layer-name suffixes).

    Returns:
        dict: adapter_bytes (``save_pretrained``'s folder: weights and config), model_bytes (the base model saved
        the same way), adapter_share, reload_diff (reloaded against saved, logits), merge_diff (PEFT's
        ``merge_and_unload`` against labkit's, logits), lora_layers_after_merge (0: plain Linear layers again).
    """
    peft = quiet_import("peft")
    batch = _example_batch(cfg)
    base = fresh_model(cfg, pretrained=True).eval()
    ours = _random_b(add_lora(copy.deepcopy(base), rank, ALPHA, TARGETS.get(targets, targets))).eval()
    saved = to_peft(base, rank, ALPHA, TARGETS.get(targets, targets))
    copy_adapters(ours, saved)
    saved.eval()
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        adapter_dir, model_dir = Path(folder) / "adapter", Path(folder) / "model"
        saved.save_pretrained(adapter_dir)  # only the adapters and their LoraConfig
        base.save_pretrained(model_dir)
        reloaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), adapter_dir).eval()
        reference = saved(**forward_inputs(batch)).logits
        reload_diff = float((reloaded(**forward_inputs(batch)).logits - reference).abs().max())
        merged = reloaded.merge_and_unload()
        ours_merged = merge_and_unload(ours)
        merge_diff = float((merged(**forward_inputs(batch)).logits - ours_merged(**forward_inputs(batch)).logits)
                           .abs().max())
        adapter_bytes, model_bytes = _folder_bytes(adapter_dir), _folder_bytes(model_dir)
    return {"adapter_bytes": adapter_bytes, "model_bytes": model_bytes, "adapter_share": adapter_bytes / model_bytes,
            "reload_diff": reload_diff, "merge_diff": merge_diff,
            "lora_layers_after_merge": sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in merged.modules())}


@worded
def roundtrip_finding(saved: dict) -> str:
    """One line: the adapter's file against the model's, and how exactly it reloaded and merged.

    Args:
        saved: `peft_roundtrip`'s.
    """
    return (f"The adapter's files take {saved['adapter_bytes'] / 1e3:,.0f} kB against the model's "
            f"{saved['model_bytes'] / 1e6:,.1f} MB ({saved['adapter_share']:.2%}); reloaded, its logits are within "
            f"{saved['reload_diff']:.1e} of the saved model's; PEFT's merge against labkit's: "
            f"{saved['merge_diff']:.1e}.")

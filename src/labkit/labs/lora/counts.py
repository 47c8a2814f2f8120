"""Sections 2, 3 and 7 of notebook 08: trainable parameters, the LoRA paper's count, PEFT, merged inference."""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from ... import measure, results
from ...config import RunConfig
from ...env import profile
from ...inference import LogitsOnly, latencies, prompt_ids
from ...labresult import LabResult
from ...measure import compare
from ...messages import worded
from ...runsetup import set_up
from ...techniques.lora import add_lora, lora_layers, matching_linears, merge_and_unload, trained_head
from ...techniques.token_loss import forward_inputs, token_loss_sum
from .base import ALPHA, MERGE_RANK, TARGETS, fresh_model, lora_config, quiet_import

# The LoRA paper's RoBERTa-base row (Hu et al. 2021, table 2): rank 8 on W_q and W_v of 12 layers of width 768.
PAPER = {"layers": 12, "hidden": 768, "rank": 8, "targets": ("query", "value"), "trainable": 294_912}


def target_table(cfg: RunConfig, ranks=(1, 8, 64), targets=tuple(TARGETS)) -> LabResult:
    """Trainable parameters of ``cfg.model`` with LoRA at each rank on each target set, without training."""
    rows = []
    for label in targets:
        for rank in ranks:
            model = add_lora(fresh_model(cfg), rank, ALPHA, TARGETS.get(label, label))
            total, trainable = measure.count_parameters(model)
            rows.append({"targets": label, "rank": rank, "layers": len(lora_layers(model)),
                         "adapter_params": sum(p.numel() for n, p in model.named_parameters() if "lora_" in n),
                         "trainable_params": trainable, "trainable_share": trainable / total})
    return LabResult(pd.DataFrame(rows))


def paper_count(rank: int = PAPER["rank"], targets=PAPER["targets"]) -> dict:
    """The LoRA paper's RoBERTa-base count by `add_lora` and by PEFT, built on the ``meta`` device (no weights)."""
    transformers = quiet_import("transformers")
    peft = quiet_import("peft")
    roberta = transformers.RobertaConfig(num_hidden_layers=PAPER["layers"], hidden_size=PAPER["hidden"])
    with torch.device("meta"):
        ours = add_lora(transformers.RobertaModel(roberta, add_pooling_layer=False), rank, ALPHA, targets)
        theirs = peft.get_peft_model(transformers.RobertaModel(roberta, add_pooling_layer=False),
                                     peft.LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=list(targets)))
    total, trainable = measure.count_parameters(ours)  # the paper counts the adapters alone, no head
    return {"layers": roberta.num_hidden_layers, "hidden": roberta.hidden_size, "rank": rank,
            "targets": ",".join(targets), "adapted": len(lora_layers(ours)), "trainable": trainable,
            "peft_trainable": measure.count_parameters(theirs)[1],
            "paper": PAPER["trainable"] * rank // PAPER["rank"], "total": total - trainable}


def to_peft(model: nn.Module, rank: int, alpha: float, targets, dropout: float = 0.0) -> nn.Module:
    """``peft.get_peft_model`` on a copy of ``model``, adapting the layers `add_lora` would and training its head."""
    peft = quiet_import("peft")
    names = matching_linears(model, targets)  # the same layers add_lora adapts; errors named the same way
    head = trained_head(model)  # PEFT's modules_to_save: the stage add_lora trains in full (none on a language model)
    saved = None if head is None else [name for name, m in model.named_modules() if m is head]
    lora = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=names,
                           modules_to_save=saved)
    return peft.get_peft_model(copy.deepcopy(model), lora)


def _pair(cfg: RunConfig, rank: int, targets) -> tuple[nn.Module, nn.Module, nn.Module]:
    """The pretrained base, labkit's LoRA and PEFT's with the same A and B (B random, as after training)."""
    base = fresh_model(cfg, pretrained=True)
    ours = add_lora(copy.deepcopy(base), rank, ALPHA, TARGETS.get(targets, targets))
    torch.manual_seed(0)
    for layer in lora_layers(ours).values():
        nn.init.normal_(layer.lora_B, std=0.02)
    theirs = to_peft(base, rank, ALPHA, TARGETS.get(targets, targets))
    for name, layer in lora_layers(ours).items():  # ours' A and B into PEFT's lora_A / lora_B
        target = theirs.base_model.model.get_submodule(name)
        with torch.no_grad():
            target.lora_A["default"].weight.copy_(layer.lora_A)
            target.lora_B["default"].weight.copy_(layer.lora_B)
    return base, ours, theirs


def peft_comparison(cfg: RunConfig, rank: int = 8, targets=tuple(TARGETS)) -> LabResult:
    """`add_lora` against ``peft.get_peft_model`` per target set: trainable parameters, logits and gradients."""
    batch = set_up(cfg.replace(device="cpu"), model=False).batch(16)  # on the CPU, where the models are built
    rows = []
    for label in targets:
        _, ours, theirs = _pair(cfg, rank, label)
        outputs, grads = [], []
        for model in (ours, theirs):
            logits = model.train()(**forward_inputs(batch)).logits
            (token_loss_sum(logits, batch.labels) / batch.counts().label_tokens).backward()
            outputs.append(logits.detach())
            # PEFT's names: base_model.model.<layer>.lora_A.default.weight; labkit's: <layer>.lora_A
            grads.append({n.removeprefix("base_model.model.").replace(".default.weight", ""): p.grad
                          for n, p in model.named_parameters() if "lora_" in n})
        rows.append({"targets": label, "rank": rank, "layers": len(lora_layers(ours)),
                     "labkit_trainable_params": measure.count_parameters(ours)[1],
                     "peft_trainable_params": measure.count_parameters(theirs)[1],
                     "max_output_diff": float((outputs[0] - outputs[1]).abs().max()),
                     "max_grad_diff": max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0]),
                     "max_grad": max(float(g.abs().max()) for g in grads[0].values())})
    return LabResult(pd.DataFrame(rows), columns=["targets", "layers", "labkit_trainable_params",
                                                  "peft_trainable_params", "max_output_diff", "max_grad_diff"])


@dataclass
class Roundtrip(LabResult):
    """A PEFT adapter saved, reloaded and merged: its files' bytes and the logits' largest differences (one row)."""

    shown = ("adapter_bytes", "model_bytes", "adapter_share", "reload_diff", "merge_diff")

    @worded
    def finding(self) -> str:
        saved = self.frame.iloc[0]
        return (f"The adapter's files take {saved.adapter_bytes / 1e3:,.0f} kB against the model's "
                f"{saved.model_bytes / 1e6:,.1f} MB ({saved.adapter_share:.2%}); reloaded, its logits are within "
                f"{saved.reload_diff:.1e} of the saved model's; PEFT's merge against labkit's: "
                f"{saved.merge_diff:.1e}.")


def peft_roundtrip(cfg: RunConfig, rank: int = 8, targets="q_proj,v_proj") -> Roundtrip:
    """Save a PEFT adapter with ``save_pretrained``, load it onto a fresh base and merge it, against labkit's."""
    peft = quiet_import("peft")
    batch = set_up(cfg.replace(device="cpu"), model=False).batch(16)
    base, ours, saved = _pair(cfg, rank, targets)
    base, ours, saved = base.eval(), ours.eval(), saved.eval()
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        adapter_dir, model_dir = Path(folder) / "adapter", Path(folder) / "model"
        saved.save_pretrained(adapter_dir)  # only the adapters and their LoraConfig
        base.save_pretrained(model_dir)
        reloaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), adapter_dir).eval()
        logits = [m(**forward_inputs(batch)).logits for m in (saved, reloaded)]
        merged = reloaded.merge_and_unload()
        merge_diff = (merged(**forward_inputs(batch)).logits - merge_and_unload(ours)(**forward_inputs(batch)).logits)
        sizes = [sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in (adapter_dir, model_dir)]
    return Roundtrip(pd.DataFrame([{
        "adapter_bytes": sizes[0], "model_bytes": sizes[1], "adapter_share": sizes[0] / sizes[1],
        "reload_diff": float((logits[1] - logits[0]).abs().max()), "merge_diff": float(merge_diff.abs().max()),
        "lora_layers_after_merge": sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in merged.modules())}]))


SETUPS = ("base model (no adapters)", "LoRA, unmerged", "LoRA, merged", "base model, timed again")


@dataclass
class MergeComparison(LabResult):
    """One forward pass's CPU latency per setup (`SETUPS`), and the outputs' largest difference from unmerged."""

    shown = ("setup", "latency_s", "vs_base", "max_output_diff", "lora_layers")

    @worded
    def finding(self) -> str:
        rows = self.frame.set_index("setup")
        unmerged, merged = rows.loc[SETUPS[1]], rows.loc[SETUPS[2]]
        first, again = rows.loc[SETUPS[0]].latency_s, rows.loc[SETUPS[3]].latency_s
        noise = abs(again - first) / first  # the machine's: two timings of one model, each as uncertain
        base = (first, min(first, again), max(first, again))

        def against_base(latency: float):
            return compare((latency, latency * (1 - noise), latency * (1 + noise)), base, ("faster", "slower"))

        return (f"The base timed twice differed by {noise:.1%}; unmerged LoRA against the base's latency "
                f"{against_base(unmerged.latency_s)}, merged {against_base(merged.latency_s)}; merged outputs "
                f"within {merged.max_output_diff:.1e} of the unmerged model's.")


def merge_comparison(cfg: RunConfig, rank: int = MERGE_RANK, targets="q_proj,v_proj",
                     refresh: bool = False) -> MergeComparison:
    """The base, `rank_sweep`'s LoRA fine-tune unmerged and merged, and the base again, timed in turns (cached)."""
    lora_cfg = lora_config(cfg, rank, targets)
    return MergeComparison(results.cached_frame("lora-merge", [lora_cfg], lambda: _measure_merge(cfg, lora_cfg),
                                                refresh=refresh))


def _measure_merge(cfg: RunConfig, lora_cfg: RunConfig) -> pd.DataFrame:
    trained, _ = results.cached_model(lora_cfg, progress=False)
    unmerged = LogitsOnly(copy.deepcopy(trained).cpu()).eval()
    merged = merge_and_unload(copy.deepcopy(unmerged))
    base = LogitsOnly(fresh_model(cfg, pretrained=True)).eval()
    x = prompt_ids(cfg, profile().latency_batch)
    # the base twice, first and last: how far two timings of one model differ here (the machine's noise)
    times = latencies([base, unmerged, merged, copy.deepcopy(base)], x)
    with torch.no_grad():
        diffs = [math.nan, 0.0, float((merged(x) - unmerged(x)).abs().max()), math.nan]
    return pd.DataFrame({"setup": list(SETUPS), "latency_s": times, "vs_base": [t / times[0] for t in times],
                         "max_output_diff": diffs,
                         "lora_layers": [0, len(lora_layers(unmerged)), len(lora_layers(merged)), 0]})

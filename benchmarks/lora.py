"""LoRA's claims, measured: trainable share and optimizer state at rank 8 on q, v; merged inference latency.

1. A RoBERTa-base-sized encoder (12 layers, hidden 768, random weights: no download) and labkit's ``tiny_vit``,
   LoRA rank 8 on the query and value projections (tiny_vit's fused ``qkv``): the trainable share, and the AdamW
   state after one real optimizer step against full fine-tuning's (``labkit.measure.optimizer_state_bytes``).
2. ``tiny_vit`` fine-tuned with LoRA (notebook 08's rank-8 ``qkv`` run, cached), unmerged and merged
   (``merge_and_unload``) against the base model: CPU latency at batch 64, timed in turns, ``--repeats`` rounds.

The claim (issue 14): rank 8 on q, v trains at most 2 % of the transformer's parameters, its optimizer state shrinks
in proportion, and merged inference is within 5 % of the base model's latency.

Usage: python benchmarks/lora.py [--profile quick] [--repeats 5]
Do not run it while other work loads the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics


def _adamw_state(model, batch):
    import torch

    from labkit import measure

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    out = model(**batch) if isinstance(batch, dict) else model(batch)
    logits = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
    logits.float().pow(2).mean().backward()
    optimizer.step()
    return measure.optimizer_state_bytes(optimizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ["LABKIT_PROFILE"] = args.profile
    import copy

    import torch
    import transformers

    import labkit
    from labkit import measure, models
    from labkit.labs import lora as lab
    from labkit.techniques import lora

    print(labkit.env_report()["cpu_capability"], torch.__version__, lab.library_versions())
    torch.manual_seed(0)
    roberta = transformers.RobertaModel(transformers.RobertaConfig(), add_pooling_layer=False)
    vit = models.build("tiny_vit", 10, pretrained=False)[0]
    cases = {"RoBERTa-base-sized": (roberta, ["query", "value"], {"input_ids": torch.randint(0, 50265, (2, 64))}),
             "tiny_vit": (vit, ["qkv"], torch.randn(8, 3, 32, 32))}
    for name, (model, targets, batch) in cases.items():
        full_state = _adamw_state(copy.deepcopy(model), batch)
        adapted = lora.add_lora(copy.deepcopy(model), 8, 16, targets)
        total, trainable = measure.count_parameters(adapted)
        adapters = sum(p.numel() for n, p in adapted.named_parameters() if "lora_" in n)
        state = _adamw_state(adapted, batch)
        print(f"{name}: rank 8 on {','.join(targets)}: {trainable:,} trainable of {total:,} ({trainable / total:.2%}; "
              f"adapters alone {adapters / total:.2%}); AdamW state {state / 2**20:.2f} MiB against "
              f"{full_state / 2**20:.1f} MiB in full ({state / full_state:.2%})")
    cfg = lab.workload()
    rounds = [lab.merge_comparison(cfg, rank=8, refresh=True) for _ in range(args.repeats)]
    for setup in rounds[0].setup:
        ratios = [r.set_index("setup").loc[setup, "vs_base"] for r in rounds]
        print(f"{setup}: median {statistics.median(ratios):.3f}x the base model's CPU latency "
              f"(rounds: {', '.join(f'{v:.3f}' for v in ratios)})")


if __name__ == "__main__":
    main()

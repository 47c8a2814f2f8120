"""Section 5 of notebook 08 (in its "Going further"): a transformers model fine-tuned with PEFT's LoRA.

At ``full`` with the network the model is ViT-base from the hub; otherwise a transformers ViT built from a small
config and given labkit's pretrained ``tiny_vit`` weights, saved locally and loaded by the same
``from_pretrained`` call: the same code path.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ... import data, measure, models, results, train
from ...config import RunConfig
from ...data import cache_dir
from ...env import Profile, env_report, is_online, profile, resolve_device
from ...errors import ConfigError, UnsupportedError
from ...messages import worded
from ...techniques.lora import add_lora, matching_linears
from ...techniques.precision import autocast, resolve_precision
from ...validate import is_int
from .base import ALPHA, LORA_LR, VIT, quiet_import

HUB_MODEL = "google/vit-base-patch16-224-in21k"  # ImageNet-21k pretrained ViT-base (86 M), on Colab/Kaggle
SMALL_VIT = {"image_size": 32, "patch_size": 4, "hidden_size": 128, "num_hidden_layers": 4,
             "num_attention_heads": 4, "intermediate_size": 256}  # the offline stand-in, tiny_vit's size
TRANSFORMER_STEPS = {"ci": 8, "quick": 40, "full": 150}


def transformer_source(prof: Profile | None = None) -> tuple[str, str]:
    """Where the transformers model comes from: ``(source, what)``.

    Args:
        prof: the profile. At ``full`` with the network the source is `HUB_MODEL`; otherwise a folder under the data
            cache holding `small_vit_from_tiny_vit`, saved once, loaded by the same ``from_pretrained`` call.
    """
    prof = prof or profile()
    if prof.name == "full" and is_online():
        return HUB_MODEL, f"{HUB_MODEL} from the hub"
    folder = cache_dir() / "models" / f"small_vit-{results.code_fingerprint()}"
    if not (folder / "config.json").exists():
        small_vit_from_tiny_vit().save_pretrained(folder)
    return str(folder), (f"a local transformers ViT ({SMALL_VIT['num_hidden_layers']} layers, width "
                         f"{SMALL_VIT['hidden_size']}) with tiny_vit's weights")


def small_vit_from_tiny_vit() -> nn.Module:
    """A transformers ``ViTForImageClassification`` holding labkit's pretrained ``tiny_vit`` weights.

    Patch embedding, positions, each block's LayerNorms, q, k, v (tiny_vit's fused ``qkv`` split in three), output
    projection, MLP and the final LayerNorm are copied, matched in module order (the same in transformers 4 and 5).
    transformers' ViT adds a class token (zeros here) and classifies from it, where tiny_vit averages the tokens:
    the two agree block for block, not logit for logit (the tests check the blocks).
    """
    transformers = quiet_import("transformers")
    ours = models.build(VIT, 10, pretrained=True)[0]
    vit_config = transformers.ViTConfig(**SMALL_VIT, num_labels=10, layer_norm_eps=1e-5)
    vit = transformers.ViTForImageClassification(vit_config)
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
    transformers = quiet_import("transformers")
    return transformers.AutoModelForImageClassification.from_pretrained(source, num_labels=num_labels,
                                                                         ignore_mismatched_sizes=True)


def attention_targets(model: nn.Module) -> list[str]:
    """The query and value projections' names in a transformers model.

    Args:
        model: ``query``/``value`` in transformers 4's ViT, BERT, RoBERTa; ``q_proj``/``v_proj`` in transformers 5's
            ViT and LLaMA-style models.
    """
    for pair in (["query", "value"], ["q_proj", "v_proj"]):
        try:
            matching_linears(model, pair)
            return pair
        except ConfigError:
            continue
    raise ConfigError("model", type(model).__name__, "a transformer with query/value or q_proj/v_proj Linear layers")


def transformer_finetune(cfg: RunConfig, rank: int = 8, steps: int | None = None, refresh: bool = False) -> dict:
    """Fine-tune a transformers ViT (`transformer_source`) with PEFT's LoRA on query and value (cached).

    Args:
        cfg: the workload (data, batch size, precision). rank: the LoRA rank. steps: optimizer steps (default:
            `TRANSFORMER_STEPS` of the profile). refresh: run again.

    Returns:
        dict: source, what, params, peft_trainable, labkit_trainable (`add_lora` on the same layers and classifier),
        first_loss, last_loss, step_time_s, accuracy, image_size, steps, targets.
    """
    steps = TRANSFORMER_STEPS[profile().name] if steps is None else steps
    if not is_int(steps) or steps < 1:
        raise ConfigError("steps", steps, "a positive integer (optimizer steps)")
    source, what = transformer_source()
    kind = Path(source).name.split("-")[0]
    key = f"{results.cache_key(cfg, env_report(cfg.device))}-transformer-{kind}-r{rank}-{steps}"
    return results.cached_record(key, lambda: _transformer_run(cfg, source, what, rank, steps), refresh=refresh)


def _transformer_run(cfg: RunConfig, source: str, what: str, rank: int, steps: int) -> dict:
    peft = quiet_import("peft")
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
    resize = None if size == data.IMAGE_SHAPE[-1] else size
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
        x = data.to_model_input(images, splits["train"], device, size=resize)
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
            x = data.to_model_input(test.images[start:start + 256], test, device, size=resize)
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
    """One line: whether PEFT and `add_lora` train the same parameters, and whether the loss fell.

    Args:
        record: `transformer_finetune`'s.
    """
    same = "the same" if record["peft_trainable"] == record["labkit_trainable"] else "NOT the same"
    fell = "fell" if record["last_loss"] < record["first_loss"] else "did not fall"
    return (f"{record['what']}: PEFT and add_lora train {same} {record['peft_trainable']:,} of "
            f"{record['params'] + record['peft_trainable']:,} parameters; the loss {fell} "
            f"({record['first_loss']:.3f} -> {record['last_loss']:.3f} over {record['steps']} steps), "
            f"{record['step_time_s'] * 1e3:.0f} ms a step at {record['image_size']}x{record['image_size']}, "
            f"test accuracy {record['accuracy']:.1%}.")

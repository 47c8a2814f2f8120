"""How a model is scored: `evaluate` (accuracy on a split, sharded over the ranks of a process group) and the copy a
config deploys (`inference_model`: pruned, then quantized, as ``prune_amount`` and ``quantize`` say) with the figures
`labkit.fit` reports for it in ``RunResult.inference`` (`score_inference`: accuracy, serialised size, nonzero share).
"""

from __future__ import annotations

import copy
import itertools
import math

import torch

from . import data, measure, models, text
from .config import RunConfig
from .techniques import distributed
from .techniques.precision import autocast, resolve_precision
from .techniques.pruning import l1_unstructured, prune_channels, sparsity
from .techniques.quantization import METHODS as QUANTIZATION_METHODS
from .techniques.quantization import quantize
from .techniques.token_loss import token_loss_sum

CALIBRATION_BATCHES = 4  # training batches that fix static int8's activation ranges (`inference_model`)


@torch.no_grad()
def evaluate(model: torch.nn.Module, split: data.ImageData, cfg: RunConfig, device: torch.device,
             precision, shard: bool = True) -> float:
    """Accuracy of ``model`` on ``split`` (eval mode, autocast as in training).

    In a process group each rank scores every N-th image and the counts are summed over the ranks
    (`labkit.techniques.distributed.all_reduce_sum`), so every rank returns the whole split's accuracy;
    ``shard=False`` makes every rank score the whole split (FSDP: every rank must run as many forwards).
    """
    was_training = model.training
    model = models.unwrap(model)  # DDP's forward would broadcast buffers: evaluation needs no communication
    model.eval()
    shard = shard and distributed.active()
    indices = distributed.shard_indices(len(split)) if shard else None
    loader = data.make_loader(split, batch_size=max(cfg.batch_size, 256), shuffle=False, sampler=indices)
    correct = torch.zeros((), dtype=torch.int64)
    for images, labels in loader:
        x = data.to_model_input(images, split, device, cfg.channels_last, cfg.image_size)
        with autocast(precision, device):
            logits = model(x)
        correct += (logits.argmax(dim=1).cpu() == labels).sum()
    model.train(was_training)
    if shard:
        correct = distributed.all_reduce_sum(correct.to(device)).cpu()
    return int(correct) / len(split)


def evaluate_tokens(model: torch.nn.Module, split: text.TokenData, device: torch.device, precision,
                    batch_size: int = 256) -> float:
    """A language model's accuracy on ``split`` (`score_tokens`' ``accuracy``)."""
    return score_tokens(model, split, device, precision, batch_size)["accuracy"]


@torch.no_grad()
def score_tokens(model: torch.nn.Module, split: text.TokenData, device: torch.device, precision,
                 batch_size: int = 256) -> dict:
    """A language model's scores on ``split``, teacher-forced in one forward pass per batch (eval mode).

    ``test_loss`` (the mean cross-entropy over the label tokens, in nats) and ``perplexity`` (its exponential), and
    ``accuracy``: the digit tasks score the exact match of each answer (`labkit.text.exact_match`); on ``pydoc_text``
    every token is a label and a whole paragraph is never exactly right, so it scores the share of next tokens
    predicted; a learner's own data has no task that defines a match, so None.
    """
    was_training = model.training
    model = models.unwrap(model).eval()
    right = total = label_tokens = 0
    loss_sum = torch.zeros((), dtype=torch.float64)
    for batch in text.make_token_loader(split, batch_size, packing="pad", shuffle=False):
        batch = batch.to(device)
        inputs = batch.model_inputs()
        inputs.pop("labels")
        with autocast(precision, device):
            logits = model(**inputs).logits
        loss_sum += token_loss_sum(logits, batch.labels).double().cpu()
        label_tokens += int((batch.labels[:, 1:] != text.IGNORE_INDEX).sum())
        guesses = logits.argmax(-1)
        if split.name == "pydoc_text":
            scored = batch.labels[:, 1:] != text.IGNORE_INDEX
            right += int(((guesses[:, :-1] == batch.labels[:, 1:]) & scored).sum())
            total += int(scored.sum())
        else:
            right += int(text.exact_match(guesses, batch.labels).sum())
            total += len(batch.labels)
    model.train(was_training)
    test_loss = float(loss_sum) / max(label_tokens, 1)
    return {"accuracy": None if split.report is not None else right / max(total, 1), "test_loss": test_loss,
            "perplexity": math.exp(min(test_loss, 700.0))}


def exports(cfg: RunConfig) -> bool:
    """Whether ``cfg`` turns the trained model into another one for inference (pruned and/or quantized)."""
    return cfg.prune_amount is not None or cfg.quantize is not None


def export_label(cfg: RunConfig) -> str:
    """What ``cfg``'s inference fields do, in words: ``"50% of weights zeroed + int8_static"``."""
    parts = []
    if cfg.prune_amount is not None:
        what = "channels removed" if cfg.prune_structured else "weights zeroed"
        parts.append(f"{cfg.prune_amount:.0%} of {what}")
    if cfg.quantize is not None:
        kept = f" ({', '.join(cfg.quantize_keep_float)} in float)" if cfg.quantize_keep_float else ""
        parts.append(cfg.quantize + kept)
    return " + ".join(parts) or "unchanged"


def inference_model(model: torch.nn.Module, cfg: RunConfig, split: data.ImageData) -> torch.nn.Module:
    """The trained ``model`` as ``cfg`` deploys it: a pruned, then quantized copy (``model`` is left alone).

    Pruned as ``prune_amount`` and ``prune_structured`` say, then quantized as ``quantize`` and
    ``quantize_keep_float`` say. ``split`` gives static int8's calibration batches and the example inputs that
    structured pruning checks its rebuilt model on.

    Example:
        >>> small = inference_model(result.model, cfg.replace(quantize="int8_dynamic"), splits["train"])
    """
    model = copy.deepcopy(models.unwrap(model)).eval()
    device = next(model.parameters()).device
    loader = data.make_loader(split, batch_size=cfg.batch_size, shuffle=False)
    inputs = [data.to_model_input(images, split, device, cfg.channels_last, cfg.image_size)
              for images, _ in itertools.islice(loader, CALIBRATION_BATCHES)]
    if cfg.prune_amount is not None:
        if cfg.prune_structured:
            model = prune_channels(model, cfg.prune_amount, inputs[0][:2])
        else:
            l1_unstructured(model, cfg.prune_amount)  # the masks folded in: dense weights with zeros
    if cfg.quantize is not None:
        spec = QUANTIZATION_METHODS.get(cfg.quantize)  # None for a simulated method
        calibration = [x.cpu() for x in inputs] if spec is not None and spec.calibration else None
        model = quantize(model, cfg.quantize, calibration=calibration, keep_float=cfg.quantize_keep_float)
    return model.eval()


def score_inference(model: torch.nn.Module, cfg: RunConfig, splits: dict) -> dict:
    """``RunResult.inference``: the deployed copy's (`inference_model`) test accuracy, size and nonzero share.

    The size is the serialised one and the share that of nonzero Conv/Linear weights, scored in float32 on the
    device its kernels run on.
    """
    deployed = inference_model(model, cfg, splits["train"])
    device = next(iter(deployed.parameters()), None)
    device = device.device if device is not None else torch.device("cpu")  # torch.ao's int8 keeps no parameters
    # Zeros are counted before quantization, which packs (torch.ao) or rounds (simulated) the weights.
    pruned = inference_model(model, cfg.replace(quantize=None, quantize_keep_float=()), splits["train"])
    nonzero = 1 - sparsity(pruned).overall
    fp32 = resolve_precision("fp32", device)
    return {"method": export_label(cfg), "accuracy": evaluate(deployed, splits["test"], cfg, device, fp32, shard=False),
            "size_bytes": measure.model_size_bytes(deployed), "nonzero_share": nonzero, "device": str(device)}

"""Section 3.1 of notebook 05: what the backward pass of a frozen step must compute, counted layer by layer.

A conv or linear layer with a trainable weight computes its weight's gradient (about its forward FLOPs again); one
whose input requires a gradient also computes the input's. A frozen prefix has neither, and keeps no activations
(counted by saved-tensor hooks).
"""

from __future__ import annotations

import torch
from torch import nn

from ... import models
from ...config import RunConfig
from ...runsetup import set_up
from ...techniques.precision import autocast, resolve_precision
from .common import _label


def _model_and_batch(cfg: RunConfig, level):
    """``cfg``'s model frozen at ``level`` as the run freezes it (random weights: FLOPs and saved bytes do not depend
    on them), in training mode on its device, and the run's first batch: ``(model, images, labels)``."""
    s = set_up(cfg.replace(freeze=_label(level), pretrained=False), techniques=True)
    batch = s.batch()
    return s.model.train(), batch.images, batch.labels


def _layer_forward_flops(module: nn.Module, output: torch.Tensor) -> int:
    """A convolution's or linear layer's forward FLOPs, counted as torch's FlopCounterMode counts them."""
    weight = module.weight
    if isinstance(module, nn.modules.conv._ConvNd):
        return 2 * output.numel() * weight[0].numel()  # each output value: c_in/groups x kh x kw multiply-adds
    return 2 * output.numel() * module.in_features


def backward_profile(cfg: RunConfig, level) -> dict:
    """What the backward pass of one step at ``level`` must compute, layer by layer, and the activations it keeps:
    ``forward_flops``, ``trainable_forward_flops`` (layers with a trainable weight), ``no_input_grad_flops`` (those
    whose input needs no gradient), ``predicted_backward_flops``, ``counter_overcount_flops`` (torch's counter
    counts a grouped conv's weight gradient at ``groups`` x its forward), ``saved_activation_bytes``,
    ``saved_by_stage``."""
    model, x, _ = _model_and_batch(cfg, level)
    stage_of = {id(m): name for name, stage in models.named_stages(model) for m in stage.modules()}
    layers = []

    def record(module, args, output):
        layers.append({"stage": stage_of.get(id(module)), "flops": _layer_forward_flops(module, output),
                       "weight_trains": module.weight.requires_grad, "input_needs_grad": args[0].requires_grad,
                       "groups": getattr(module, "groups", 1)})

    handles = [m.register_forward_hook(record) for m in model.modules()
               if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))]
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    saved: dict[str, int] = {}
    current = ["input"]

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in seen and pointer not in weights:  # activations only, each storage once
            seen.add(pointer)
            saved[current[0]] = saved.get(current[0], 0) + tensor.untyped_storage().nbytes()
        return tensor

    stages = dict(models.named_stages(model))
    capability = torch.cuda.get_device_capability(x.device) if x.device.type == "cuda" else None
    precision = resolve_precision(cfg.precision, x.device, capability)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                autocast(precision, x.device):
            h = x
            for name in models.block_names(model):
                current[0] = name
                h = stages[name](h)
            current[0] = "head"
            models.forward_head(model, h)
    finally:
        for handle in handles:
            handle.remove()
    trainable = sum(r["flops"] for r in layers if r["weight_trains"])
    no_input_grad = sum(r["flops"] for r in layers if r["weight_trains"] and not r["input_needs_grad"])
    return {
        "forward_flops": sum(r["flops"] for r in layers),
        "trainable_forward_flops": trainable,
        "no_input_grad_flops": no_input_grad,
        "predicted_backward_flops": sum(r["flops"] * (r["weight_trains"] + r["input_needs_grad"]) for r in layers),
        "counter_overcount_flops": sum(r["flops"] * (r["groups"] - 1) for r in layers if r["weight_trains"]),
        "saved_activation_bytes": sum(saved.values()),
        "saved_by_stage": saved,
    }

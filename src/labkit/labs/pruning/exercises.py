"""Notebook 04's exercises on pruning, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import copy

import torch

from ... import models
from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, percent_not_fraction
from ...techniques import pruning

EXERCISES = Exercises()


EXERCISES.add(Exercise(
    name="04.coo_break_even",
    template=("A float32 conv weight of shape (out, in, kh, kw), {ndim} dimensions, is stored in COO format: each "
              "nonzero costs its {value_bytes}-byte value plus one {index_bytes}-byte (int64) index per dimension, and "
              "zeros cost nothing. Above what sparsity (fraction of zeros, 0..1) does COO take fewer bytes than dense "
              "storage, which costs {value_bytes} bytes for every value? (Ignore the few bytes of header.)"),
    numbers={"ndim": 4, "value_bytes": 4, "index_bytes": 8},
    solution="1 - value_bytes / (value_bytes + ndim * index_bytes)",
    hint=("COO bytes = (1 - sparsity) x numel x (value + ndim x index); dense bytes = numel x value; set them equal "
          "and solve for the sparsity"),
    rel_tol=0.01,
    diagnose=percent_not_fraction,
))


EXERCISES.add(Exercise(
    name="04.own_flops",
    template=("Your structured pruning left conv {layer} with {in_after} of its {in_before} input channels and "
              "{out_after} of its {out_before} output channels (its kernel size and its output's pixels did not "
              "change). A conv's FLOPs are 2 x in x out x kernel pixels x output pixels. What fraction (0..1) of "
              "its former FLOPs does it do now?"),
    numbers={"layer": "block1.1.0", "in_before": 32, "out_before": 32, "in_after": 16, "out_after": 16},
    solution="(in_after * out_after) / (in_before * out_before)",
    hint="only the channel counts changed: divide in x out after by in x out before",
    rel_tol=0.01,
    diagnose=percent_not_fraction,
    from_run=("layer", "in_before", "out_before", "in_after", "out_after"),
))


def global_masks_solution(model, amount):
    """One magnitude threshold for every Conv2d/Linear weight of ``model``: masks that zero ``amount`` of them all.

    Args:
        model: the model.
        amount: the share of all its Conv2d/Linear weights to remove.
    """
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    scores = torch.cat([m.weight.detach().abs().flatten() for _, m in layers])
    k = round(amount * scores.numel())  # how many weights go, rounded as torch.nn.utils.prune rounds
    if k == 0:
        return {name: torch.ones_like(m.weight, dtype=torch.bool) for name, m in layers}
    threshold = scores.kthvalue(k).values  # the k-th smallest magnitude, over the whole model
    return {name: m.weight.detach().abs() > threshold for name, m in layers}


def _check_global_masks(global_masks) -> str:
    torch.manual_seed(0)
    model = models.SmallCNN(10)
    names = [name for name, _ in pruning.prunable_layers(model)]
    # Distinct magnitudes: no two weights tie at a threshold, where either of them may go.
    sizes = [m.weight.numel() for _, m in pruning.prunable_layers(model)]
    magnitudes = (torch.randperm(sum(sizes)).float() + 1).split(sizes)
    with torch.no_grad():
        for (_, m), values in zip(pruning.prunable_layers(model), magnitudes, strict=True):
            m.weight.copy_((values * torch.randn(values.shape).sign()).reshape(m.weight.shape) / sum(sizes))
    for amount in (0.0, 0.3, 0.7):
        masks = global_masks(model, amount)
        if not isinstance(masks, dict) or sorted(masks) != sorted(names):
            raise WrongAnswer(f"04.global: return a dict with one mask per Conv2d/Linear layer ({', '.join(names)}); "
                              f"got {sorted(masks) if isinstance(masks, dict) else type(masks).__name__}")
        engine = pruning.l1_unstructured(copy.deepcopy(model), amount, scope="global", permanent=False)
        layer_wise = pruning.l1_unstructured(copy.deepcopy(model), amount, scope="layer", permanent=False)
        expected = {name: m.weight_mask.bool() for name, m in pruning.prunable_layers(engine)}
        per_layer = {name: m.weight_mask.bool() for name, m in pruning.prunable_layers(layer_wise)}
        yours = {name: torch.as_tensor(mask).bool() for name, mask in masks.items()}
        if any(yours[n].shape != expected[n].shape for n in names):
            raise WrongAnswer("04.global: each mask must have its layer's weight shape")
        if all(torch.equal(yours[n], expected[n]) for n in names):
            continue
        if amount and all(torch.equal(yours[n], per_layer[n]) for n in names):
            raise WrongAnswer("04.global: your masks prune each layer by its own threshold. Hint: put every layer's "
                              "magnitudes into one tensor (torch.cat) and take a single threshold from it")
        kept = sum(int(m.sum()) for m in yours.values()) / sum(m.numel() for m in yours.values())
        raise WrongAnswer(f"04.global: at amount={amount} your masks keep {kept:.1%} of the weights, and not the ones "
                          "torch.nn.utils.prune.global_unstructured keeps. Hint: the k = round(amount x number of "
                          "weights) smallest magnitudes of the whole model go (kthvalue(k) is the largest of them)")
    return ("Your masks equal torch.nn.utils.prune.global_unstructured's (labkit's l1_unstructured(..., "
            "scope='global')) at 0 %, 30 % and 70 %.")


EXERCISES.add(CodeExercise(
    name="04.global",
    task=("Complete global_masks(model, amount) below: return a dict layer name -> bool mask (the weight's shape, "
          "True = keep) for every Conv2d and Linear layer of model (named as model.named_modules() names them), such "
          "that the round(amount x all their weights) smallest-magnitude weights of the whole model are removed, "
          "wherever they are: one threshold for all layers, not one per layer."),
    checker=_check_global_masks,
    reference=global_masks_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

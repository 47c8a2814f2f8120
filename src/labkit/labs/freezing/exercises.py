"""Notebook 05's exercises on freezing, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import math

import torch

from ... import models
from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, percent_not_fraction
from ...techniques import freezing

EXERCISES = Exercises()


EXERCISES.add(Exercise(
    name="05.head_state",
    template=("A ResNet-50 has {num_params} parameters with its 1000-class ImageNet head, a Linear layer of "
              "{head_in} x 1000 weights plus 1000 biases. You fine-tune it on {classes} classes, so the head is "
              "replaced by a {head_in} x {classes} Linear layer with biases. With AdamW (8 bytes of state per "
              "trainable parameter), what fraction (0..1) of full fine-tuning's optimizer state does head-only "
              "freezing keep?"),
    numbers={"num_params": 25_557_032, "head_in": 2048, "classes": 10},
    solution="(head_in * classes + classes) / (num_params - (head_in * 1000 + 1000) + head_in * classes + classes)",
    hint=("head-only trains the new head only: head_in x classes + classes parameters; full fine-tuning trains the "
          "model with the new head: the total minus the old head plus the new one; the 8 bytes cancel"),
    rel_tol=0.01,
    diagnose=percent_not_fraction,
))


EXERCISES.add(Exercise(
    name="05.cache_speedup",
    template=("Head-only training through the whole network takes {epoch_s} s per epoch. Computing the frozen "
              "features of the training set once takes {extract_s} s, and an epoch of head training on those "
              "cached features takes {cached_s} s. Over {epochs} epochs, how many times faster is caching (total "
              "time through the network / total time with the cache)?"),
    numbers={"epoch_s": 40.0, "extract_s": 15.0, "cached_s": 0.5, "epochs": 10},
    solution="epochs * epoch_s / (extract_s + epochs * cached_s)",
    hint=("with the cache: the one-off extraction plus every epoch on the cache; without: every epoch through the "
          "network"),
    rel_tol=0.01,
))


EXERCISES.add(Exercise(
    name="05.own_backward",
    template=("Your own level sweep, at {level}: the layers with trainable weights cost {trainable_gflop} GFLOP in the "
              "forward pass, and {first_gflop} GFLOP of that is in the layers that read the frozen part's output "
              "(their input needs no gradient). A layer's backward pass computes its weight's gradient (as many "
              "FLOPs as its forward) and, if its input needs one, its input's gradient (as many again); frozen "
              "layers before them compute neither. How many GFLOP does the backward pass cost?"),
    numbers={"level": "heavy", "trainable_gflop": 0.4531, "first_gflop": 0.151},
    solution="2 * trainable_gflop - first_gflop",
    hint=("every trainable layer: weight gradient + input gradient = 2 x its forward FLOPs, except that the layers "
          "reading the frozen output compute no input gradient: subtract their forward FLOPs once"),
    rel_tol=0.01,
    from_run=("level", "trainable_gflop", "first_gflop"),
))


def param_groups_solution(model, lr, decay):
    """Optimizer parameter groups: ``lr`` for the head, times ``decay`` for each stage further from it.

    Args:
        model: a labkit model (its `labkit.models.named_stages`).
        lr: the head's learning rate.
        decay: the factor from one stage to the one below it.
    """
    stages = models.named_stages(model)  # stem, ..., head
    groups = []
    for depth, (_name, stage) in enumerate(reversed(stages)):  # the head first: depth 0
        params = [p for p in stage.parameters() if p.requires_grad]  # frozen ones need no group
        if params:
            groups.append({"params": params, "lr": lr * decay**depth})
    return groups


def _check_param_groups(param_groups) -> str:
    torch.manual_seed(0)
    model = freezing.freeze(models.build("small_cnn", 10, pretrained=False)[0], "light")  # the stem is frozen
    lr, decay = 1e-3, 0.5
    groups = param_groups(model, lr, decay)
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) and "params" in g for g in groups):
        raise WrongAnswer("05.param_groups: return a list of dicts, each with 'params' (a list of parameters) and 'lr'")
    expected = {id(p): g["lr"] for g in freezing.discriminative_param_groups(model, lr, decay) for p in g["params"]}
    stage_of = {id(p): name for name, stage in models.named_stages(model) for p in stage.parameters()}
    yours: dict[int, float] = {}
    for group in groups:
        for p in group["params"]:
            if id(p) in yours:
                raise WrongAnswer(f"05.param_groups: a parameter of {stage_of[id(p)]} is in two groups; torch refuses "
                                  "that. Hint: one group per stage")
            yours[id(p)] = group.get("lr", lr)
    missing = sorted({stage_of[i] for i in expected if i not in yours})
    if missing:
        raise WrongAnswer(f"05.param_groups: the trainable parameters of {', '.join(missing)} are in no group, so "
                          "the optimizer would never update them. Hint: one group for every stage of "
                          "labkit.models.named_stages(model) that has trainable parameters")
    for i, want in reversed(list(expected.items())):  # the head first
        got = yours[i]
        if not math.isclose(got, want, rel_tol=1e-6):
            stage = stage_of[i]
            hint = ("the head trains at the full lr and the stem slowest: count the depth from the head"
                    if stage == "head" else "the stage k places below the head gets lr * decay**k")
            raise WrongAnswer(f"05.param_groups: {stage} gets lr {got:.3g}, expected {want:.3g}. Hint: {hint}")
    optimizer = torch.optim.AdamW(groups, lr=lr)  # torch accepts the groups as they are
    rates = sorted({g["lr"] for g in optimizer.param_groups}, reverse=True)
    return (f"Your groups give each stage the learning rate labkit's discriminative_param_groups gives it "
            f"({', '.join(f'{r:.3g}' for r in rates)}, head first), and leave the frozen stem out.")


EXERCISES.add(CodeExercise(
    name="05.param_groups",
    task=("Complete param_groups(model, lr, decay) below: return optimizer parameter groups (a list of dicts with "
          "'params' and 'lr') for discriminative learning rates: the head's trainable parameters at lr, those of the "
          "stage before it at lr * decay, the one before that at lr * decay**2, and so on to the stem, over the "
          "stages of labkit.models.named_stages(model). Frozen parameters (requires_grad False) need no group. "
          "The checker freezes the stem first."),
    checker=_check_param_groups,
    reference=param_groups_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

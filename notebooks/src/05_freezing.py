# %% [markdown]
# # Layer freezing: train less of the network
#
# A pretrained network already computes useful features in its early stages. **Freezing** those stages
# (no gradient, no optimizer state, BatchNorm statistics left as they are) trains only the rest: each
# step gets cheaper and the optimizer smaller, at some cost in how far the model can adapt. This
# notebook measures that trade at five levels, from nothing frozen to only the head training, and
# tests a seed's finding: on ShuffleNetV2, heavy freezing cost more accuracy than it saved time.
#
# **You will learn**
# 1. what freezing is in PyTorch: `requires_grad_(False)` on a stage's parameters **and** its BatchNorm
#    layers kept in eval mode, and what labkit's levels (`none`, `light`, `medium`, `heavy`,
#    `head_only`) freeze on each model;
# 2. why a frozen step is faster: the backward pass shrinks, counted layer by layer (weight and input
#    gradients), and a frozen prefix keeps no activations, because autograd records nothing there;
# 3. what freezing saves in memory by category and costs in accuracy after the same steps, and
#    whether the seed's trade-off holds here;
# 4. what goes wrong when frozen BatchNorm layers stay in training mode;
# 5. feature caching (compute the frozen features once, train the head on them), gradual unfreezing
#    and discriminative (per-stage) learning rates.
#
# **What you need:** notebook 00 (the four numbers, memory by category); notebook 03 helps (activations
# and optimizer state). A CPU is fine: FLOPs and memory are counted exactly there, and every result
# below is a real run; step times are this machine's and get noisy when other work runs beside the
# notebook.

# %%
import copy

import torch
import torch.nn.functional as F
from torch import nn

import labkit
from labkit import guesses, plots, views
from labkit.labs import freezing as lab  # this notebook's experiments and findings
from labkit.labs.freezing import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import freezing
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
labkit.env_report()

# %% [markdown]
# ## 1. Stages and levels
# Every labkit model lists its **stages** in forward order, stem first and head last
# (`labkit.models.named_stages`); together they hold every parameter once. A freezing level says how
# many of the stages before the head (the *body*) keep training, counted from the top: `light` trains
# the last three body stages, `medium` the last two, `heavy` the last one, `head_only` none; at least the
# stem is frozen from `light` on. So the same level name means the same thing on every model. Early
# stages hold generic features (edges, textures) and few parameters; late stages hold task-specific
# features and most of the parameters, which is why the share left training drops fast at the end:

# %%
cfg = labkit.config.baseline(P)  # the profile's pretrained fine-tune (notebook 00)
model = labkit.models.build(cfg.model, num_classes=10, pretrained=False)[0]
print(f"{cfg.model}: stages {[name for name, _ in labkit.models.named_stages(model)]}")
lab.level_table()


# %% [markdown]
# ## 2. The mechanism
# Freezing a stage is two things. **No gradient:** `p.requires_grad_(False)` on each of its parameters;
# an optimizer built over the parameters that still require one keeps no state for the rest.
# **BatchNorm stays in eval mode:** in training mode a BatchNorm layer normalises each batch by its own
# statistics and keeps updating its running mean and variance, so a "frozen" stage would still change
# what it computes. The catch is that every training loop calls `model.train()`, which puts every
# layer back into training mode; so a frozen BatchNorm layer gets its own `train`, which keeps it in
# eval mode. In plain PyTorch:

# %%
def freeze_stages(model, names):
    stages = dict(labkit.models.named_stages(model))  # stem, ..., head
    for name in names:
        for p in stages[name].parameters():
            p.requires_grad_(False)  # no gradient, hence no optimizer state
        for m in stages[name].modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.train = lambda mode=True, m=m: nn.Module.train(m, False)  # model.train() leaves it in eval
                m.eval()
    return model


# %% [markdown]
# Below, your version and labkit's `freezing.freeze(model, "heavy")` (what `RunConfig(freeze="heavy")`
# applies before the optimizer is built) each take one AdamW step from the same pretrained weights on
# the same batch; the check compares what trains, the gradients, the weights after the step and every
# BatchNorm statistic. labkit's own `train` for a frozen BatchNorm layer is a small object rather than a
# lambda: `copy.deepcopy` (and pickling) copies that object along with its layer, while a copied model
# would share the lambda, which acts on the original model's layer.

# %%
labkit.env.set_tf32(False)  # TF32's rounding would blur the comparison on an Ampere GPU
split, device = labkit.train.run_splits(cfg)["train"], labkit.env.resolve_device(cfg.device)
x = labkit.data.to_model_input(split.images[:32], split, device, size=cfg.image_size)
y = split.labels[:32].to(device)
torch.manual_seed(0)
start = labkit.models.build(cfg.model, split.num_classes)[0].to(device)
mine = freeze_stages(copy.deepcopy(start), freezing.frozen_stages(start, "heavy"))
engine = freezing.freeze(copy.deepcopy(start), "heavy")
for label, model in (("yours", mine), ("labkit", engine)):
    model.train()  # what every training loop calls first
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"{label}: {trainable:,} parameters train, {len(optimizer.state)} tensors have optimizer state")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: your freezing trains exactly what labkit's does: same trainable set, gradients, weights, statistics
pairs = list(zip(mine.parameters(), engine.parameters(), strict=True))
assert all(a.requires_grad == b.requires_grad and (a.grad is None) == (b.grad is None) for a, b in pairs)
assert all(a.grad is None or torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6) for a, b in pairs)
assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)
frozen_bn = {n for n, m in engine.named_modules() if freezing.is_frozen_batchnorm(m)}
buffers = zip(mine.named_buffers(), engine.named_buffers(), start.buffers(), strict=True)
for (name, a), (_, b), s in buffers:  # frozen statistics did not move, the trainable ones did
    assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6)
    assert torch.equal(b, s) == (name.rsplit(".", 1)[0] in frozen_bn), name
assert frozen_bn and not any(m.training for m in copy.deepcopy(engine).train().modules()
                             if freezing.is_frozen_batchnorm(m))

# %% [markdown]
# ## 3. Freezing levels: time, memory, accuracy
# Each level now fine-tunes the same pretrained model for the same steps (the profile's
# `max_steps`), with the same data order. The optimizer state should fall with the trainable
# parameters; the step time depends on how much of the backward pass is left, which section 3.1
# counts exactly.
#
# **Predict first.** At `head_only`, what fraction of the step time without freezing will a step take
# (0..1)? And what fraction of the optimizer state will be left?

# %%
guess_time_fraction = None  # YOUR GUESS: head_only step time / no freezing's, e.g. 0.5
guess_state_fraction = None  # YOUR GUESS: head_only optimizer state / no freezing's, e.g. 0.1

# %%
sweep = lab.level_sweep(cfg)
head = sweep.set_index("level").loc["head_only"]
print(guesses.versus(guess_time_fraction, head.time_ratio, "step time, head_only / none", "x"))
print(guesses.versus(guess_state_fraction, head.state_ratio, "optimizer state, head_only / none", "x"))
plots.bars(sweep, x="level", ys=["step_time_s", "accuracy"])
plots.memory_breakdown(sweep, label="level");

# %%
sweep[["level", "frozen_stages", "num_trainable_params", "step_time_s", "time_ratio", "mem_gradients_bytes",
       "mem_optimizer_state_bytes", "mem_activations_bytes", "peak_memory_bytes", "accuracy", "accuracy_change"]]

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each level trains less, keeps less, and its backward pass is exactly the layer-by-layer count
ok = sweep[sweep.error.isna()].set_index("level")
assert list(ok.index) == list(freezing.LEVELS)
assert ok.num_trainable_params.is_monotonic_decreasing and ok.mem_optimizer_state_bytes.is_monotonic_decreasing
assert ok.saved_activation_bytes.is_monotonic_decreasing and ok.backward_flops.is_monotonic_decreasing
assert (ok.backward_flops == ok.predicted_backward_flops).all(), "the backward pass, layer by layer"
assert ok.state_ratio["head_only"] <= 0.10 and ok.mem_gradients_bytes["head_only"] < 0.05 * ok.mem_gradients_bytes["none"]

# %% [markdown]
# How to read it: gradients and optimizer state (the middle of each stack) shrink with the trainable
# parameters, to almost nothing at `head_only`; the parameters themselves are all still there (frozen
# weights are still used). The activation segment shrinks less than you might expect; the next cell says
# why. Accuracy after the same steps is the price: where it drops depends on how close the pretraining
# task is to this one, and differences smaller than the test set's noise mean nothing.
#
# ### 3.1 Why the step gets faster
# A step is a forward pass, a backward pass and the optimizer. Freezing leaves the forward pass alone:
# every layer still runs. The backward pass of a convolution or linear layer computes up to two things,
# each costing about its forward FLOPs: the gradient of its **weight** (needed only if the weight trains)
# and the gradient of its **input** (needed only if something before it trains, or the input itself
# requires a gradient). With the first stages frozen, nothing before the first trainable layer requires
# a gradient, so autograd records no graph there at all: no backward work, and no activations **saved**
# for it. labkit counts every layer this way and compares the prediction with the FLOP counter's
# measurement of the real step:

# %%
print(lab.levels_finding(sweep))
plots.bars(sweep, x="level", ys=["backward_flops", "saved_activation_bytes"]);

# %% [markdown]
# So the FLOPs fall to about a third at `head_only` (the forward pass is about a third of a step),
# and the time can fall less or more than that. Less, where work that FLOP counters leave out and that
# freezing does not remove is a visible share of the step: loading the batch, the loss, and on a GPU
# the launch of every kernel of a small model. More, where the frozen prefix also drops work the
# counters leave out: the backward pass of its BatchNorm and ReLU layers, its BatchNorm batch
# statistics, and the optimizer's update of its tensors. The printed sentence says which happened
# here. Memory follows the same logic: gradients and optimizer state go with the
# frozen parameters, and the activations kept for the backward pass go with the frozen prefix, but the
# forward pass still needs working memory while it runs.
#
# ### 3.2 The seed's trade-off
# The seed froze ShuffleNetV2 at four levels and found that heavy freezing cost more accuracy than it
# saved time. Read literally, the claim is: the share of accuracy lost is larger than the share of
# step time saved, and the loss is more than test-set noise. On this run:

# %%
print(lab.seed_tradeoff(sweep, "heavy"))

# %% [markdown]
# Whichever way it came out, the answer belongs to a model and a pair of tasks: freezing costs most
# when the pretraining data is far from the new task (the frozen features do not fit) and least when
# the tasks are close. This notebook's model is not the seed's ShuffleNetV2; labkit ships offline
# weights for it too, and `lab.level_sweep(cfg.replace(model="shufflenet_v2_x0_5"))` repeats the sweep
# on it (several minutes at `quick` on a CPU). A level is a knob to measure, not a rule; the panel below reruns
# any level for more steps or another learning rate.
#
# ## 4. BatchNorm in frozen stages
# What if the frozen stages' BatchNorm layers are left in training mode, as `requires_grad_(False)`
# alone leaves them? The same `head_only` fine-tune, both ways:

# %%
demo = lab.batchnorm_demo(cfg, "head_only")
print(demo.finding())
demo.frame[["variant", "frozen_weight_change", "running_mean_change", "feature_change", "accuracy", "step_time_s"]]

# %% jupyter={"source_hidden": true} tags=["check"]
# check: kept in eval mode nothing frozen moves; with requires_grad_(False) alone the statistics do
good, bad = demo.frame.iloc[0], demo.frame.iloc[1]
assert demo.frame.error.isna().all() and good.frozen_weight_change == bad.frozen_weight_change == 0
assert good.running_mean_change == 0 and good.feature_change == 0
assert bad.running_mean_change > 0 and bad.feature_change > 1e-3

# %% [markdown]
# No weight moved either way, yet the "frozen" stages computed something else by the end: their
# running statistics followed the new data. Whether that helps or hurts accuracy depends on how far the
# new data's statistics are from the pretraining data's and on the batch size (small batches give
# noisy statistics); adapting them on purpose is a technique of its own (AdaBN). Either way the stages
# are not frozen: features cached from them go stale, and the model you evaluate is not the one whose
# head you trained.
#
# ## 5. Feature caching
# With everything but the head frozen (and BatchNorm in eval mode), the body computes the same features
# for an image in every epoch. So compute them **once**, keep them, and train the head on them: each
# epoch then costs only the head. Below, head-only training runs both ways for three epochs, from the
# same start on the same batches.
#
# **Predict first:** how many times faster is an epoch on the cached features than an epoch through the
# network?

# %%
guess_cache_speedup = None  # YOUR GUESS: epoch time through the network / on the cache, e.g. 3

# %%
caching = lab.feature_caching(cfg)
print(caching.finding())
print(guesses.versus(guess_cache_speedup, caching.speedup, "head-only epoch: network / cache", "x"))
plots.bar(caching.frame, x="method", y="epoch_time_s");

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the cache trains the same head (the same computation), and an epoch on it is faster
assert caching.head_weight_diff < 1e-3 and caching.speedup > 1
acc = caching.frame.accuracy
assert abs(acc[0] - acc[1]) <= labkit.measure.accuracy_noise(acc.mean(), P.test_size)

# %% [markdown]
# The cache costs memory (one feature map per training image) and one pass over the data to build; it
# works only while the features do not change, so not with data augmentation (a new crop is a new
# input) and not when any stage before the head trains. That is why linear probing (a head trained on
# frozen features) is often run on cached features as a cheap first look at a pretrained model.
#
# ## 6. Gradual unfreezing and discriminative learning rates
# Two refinements between the fixed levels (Howard & Ruder 2018, ULMFiT):
# **gradual unfreezing** starts at `head_only` and thaws one stage from the top every few steps, so that
# the new head settles before it sends large gradients into the pretrained stages;
# **discriminative learning rates** train everything, but each stage at `decay` times the learning rate
# of the stage above it (`freezing.discriminative_param_groups`; 1/2.6 per stage, ULMFiT's factor), so
# that early stages move slowly. Both run for the same steps as the fixed levels:

# %%
schedules = lab.schedule_runs(cfg, sweep)
print(lab.schedule_finding(schedules, P.test_size))
plots.bars(schedules, x="setup", ys=["accuracy", "mean_step_time_s"]);

# %%
schedules[["setup", "kind", "accuracy", "mean_step_time_s", "num_trainable_params", "peak_memory_bytes", "schedule"]]

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every schedule ran and ended with the whole network training, optimizer state included
sc = schedules.set_index("setup")
assert sc.error.isna().all()
assert (sc.num_trainable_params[list(lab.SCHEDULES)] == sc.num_trainable_params["none"]).all()
assert sc.mem_optimizer_state_bytes["gradual unfreezing"] == sc.mem_optimizer_state_bytes["none"]

# %% [markdown]
# A gradual schedule is cheaper than training everything while stages are still frozen and costs
# the same once they have thawed; its memory (measured on one extra step at its end) is the full
# fine-tune's. Whether either refinement beats a fixed level depends on the number of steps and the
# learning rate: with few steps, gradual unfreezing leaves the early stages little time to adapt, and a
# decayed learning rate moves them little. The printed lines say what happened here; try more steps in
# the panel.
#
# ## 7. Your turn: the panel
# Choose a freezing level, the number of steps and the learning rate, and press **Run**. Each run adds
# bars for its step time, its memory by category and its accuracy, next to the runs before it.

# %%
panel = ExperimentPanel(
    run=labkit.results.cached_fit,
    controls={"freeze": list(freezing.LEVELS), "max_steps": (P.max_steps // 2, 2 * P.max_steps, P.max_steps // 2),
              "lr": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]},
    base=cfg, show=views.History(("step_time_s", "memory_breakdown", "accuracy")), title="Layer freezing")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | "frozen" layers still change; cached features go stale | their BatchNorm layers are in training mode (`requires_grad_(False)` alone, then `model.train()`) | keep frozen BatchNorm in eval mode (labkit's `freeze` does); compare `running_mean` before and after |
# | optimizer state as large as before | the optimizer took steps before the freeze: the state it made for the now-frozen parameters stays | freeze first, then build the optimizer over the `requires_grad` parameters (or rebuild it after freezing) |
# | frozen stages still get gradients | frozen between a forward pass and its backward (the graph was already recorded); a weight shared with a trainable layer | freeze before the forward pass; check `p.grad is None` after a step |
# | no speed-up | the frozen stages sit after trainable ones (their input gradients are still needed); a tiny model bound by kernel launches | freeze a prefix; measure the backward FLOPs |
# | memory barely drops | the frozen forward still needs working memory; weights stay | expected: gradients, optimizer state and saved activations go, the rest stays |
# | accuracy far lower at `head_only` | the frozen features do not fit the new task | freeze less, unfreeze gradually, or train longer at a lower lr |

# %% [markdown]
# ## Going further
# - **Adapters and LoRA** (a later notebook) train small added matrices instead of a subset of layers: a
#   frozen backbone with a trainable low-rank update in every layer.
# - torchvision's detection models use `FrozenBatchNorm2d`, BatchNorm with its statistics and affine
#   parameters turned into fixed buffers: the eval-mode behaviour by construction.
# - **Linear probing, then fine-tuning** (LP-FT, Kumar et al. 2022): train the head on frozen features
#   first, then everything; fine-tuning with a random head distorts the pretrained features more.
# - `torch.no_grad()` around the frozen prefix gives the same savings as `requires_grad_(False)` for that
#   part of the forward pass, and is what feature extraction uses.

# %% [markdown]
# ## Summary
# - Freezing is `p.requires_grad_(False)` on a stage's parameters **and** its BatchNorm layers kept in eval
#   mode under `model.train()`; build the optimizer afterwards over the parameters that still train.
#   `RunConfig(freeze="none" | "light" | "medium" | "heavy" | "head_only")` does both.
# - A frozen **prefix** removes its whole backward pass and the activations autograd would keep for it;
#   the first trainable layer computes no input gradient. The forward pass stays, so a step's FLOPs
#   cannot fall below about a third.
# - Gradients and optimizer state shrink with the trainable parameters: at `head_only` almost to nothing.
# - What freezing costs in accuracy depends on how close the tasks are: measure it (section 3.2).
# - With only the head training, cache the frozen features and train the head on them; gradual
#   unfreezing and discriminative learning rates sit between the fixed levels.

# %% [markdown]
# ## Further reading
# - Yosinski et al. 2014, *How transferable are features in deep neural networks?* (which layers
#   transfer): https://arxiv.org/abs/1411.1792
# - Howard & Ruder 2018, *Universal Language Model Fine-tuning for Text Classification* (ULMFiT: gradual
#   unfreezing, discriminative learning rates): https://arxiv.org/abs/1801.06146
# - PyTorch, *Autograd mechanics*, "Locally disabling gradient computation" (`requires_grad`, frozen
#   parameters): https://pytorch.org/docs/stable/notes/autograd.html
# - PyTorch tutorial, *Transfer Learning for Computer Vision* (fine-tuning vs a fixed feature extractor):
#   https://pytorch.org/tutorials/beginner/transfer_learning_tutorial.html
# - Kumar et al. 2022, *Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution*
#   (LP-FT): https://arxiv.org/abs/2202.10054
# - Li et al. 2016, *Revisiting Batch Normalization For Practical Domain Adaptation* (AdaBN):
#   https://arxiv.org/abs/1603.04779

# %% [markdown]
# ## Exercises
# The first asks for code: the parameter groups of discriminative learning rates. The checker compares
# every parameter's learning rate with labkit's `discriminative_param_groups`.

# %%
print(exercises.question("05.param_groups"))


# %%
def my_param_groups(model, lr, decay):
    """Optimizer parameter groups with one learning rate per stage of `model`."""
    raise NotImplementedError  # YOUR CODE


exercises.check("05.param_groups", my_param_groups)

# %% [markdown]
# The next one uses **your own** run's FLOPs at `heavy`, from section 3: predict the backward pass layer
# by layer. The line under the check compares your arithmetic with the FLOP counter's measurement.

# %%
mine = lab.backward_numbers(sweep, "heavy")  # your model's FLOPs at heavy, from section 3
print(exercises.question("05.own_backward", mine))

# %%
answer = None  # YOUR CODE: GFLOP
exercises.check("05.own_backward", answer, mine)
print(lab.backward_check(mine, sweep))

# %%
print(exercises.question("05.head_state"))

# %%
answer = None  # YOUR CODE: a fraction (0..1)
exercises.check("05.head_state", answer)

# %%
print(exercises.question("05.cache_speedup"))

# %%
answer = None  # YOUR CODE: x times faster
exercises.check("05.cache_speedup", answer)

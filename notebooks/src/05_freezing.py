# %% [markdown]
# # Layer freezing: train less of the network
#
# A pretrained network already computes useful features in its early stages. **Freezing** those stages (no
# gradient, no optimizer state, BatchNorm statistics left as they are) trains only the rest: each step gets
# cheaper and the optimizer smaller, at some cost in how far the model can adapt. This notebook measures
# that trade at five levels, from nothing frozen to only the head, and tests a rule of thumb from
# transfer-learning tutorials: "freeze too much and you lose more accuracy than you save time."
#
# **You will learn**
# 1. freezing in PyTorch: `requires_grad_(False)` **and** BatchNorm kept in eval mode; what labkit's levels
#    (`none`, `light`, `medium`, `heavy`, `head_only`) freeze;
# 2. why a frozen step is faster: the backward pass counted layer by layer, and why a frozen prefix keeps no
#    activations;
# 3. what freezing saves in memory and costs in accuracy after the same steps, and whether the rule of thumb
#    holds here;
# 4. what goes wrong when frozen BatchNorm layers stay in training mode;
# 5. feature caching, gradual unfreezing and discriminative learning rates.
#
# **What you need:** notebook 00 (the four numbers, memory by category); notebook 03 helps. A CPU is fine:
# FLOPs and memory are counted exactly, and step times are this machine's; each finding calls a time
# difference real only outside the spread of the steps it measured.

# %%
import copy

import torch
import torch.nn.functional as F
from torch import nn

import labkit
from labkit import display, guesses, plots, views
from labkit.labs import freezing as lab  # this notebook's experiments and findings
from labkit.labs.freezing import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import freezing
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
labkit.env_report()

# %% [markdown]
# ## 1. Stages and levels
# Every labkit model lists its **stages** in forward order, stem first and head last
# (`labkit.models.named_stages`). A level says how many stages before the head keep training: `light` the
# last three, `medium` two, `heavy` one, `head_only` none, the same on every model. Early stages hold
# generic features and few parameters; late stages hold task-specific features and most parameters, so the
# share left training drops fast at the end:

# %%
cfg = labkit.config.baseline(P)  # the profile's pretrained fine-tune (notebook 00)
model = labkit.models.build(cfg.model, num_classes=10, pretrained=False)[0]
print(f"{cfg.model}: stages {[name for name, _ in labkit.models.named_stages(model)]}")
lab.level_table()


# %% [markdown]
# ## 2. The mechanism
# Freezing a stage is two things. **No gradient:** `p.requires_grad_(False)` on its parameters; an optimizer
# built over the parameters that still require one keeps no state for the rest. **BatchNorm in eval mode:**
# in training mode a BatchNorm layer normalises each batch by its own statistics and keeps updating its
# running mean and variance, so a "frozen" stage would still change. Every training loop calls
# `model.train()`, so in your own loop put the frozen BatchNorm layers back in eval mode after each call:

# %%
def freeze_stages(model, names):
    stages = dict(labkit.models.named_stages(model))  # stem, ..., head
    frozen_bn = []
    for name in names:
        for p in stages[name].parameters():
            p.requires_grad_(False)  # no gradient, hence no optimizer state
        frozen_bn += [m for m in stages[name].modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return frozen_bn


def train_mode(model, frozen_bn):  # call instead of model.train()
    model.train()
    for m in frozen_bn:
        m.eval()  # normalise with the running statistics, and leave them alone


# %% [markdown]
# Two ways need no call to remember: torchvision's `FrozenBatchNorm2d` replaces each frozen layer by one with no
# training mode, and labkit's `freezing.freeze(model, "heavy")` (what `RunConfig(freeze="heavy")` applies)
# registers a forward pre-hook that calls `eval()` on the layer before each of its forwards. Yours and labkit's
# each take one AdamW step from the same weights on the same batch; the check compares what trains, the
# gradients, the weights and every BatchNorm statistic.

# %%
run = labkit.runsetup.set_up(cfg.replace(tf32=False))  # the run's device, seeded model, data; no TF32
x, y = (batch := run.batch(32)).images, batch.labels  # its first 32 training images
start = run.model
mine_bn = freeze_stages(mine := copy.deepcopy(start), freezing.frozen_stages(start, "heavy"))
engine = freezing.freeze(copy.deepcopy(start), "heavy")
for label, model in (("yours", mine), ("labkit", engine)):
    train_mode(mine, mine_bn) if model is mine else engine.train()  # labkit's hook puts its layers in eval
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
assert all(torch.equal(a, b) for a, b in pairs if not a.requires_grad)  # frozen: untouched
# AdamW's first step moves a weight by about lr x the sign of its gradient: where a gradient is near zero, GPU
# kernels that add in another order can flip it, and the weights then differ by up to 2 lr
assert all(torch.allclose(a, b, rtol=0, atol=2 * cfg.lr + 1e-6) for a, b in pairs)
frozen_bn = {n for n, m in engine.named_modules() if freezing.is_frozen_batchnorm(m)}
buffers = zip(mine.named_buffers(), engine.named_buffers(), start.buffers(), strict=True)
for (name, a), (_, b), s in buffers:  # frozen statistics did not move, the trainable ones did
    assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6)
    assert torch.equal(b, s) == (name.rsplit(".", 1)[0] in frozen_bn), name
assert frozen_bn == {n for n, m in mine.named_modules() if any(m is b for b in mine_bn)}  # the same layers

# %% [markdown]
# ## 3. Freezing levels: time, memory, accuracy
# Each level fine-tunes the same pretrained model for the same steps, with the same data order.
#
# **Predict first.** At `head_only`, what fraction of the step time without freezing will a step take
# (0..1)? And what fraction of the optimizer state will be left?

# %%
guess_time_fraction = None  # YOUR GUESS: head_only step time / no freezing's, e.g. 0.5
guess_state_fraction = None  # YOUR GUESS: head_only optimizer state / no freezing's, e.g. 0.1

# %%
sweep = lab.level_sweep(cfg)
step, head = sweep.step_time("head_only"), sweep.set_index("level").loc["head_only"]  # step: against none
print(guesses.versus(guess_time_fraction, step, "step time, head_only / none", "x"))  # with the band both spreads allow
print(guesses.versus(guess_state_fraction, head.state_ratio, "optimizer state, head_only / none", "x"))
plots.bars(sweep, x="level", ys=["step_time_s", "accuracy"])
plots.memory_breakdown(sweep, label="level");

# %%
sweep.table()  # its finding follows in 3.1

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each level trains less, keeps less, and its backward pass is exactly the layer-by-layer count
ok = sweep[sweep.error.isna()].set_index("level")
assert list(ok.index) == [level for level in freezing.LEVELS if level in ok.index]  # in order; ci runs three
assert {"none", "heavy", "head_only"} <= set(ok.index)
assert ok.num_trainable_params.is_monotonic_decreasing and ok.mem_optimizer_state_bytes.is_monotonic_decreasing
assert ok.saved_activation_bytes.is_monotonic_decreasing and ok.backward_flops.is_monotonic_decreasing
assert (ok.backward_flops == ok.predicted_backward_flops).all(), "the backward pass, layer by layer"
grads = ok.mem_gradients_bytes
assert ok.state_ratio["head_only"] <= 0.10 and grads["head_only"] < 0.05 * grads["none"]

# %% [markdown]
# Gradients and optimizer state shrink with the trainable parameters, to almost nothing at `head_only`; the
# weights all stay. Accuracy after the same steps is the price; differences smaller than the test set's
# noise mean nothing.
#
# ### 3.1 Why the step gets faster
# Freezing leaves the forward pass alone. The backward pass of a conv or linear layer computes up to two
# gradients, each costing about its forward FLOPs: of its **weight** (if the weight trains) and of its
# **input** (if something before it trains). With the first stages frozen, nothing before the first
# trainable layer requires a gradient, so autograd records no graph there: no backward work, no activations
# **saved**. labkit counts this layer by layer (`lab.backward_profile`); the check above found it equal to
# the FLOP counter's measurement:

# %%
print(sweep.finding())
plots.bars(sweep, x="level", ys=["backward_flops", "saved_activation_bytes"]);

# %% [markdown]
# The FLOPs cannot fall below the forward pass, about a third of a step, and the time can fall less or more
# than the FLOPs. Less, where uncounted work stays: loading the batch, the loss, and on a GPU a small
# model's kernel launches. More, where the frozen prefix also drops uncounted work: its BatchNorm and
# ReLU backward, its batch statistics, the optimizer's update of its tensors. The line judges this against
# the steps' own spread, or says the timing was disturbed. The forward still needs working memory, so the
# activation peak falls less than the saved activations.
#
# ### 3.2 A popular claim: heavy freezing costs more than it saves
# Read literally, the rule of thumb says: at `heavy` the share of accuracy lost is larger than the share of
# step time saved, and the loss is more than test-set noise. On this run:

# %%
print(sweep.claim("heavy"))

# %% [markdown]
# The claim may hold (a loss beyond noise, larger in share than the time saved), hold only in part (a real
# loss, but a smaller share than the time saved: worth it or not, depending on what the last points are
# worth to you), or fail (the loss is within noise, so the time saved came free); when the frozen run was no
# faster than the unfrozen run's fastest steps, the times cannot judge it. The answer belongs to a model and
# a pair of tasks: freezing costs most when the pretraining data is far from the new task. A level is a knob
# to measure, not a rule.
#
# ## 4. BatchNorm in frozen stages
# What if the frozen stages' BatchNorm layers stay in training mode, as `requires_grad_(False)` alone leaves
# them? The same `head_only` fine-tune, both ways:

# %%
demo = lab.batchnorm_demo(cfg, "head_only")
demo

# %% jupyter={"source_hidden": true} tags=["check"]
# check: kept in eval mode nothing frozen moves; with requires_grad_(False) alone the statistics do
good, bad = demo.frame.iloc[0], demo.frame.iloc[1]
assert demo.frame.error.isna().all() and good.frozen_weight_change == bad.frozen_weight_change == 0
assert good.running_mean_change == 0 and good.feature_change_fraction == 0
assert bad.running_mean_change > 0 and bad.feature_change_fraction > 1e-3

# %% [markdown]
# No weight moved either way, yet the "frozen" stages compute something else by the end: their running
# statistics followed the new data. Accuracy may come out the same within noise, lower (small batches give
# noisy statistics), or higher, where adapting the statistics helps; that is a technique of its own
# (AdaBN), to use on purpose. Either way the stages are not frozen, and features cached from them go stale.
#
# ## 5. Feature caching
# With everything but the head frozen (and BatchNorm in eval mode), the body computes the same features for
# an image every epoch, so compute them **once** and train the head on them: an epoch then costs only the
# head. Head-only training runs both ways for three epochs, from the same start on the same batches.
#
# **Predict first:** how many times faster is an epoch on the cached features than through the network?

# %%
guess_cache_speedup = None  # YOUR GUESS: epoch time through the network / on the cache, e.g. 3

# %%
caching = lab.feature_caching(cfg)
print(caching.finding())
print(guesses.versus(guess_cache_speedup, caching.speedup, "head-only epoch: network / cache", "x"))
plots.bar(caching, x="method", y="epoch_time_s");

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the cache trains the same head (the same computation), and an epoch on it is faster
assert caching.head_weight_diff < 1e-3 and caching.speedup > 1
acc = [labkit.measure.Measured.accuracy(a, P.test_size) for a in caching.frame.accuracy]
assert labkit.measure.compare(*acc).real is False  # both measured, no difference beyond the test noise

# %% [markdown]
# Both ways train the same head on the same features, so their accuracies match up to float rounding. The
# cache costs memory (one feature map per training image) and one pass to build, and works only while the
# features stay fixed: not with data augmentation, nor when a stage before the head trains. Linear
# probing (a head on frozen features) often runs on cached features, as a cheap first look at a model.
#
# ## 6. Gradual unfreezing and discriminative learning rates
# Two refinements between the fixed levels (Howard & Ruder 2018, ULMFiT). **Gradual unfreezing** starts at
# `head_only` and thaws one stage from the top every few steps, so the new head settles before it sends
# large gradients into the pretrained stages. **Discriminative learning rates** train everything, each stage
# at `decay` times the learning rate of the stage above it (`freezing.discriminative_param_groups`; 1/2.6,
# ULMFiT's factor). Both run for the same steps as the fixed levels:

# %%
schedules = lab.schedule_runs(cfg, sweep)
plots.bars(schedules, x="setup", ys=["accuracy", "mean_step_time_s"])
schedules

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every schedule ran and ended with the whole network training, optimizer state included
sc = schedules.set_index("setup")
assert sc.error.isna().all()
assert (sc.num_trainable_params[list(lab.SCHEDULES)] == sc.num_trainable_params["none"]).all()
assert sc.mem_optimizer_state_bytes["gradual unfreezing"] == sc.mem_optimizer_state_bytes["none"]

# %% [markdown]
# A gradual schedule is cheaper than full fine-tuning while stages are frozen; its memory (measured on one
# extra step at its end) is the full fine-tune's. Whether a refinement beats a fixed level depends on the
# steps and the learning rate: with few steps, the early stages have little time to adapt.

# %% [markdown]
# Published figures for scale (PyTorch's transfer-learning tutorial, ULMFiT's unfreezing study; not measured here):

# %%
display.table(labkit.results.published("05_freezing-*"))

# %% [markdown]
# ## 7. Your turn: the panel
# Choose a freezing level, the steps and the learning rate, and press **Run**. Each run adds bars for its
# step time, memory by category and accuracy next to earlier runs.

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
# | "frozen" layers still change | their BatchNorm is in training mode | keep frozen BatchNorm in eval mode |
# | optimizer state as large as before | optimizer state made before the freeze | freeze first, then build it |
# | frozen stages still get gradients | frozen after the forward recorded its graph | freeze before the forward |
# | no speed-up | frozen stages after trainable ones; a tiny, launch-bound model | freeze a prefix |
# | memory barely drops | the frozen forward still needs working memory; weights stay | expected |
# | accuracy far lower at `head_only` | frozen features do not fit the new task | freeze less, unfreeze gradually |

# %% [markdown]
# ## Going further
# - **Another model.** `lab.level_sweep(cfg.replace(model="shufflenet_v2_x0_5"))` repeats the sweep on
#   ShuffleNetV2 (offline weights ship with labkit; several minutes at `quick` on a CPU). Its depthwise
#   convolutions show a FLOP counter quirk: torch counts a grouped convolution's weight gradient at `groups`
#   times its forward FLOPs, so the measured backward exceeds the layer-by-layer count by exactly the
#   sweep's `counter_overcount_flops`.
# - **Adapters and LoRA** (notebook 08) train small added matrices in every layer of a frozen backbone.
# - torchvision's detection models freeze every BatchNorm with `FrozenBatchNorm2d`: their per-GPU batches are
#   too small for batch statistics.
# - **Linear probing, then fine-tuning** (LP-FT, Kumar et al. 2022): train the head on frozen features first,
#   then everything; a random head distorts the pretrained features more.

# %% [markdown]
# ## Summary
# - Freezing is `p.requires_grad_(False)` **and** BatchNorm kept in eval mode under `model.train()`; build the
#   optimizer afterwards. `RunConfig(freeze=...)` does both.
# - A frozen **prefix** removes its whole backward pass and the activations kept for it; the forward stays,
#   so a step's FLOPs cannot fall below about a third.
# - Gradients and optimizer state shrink with the trainable parameters.
# - What freezing costs in accuracy depends on how close the tasks are: measure it.
# - With only the head training, cache the frozen features; gradual unfreezing and discriminative learning
#   rates sit between the fixed levels.

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
mine = sweep.own_backward("heavy")  # your model's FLOPs at heavy, from section 3
print(exercises.question("05.own_backward", mine))

# %%
answer = None  # YOUR CODE: GFLOP
exercises.check("05.own_backward", answer, mine)
print(sweep.backward_check(mine))

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

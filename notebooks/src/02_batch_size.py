# %% [markdown]
# # Batch size: time, memory, accuracy, and the largest batch that fits
#
# The batch size is the first knob anyone turns, and folklore about it is everywhere: "memory grows
# linearly", "bigger batches train faster", "inference time doesn't care", "small batches generalise
# better". This notebook measures each claim on your hardware, then shows how to get the gradient of a
# large batch without its memory (gradient accumulation), how to find the largest batch that fits, and
# how to predict memory before you run out of it.
#
# **You will learn**
# 1. how step time, epoch time, throughput, inference time, peak memory and accuracy change with the batch size;
# 2. to fit memory = fixed + bytes per sample x batch, and read the slope (activation bytes per sample);
# 3. the linear learning-rate scaling rule, warm-up, and when they help;
# 4. the accumulation loop itself, why it gives the same gradient as a large batch, why BatchNorm breaks
#    that, and what `no_sync` does under DDP;
# 5. the out-of-memory back-off loop, how to find the largest batch that fits a memory budget
#    (`labkit.find_max_batch_size`) and how to predict memory (`labkit.estimate_memory`).
#
# **What you need:** notebook 00 (timing and memory). A CPU is fine: memory is counted exactly on a
# CPU, so sections 2, 4, 5 and 6 mean the same there; the time curves are this CPU's, whose cores fill
# at much smaller batches than a GPU's.

# %%
import labkit
from labkit import capacity, equivalence, guesses, plots, views
from labkit.labs import batch_size as lab  # this notebook's experiments and findings
from labkit.labs.batch_size import exercises  # this notebook's exercises: question, check, solution
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
print(f"profile {P.name}: batch sizes {P.batch_sizes}, {P.sweep_epochs} epoch(s) of {P.train_size} images each")
labkit.env_report()

# %% [markdown]
# ## 1. The idea
# An epoch of $N$ samples at batch size $B$ takes $N/B$ optimizer steps. A larger batch gives each step
# more parallel work, so a step takes longer but usually less than proportionally: the epoch gets
# shorter, until the device is full. Memory has a part that does not depend on the batch (parameters,
# gradients, optimizer state) and a part that does (the activations saved for the backward pass):
#
# $$\text{peak memory}(B) \approx \text{fixed} + B \times \text{bytes per sample}.$$
#
# The fixed part of the fitted line is close to, not equal to, parameters + gradients + optimizer state:
# at the moment of the peak (early in the backward pass) most gradients do not exist yet. What a larger
# batch does to accuracy after a fixed number of epochs is less simple: it takes fewer, less noisy
# steps. The learning rate decides a lot of it (section 3).

# %% [markdown]
# ## 2. The sweep
# One fine-tune per batch size, each for the same number of epochs, starting from the same pretrained
# weights. Epoch time is the median step time times the steps per epoch (warm-up excluded; data loading,
# which is small here because the data sits in memory, is not included); inference time is the time to
# predict the test split in batches of that size.

# %% [markdown]
# **Predict first.** As the batch grows, the epoch time falls and then stops falling. At which of the
# profile's batch sizes (printed in the setup cell) does it stop, within 10 % of the fastest epoch, here?

# %%
guess_floor_batch = None  # YOUR GUESS: a batch size from the profile's list, e.g. 64

# %%
cfg = labkit.config.baseline(P)  # the profile's workload, pretrained, AdamW lr 1e-3
df = lab.batch_sweep(cfg)  # cached: a rerun is instant, an interrupted sweep keeps its finished runs
ref = labkit.load_reference("02_batch_size-sweep*", lr_setting="same lr")
print(guesses.versus(guess_floor_batch, lab.epoch_time_floor(df), "batch where epoch time stops falling"))
df[["batch_size", "steps_per_epoch", "step_time_s", "epoch_time_s", "throughput", "inference_time_s",
    "peak_memory_bytes", "accuracy", "error"]]

# %%
plots.lines(df, x="batch_size", ys=["epoch_time_s", "throughput", "inference_time_s", "peak_memory_bytes",
                                    "accuracy", "step_time_s"], reference=ref, logx=True);

# %%
line = capacity.fit_linear_memory(df.batch_size, df.peak_memory_bytes)
print(f"peak = {line.fixed_bytes / 2**20:.2f} MiB + {line.bytes_per_sample / 1024:.0f} KiB x batch "
      f"(R^2 = {line.r2:.4f}): each sample adds {line.bytes_per_sample / 1024:.0f} KiB (activations, backward buffers)")
lab.seed_claims(df)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every batch size ran, memory grows with the batch along a line
ok = df[df.error.isna()].sort_values("batch_size")
assert len(ok) == len(P.batch_sizes), df.error.dropna().tolist()
assert ok.peak_memory_bytes.is_monotonic_increasing and line.r2 > 0.95
assert (ok.steps_per_epoch == P.train_size // ok.batch_size).all()

# %% [markdown]
# How to read the verdicts: each is computed from the runs above, so they can differ between a CPU, a
# T4 and an A100, and between profiles. Typical outcomes: memory is linear almost everywhere (the
# verdict table prints the slope). Epoch time falls while the device still has idle parallel units and
# then flattens, or even rises again once a batch no longer fits the caches; on a CPU that happens early,
# on a GPU it falls over a much wider range. Inference time
# for the whole test split behaves like training time (it is the same arithmetic without the backward
# pass): it barely moves only once the device is saturated. The accuracy claim is the shakiest: with a
# fixed number of epochs, small batches take many more steps, and at the `ci` profile one test image is
# a few tenths of a percent, so read it together with section 3.

# %% [markdown]
# ## 3. Learning-rate scaling and warm-up
# If the batch grows $k$ times, each epoch has $k$ times fewer steps, and each step's gradient is less
# noisy. The **linear scaling rule** (Goyal et al., 2017) multiplies the learning rate by $k$ to make up
# for it; a **warm-up** ramps the learning rate up over the first steps, because a large learning rate
# on a freshly started fine-tune can wreck the pretrained weights. The rule was derived for SGD; for
# Adam-type optimizers a square-root rule (`rule="sqrt"`) is often closer. Here the baseline learning
# rate was tuned at the baseline's batch size (64 for the small workload, 128 for `full`'s ResNet-18),
# so the scaled runs get a smaller rate below it and a larger one above.

# %%
warmup = P.train_size // max(P.batch_sizes) * P.sweep_epochs // 4  # a quarter of the shortest run
lr_df = lab.compare_lr_scaling(cfg, warmup_steps=warmup)
print(lab.lr_scaling_finding(lr_df))
plots.line(lr_df, x="batch_size", y="accuracy", hue="lr_setting", logx=True,
           reference=labkit.load_reference("02_batch_size-sweep*"));

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the scaled learning rates follow the linear rule
scaled = lr_df[lr_df.lr_setting == "scaled"].set_index("batch_size").lr
assert scaled[cfg.batch_size] == cfg.lr and scaled[8] == cfg.lr * 8 / cfg.batch_size

# %% [markdown]
# What to look for: where the scaled runs beat the same-learning-rate runs, the rule helped; where they
# lose, either the rule overshoots (common with Adam at large batches: try `"sqrt"` in the panel) or, with
# few epochs, the smaller rates at small batches simply learn less. Warm-up matters most for the
# largest batches and learning rates.

# %% [markdown]
# ## 4. Gradient accumulation
# With `grad_accum=k`, labkit splits each batch of $B$ into $k$ micro-batches of $B/k$, runs forward and
# backward on each, divides each loss by $k$ and steps the optimizer once. Gradients add up, so the
# result is the gradient of the mean loss over all $B$ samples, with the activation memory of $B/k$:
#
# $$\nabla \frac{1}{B}\sum_{i=1}^{B} \ell_i = \sum_{j=1}^{k} \nabla \frac{1}{k}\Big(\frac{k}{B}\sum_{i \in
# \text{micro-batch } j} \ell_i\Big).$$

# %% [markdown]
# **The mechanism.** The accumulation loop in plain PyTorch, and a check that on a model without
# BatchNorm it gives the gradient of the whole batch (TF32 off: its rounding would blur the comparison):

# %%
import torch
import torch.nn.functional as F


def accumulated_gradients(model, images, labels, k):
    model.zero_grad(set_to_none=True)
    for x, y in zip(images.chunk(k), labels.chunk(k), strict=True):  # k micro-batches of B / k samples
        loss = F.cross_entropy(model(x), y) / k  # each mean loss / k: together the mean over all B
        loss.backward()  # gradients add up in .grad
    return [p.grad.clone() for p in model.parameters()]


# %%
labkit.env.set_tf32(False)
split, device = labkit.train.run_splits(cfg)["train"], labkit.env.resolve_device(cfg.device)
model = lab.without_batchnorm(labkit.models.build(cfg.model, split.num_classes, pretrained=False)[0]).to(device)
x = labkit.data.to_model_input(split.images[:cfg.batch_size], split, device, size=cfg.image_size)
y = split.labels[:cfg.batch_size].to(device)
whole, accumulated = accumulated_gradients(model, x, y, 1), accumulated_gradients(model, x, y, 4)
gap = max(float((a - b).abs().max()) for a, b in zip(whole, accumulated, strict=True))
print(f"largest difference: {gap:.2e}, relative to the largest gradient entry "
      f"{gap / max(float(g.abs().max()) for g in whole):.2e}")


# %% jupyter={"source_hidden": true} tags=["check"]
# check: the accumulation loop equals Trainer.step with grad_accum=4 and one large batch
def accumulation_step(model, images, labels, optimizer):
    accumulated_gradients(model, images, labels, k=4)
    optimizer.step()


# the loop equals labkit's Trainer.step with grad_accum=4 (on the real model, BatchNorm included)
assert equivalence.compare_step(accumulation_step, cfg.replace(grad_accum=4, optimizer="sgd")).same(rel_tol=1e-4)
assert gap / max(float(g.abs().max()) for g in whole) < 1e-4, "without BatchNorm: float rounding only"

# %% [markdown]
# That holds exactly only if each sample's loss does not depend on the others. **BatchNorm** breaks it:
# in training mode it normalises with the statistics of the batch it sees, a micro-batch of $B/k$
# instead of the whole batch. Below, the largest difference between the two gradients, for the model as
# it is (BatchNorm training), with BatchNorm in eval mode (running statistics) and with BatchNorm removed:

# %%
acc = lab.accumulation_table(cfg, accum_steps=4)
acc

# %% jupyter={"source_hidden": true} tags=["check"]
# check: only BatchNorm in training mode makes accumulation differ
gap = acc.set_index("batchnorm").relative_diff
assert gap["none"] < 1e-4 and gap["eval"] < 1e-4, "without batch statistics only float rounding differs"
assert gap["train"] > 1e-2, "BatchNorm in training mode normalises each micro-batch on its own"

# %% [markdown]
# Accumulation trades time for memory: the same batch in smaller pieces has a smaller activation peak,
# and each piece uses the device less fully.

# %%
accum = labkit.sweep(cfg, grad_accum=[1, 2, 4, 8])
print(lab.accumulation_finding(accum))
plots.bars(accum, x="grad_accum", ys=["peak_memory_bytes", "step_time_s"],
           reference=labkit.load_reference("02_batch_size-accumulation*"));


# %% [markdown]
# **Under DDP** (a later notebook of this lab covers distributed training), each `backward()` normally all-reduces the
# gradients across GPUs. During accumulation that is wasted on every micro-batch but the last: the
# gradients are not final yet. DDP's `model.no_sync()` context skips the all-reduce; labkit's training
# step wraps every micro-batch except the last in it (`labkit.techniques.accumulation.sync_context`), around the forward *and*
# the backward pass, because DDP decides during the forward pass whether to sync.

# %% [markdown]
# ## 5. The largest batch that fits
# `labkit.find_max_batch_size(cfg, budget_bytes=None)` doubles the batch from `cfg.batch_size` until a
# step no longer fits, then bisects to the exact largest size. Each probe is one real training step
# (forward, backward, optimizer step with its state) on synthetic inputs. On a GPU without a budget, it
# fits when the step does not run out of memory (the error is caught, the cache freed, and the search
# backs off). With a budget, and always on a CPU, it fits when the measured peak stays within the budget,
# so the idea works without a GPU. Here the budget is a pretend GPU four times the size of one
# baseline step's peak:

# %% [markdown]
# **The mechanism.** The back-off loop behind it, in plain PyTorch: try a step, catch the
# out-of-memory error, free the cache, try a smaller batch. It doubles until a step fails, then bisects.
# It frees the cache only after leaving the `except` block: until then the error's traceback still holds
# the failed step's tensors.

# %%
def largest_batch(step, start=1):
    def fits(batch_size):
        try:
            return step(batch_size) or True
        except torch.OutOfMemoryError:
            pass  # free memory after the except block: its traceback still holds the failed step's tensors
        torch.cuda.empty_cache()  # give the failed step's blocks back before the next try
        return False
    fitting, failing = 0, start
    while fits(failing):  # double until a step runs out of memory
        fitting, failing = failing, failing * 2
    while failing - fitting > 1:  # then bisect between the last fit and the first failure
        middle = (fitting + failing) // 2
        fitting, failing = (middle, failing) if fits(middle) else (fitting, middle)
    return fitting


# %% jupyter={"source_hidden": true} tags=["check"]
# check: the back-off loop finds the same batch as labkit's search, trying the same sizes
tried = []


def pretend_gpu_step(batch_size):  # a pretend GPU on which 300 samples fit
    tried.append(batch_size)
    if batch_size > 300:
        raise torch.OutOfMemoryError("CUDA out of memory (pretend)")


assert largest_batch(pretend_gpu_step, start=8) == 300
mine, tried[:] = list(tried), []
engine = labkit.techniques.oom_backoff.search_batch_size(lambda b: pretend_gpu_step(b) is None, start=8)
assert engine.best == 300 and tried == mine, (tried, mine)  # the same sizes, in the same order

# %%
BUDGET = 4 * capacity.step_memory(cfg, cfg.batch_size).total_bytes  # a pretend GPU
search = capacity.batch_search(cfg, budget_bytes=BUDGET)
print(f"largest batch within {BUDGET / 2**20:.0f} MiB: {search.best} "
      f"({len(search.tried)} probes in {search.elapsed_s:.1f} s)")
plots.batch_search(search);

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the search ended on the exact boundary of the budget
tried = {p.batch_size: p for p in search.tried}
assert tried[search.best].fits and tried[search.best].peak_bytes <= BUDGET
assert not tried[search.best + 1].fits  # the bisection ended on the exact boundary
assert labkit.find_max_batch_size(cfg, budget_bytes=BUDGET) == search.best

# %% [markdown]
# ## 6. Predicting memory
# Measuring two small batches is enough to draw the line of section 1 and extrapolate it. Below, the
# prediction from batches of 16 and 32 is checked against steps measured at larger sizes:

# %%
table = lab.prediction_table(cfg, fit_sizes=(16, 32), check_sizes=(64, 128, 256))
print(lab.prediction_finding(table))
plots.line(table, x="batch_size", y="peak_memory_bytes", hue="kind", logx=True);

# %% jupyter={"source_hidden": true} tags=["check"]
# check: a line through two small batches predicts larger ones within 25 %
assert table.prediction_error.dropna().abs().max() < 0.25  # a line through two small batches: close, not exact

# %%
estimate = labkit.estimate_memory(cfg, batch_size=1024)
for category, nbytes in estimate.items():
    print(f"{category:>16} {nbytes / 2**20:8.1f} MiB")

# %% [markdown]
# The prediction is usually a little low for large batches: the fit through two small batches misses
# small per-sample costs that only show up at scale (temporary buffers of the backward pass). The
# estimate above is split by category *at the moment of the peak*: during the backward pass, so most
# gradients do not exist yet and the activations dominate.

# %% [markdown]
# ## 7. Your turn: the panel
# Choose the batch size, the accumulation steps and whether the learning rate follows the batch size
# (scaled from the baseline's batch size), then press **Run**. Each run is added to the charts.

# %%
panel = ExperimentPanel(
    run=lab.run_with_lr_scaling,
    controls={"batch_size": (16, 256, 16), "grad_accum": [1, 2, 4, 8]},
    options={"lr_scaling": [False, "linear", "sqrt"]},
    base=cfg, show=views.History(("step_time_s", "peak_memory_bytes", "accuracy")), title="Batch size")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | out of memory at a batch that "should" fit | reserved cache, fragmentation, or a larger eval batch | `find_max_batch_size`, leave headroom, `torch.cuda.empty_cache()` between experiments |
# | larger batch, worse accuracy after the same epochs | fewer steps, learning rate not scaled | linear/sqrt scaling with warm-up, or more epochs |
# | loss explodes after scaling the learning rate | no warm-up, or the linear rule with Adam | warm-up, `sqrt` rule, gradient clipping |
# | accumulation does not match the large batch | BatchNorm statistics per micro-batch, loss not divided by k | GroupNorm/LayerNorm or frozen BN; divide the loss (labkit does) |
# | DDP with accumulation is slow | gradients all-reduced on every micro-batch | `no_sync()` on all but the last micro-batch (labkit does) |

# %% [markdown]
# ## Going further
# - How large a batch is still useful depends on the noise of the gradient: McCandlish et al.'s
#   *gradient noise scale* predicts the batch beyond which more samples per step stop paying.
# - For very large batches, layer-wise learning-rate rules (LARS for SGD, LAMB for Adam) keep training
#   stable where the linear rule breaks.
# - Hugging Face Accelerate's `find_executable_batch_size` is a simpler back-off as a decorator around
#   your training function: it shrinks the batch after each out-of-memory error, without doubling or
#   bisecting.

# %% [markdown]
# ## Summary
# - Peak memory is close to a line in the batch size: the slope is the activation memory per sample.
# - Larger batches shorten an epoch until the device is full; what they do to accuracy depends on the
#   learning rate and the number of steps, so scale the learning rate and measure.
# - Gradient accumulation gives a large batch's gradient (exactly, without BatchNorm) at a micro-batch's memory.
# - `labkit.find_max_batch_size` and `labkit.estimate_memory` answer "what fits" before you run out of memory.

# %% [markdown]
# ## Further reading
# - Goyal et al. 2017, *Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour* (linear scaling,
#   warm-up): https://arxiv.org/abs/1706.02677
# - Keskar et al. 2017, *On Large-Batch Training for Deep Learning: Generalization Gap and Sharp Minima*:
#   https://arxiv.org/abs/1609.04836
# - McCandlish et al. 2018, *An Empirical Model of Large-Batch Training*: https://arxiv.org/abs/1812.06162
# - PyTorch, `DistributedDataParallel.no_sync`:
#   https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
# - Hugging Face Accelerate, `find_executable_batch_size`:
#   https://huggingface.co/docs/accelerate/package_reference/utilities

# %% [markdown]
# ## Exercises
# The first asks for code: accumulation over micro-batches of *different* sizes, where dividing by
# $k$ is no longer right. The checker compares your gradients with the whole batch's and with labkit's
# `Trainer.step`.

# %%
print(exercises.question("02.accumulate"))


# %%
def accumulate(model, micro_batches):
    """Leave in .grad the gradient of the mean loss over all samples of micro_batches."""
    raise NotImplementedError  # YOUR CODE


exercises.check("02.accumulate", accumulate)

# %% [markdown]
# The next one uses **your own** numbers: the line fitted in section 2 and the pretend GPU of section 5.
# The line under the check sets your answer beside what `find_max_batch_size` found by probing. Which
# would you trust on a real GPU, and how much headroom would you leave?

# %%
mine = lab.max_batch_numbers(line, BUDGET)  # your sweep's line and section 5's budget
print(exercises.question("02.max_batch", mine))

# %%
answer = None  # YOUR CODE: a batch size
exercises.check("02.max_batch", answer, mine)
print(lab.line_vs_search(mine, search.best))

# %%
print(exercises.question("02.slope"))

# %%
answer = None  # YOUR CODE: KiB per sample
exercises.check("02.slope", answer)

# %%
print(exercises.question("02.accum"))

# %%
answer = None  # YOUR CODE: grad_accum
exercises.check("02.accum", answer)

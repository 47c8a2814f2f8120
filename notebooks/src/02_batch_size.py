# %% [markdown]
# # Batch size: time, memory, accuracy, and the largest batch that fits
#
# The batch size is the first knob anyone turns, and folklore about it is everywhere. This notebook tests four
# popular claims on your hardware, gets a large batch's gradient without its memory, finds the largest batch
# that fits, and predicts memory.
#
# **You will learn**
# 1. how epoch time, throughput, inference time, peak memory and accuracy change with the batch size;
# 2. to fit memory = fixed + bytes per sample x batch, and read the slope (activation bytes per sample);
# 3. the linear learning-rate scaling rule, warm-up, and when they help;
# 4. the accumulation loop, why it equals a large batch, why BatchNorm breaks that, and `no_sync` under DDP;
# 5. the out-of-memory back-off loop, `labkit.find_max_batch_size` and `labkit.estimate_memory`;
# 6. a language model's batch in tokens, and accumulation over token losses.
#
# **What you need:** notebook 00 (timing and memory). A CPU is fine: memory is counted exactly there; the time
# curves are this CPU's, which fills up at smaller batches than a GPU. At `ci` and `quick` the accuracy
# differences mostly lie within the test-set noise, and the verdicts say so.

# %%
import labkit
from labkit import capacity, display, equivalence, guesses, plots, views
from labkit.labs import batch_size as lab  # this notebook's experiments and findings
from labkit.labs.batch_size import exercises  # this notebook's exercises: question, check, solution
from labkit.runsetup import set_up
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
# The fitted fixed part is close to, not equal to, parameters + gradients + optimizer state: at the peak
# (early in the backward pass) most gradients do not exist yet. What a larger batch does to accuracy is
# less simple: it takes fewer, less noisy steps, and the learning rate decides a lot (section 3).

# %% [markdown]
# ## 2. The sweep
# One fine-tune per batch size, each for the same number of epochs, from the same pretrained weights.
# Epoch time is the median step time times the steps per epoch (warm-up and data loading excluded);
# inference time is the time to predict the test split in batches of that size.
#
# **Predict first.** As the batch grows, the epoch time falls and then stops falling. At which of the
# profile's batch sizes (printed in the setup cell) does it come within 10 % of the fastest epoch here?

# %%
guess_floor_batch = None  # YOUR GUESS: a batch size from the profile's list, e.g. 64

# %%
cfg = labkit.config.baseline(P)  # the profile's workload, pretrained, AdamW lr 1e-3
df = lab.batch_sweep(cfg)  # cached: a rerun is instant, an interrupted sweep keeps its finished runs
ref = labkit.load_reference("02_batch_size-sweep*", lr_setting="same lr")
print(guesses.versus(guess_floor_batch, df.floor(), "batch where epoch time stops falling"))
df

# %%
plots.lines(df.frame, x="batch_size", ys=["epoch_time_s", "throughput", "inference_time_s", "peak_memory_bytes",
                                    "accuracy", "step_time_s"], reference=ref, logx=True);

# %% [markdown]
# **Four popular claims**, from forum answers, tutorials and blog posts:
# 1. *"Memory grows linearly with the batch size"*: the rule of thumb behind "what batch will fit?".
# 2. *"A bigger batch trains an epoch faster"*: hence "use the largest batch that fits".
# 3. *"Inference time does not depend on the batch size"*: as if the batch size were a training setting only.
# 4. *"Small batches generalise better"*: usually citing Keskar et al. (2017), who found that large batches
#    settle in sharp minima.
#
# The next cell tests them on the sweep. A timing claim holds or fails only where the runs' p10-p90
# spreads do not overlap; an accuracy difference counts only beyond the test-set noise.

# %%
line = capacity.fit_linear_memory(df.batch_size, df.peak_memory_bytes)
print(f"peak = {line.fixed_bytes / 2**20:.3g} MiB + {line.bytes_per_sample / 1024:.3g} KiB x batch "
      f"(R^2 {line.r2:.3f}): each sample adds {line.bytes_per_sample / 1024:.3g} KiB of activations and buffers")
df.claims()

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every batch size ran, memory grows with the batch along a line
ok = df.frame[df.frame.error.isna()].sort_values("batch_size")
assert len(ok) == len(P.batch_sizes), df.error.dropna().tolist()
assert ok.peak_memory_bytes.is_monotonic_increasing and line.r2 > 0.95
assert (ok.steps_per_epoch == P.train_size // ok.batch_size).all()

# %% [markdown]
# The verdicts differ between a CPU, a T4 and an H200. Memory is linear almost everywhere. Epoch time
# falls while the device has idle parallel units, then flattens, or rises once a batch no longer fits the
# caches ("partly"): early on a CPU, over a much wider range on a GPU. Inference is the same arithmetic
# without the backward pass: small batches leave the device idle, and the claim fails wherever that shows
# beyond the noise. The accuracy claim is the shakiest: small batches also take more steps, and at `ci`
# one test image is 0.4 %, so "inconclusive" is the usual outcome there.

# %% [markdown]
# ## 3. Learning-rate scaling and warm-up
# If the batch grows $k$ times, each epoch has $k$ times fewer steps, each with a less noisy gradient.
# The **linear scaling rule** (Goyal et al., 2017) multiplies the learning rate by $k$ to make up for it;
# a **warm-up** ramps the learning rate up over the first steps, because a large rate on a fresh
# fine-tune can wreck the pretrained weights. The rule was derived for SGD; for Adam a square-root rule
# (`rule="sqrt"`) is often closer. The baseline's rate was tuned at its batch size (64, or 128 for
# `full`'s ResNet-18), so the scaled runs get a smaller rate below it and a larger one above.

# %%
warmup = P.train_size // max(P.batch_sizes) * P.sweep_epochs // 4  # a quarter of the shortest run
lr_df = lab.compare_lr_scaling(cfg, warmup_steps=warmup)
print(lr_df.finding())
plots.line(lr_df.frame, x="batch_size", y="accuracy", hue="lr_setting", logx=True,
           reference=labkit.load_reference("02_batch_size-sweep*"));

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the scaled learning rates follow the linear rule
scaled = lr_df.frame[lr_df.frame.lr_setting == "scaled"].set_index("batch_size").lr
assert scaled[cfg.batch_size] == cfg.lr and scaled[8] == cfg.lr * 8 / cfg.batch_size

# %% [markdown]
# Where the scaled runs are ahead, the rule helped; where the same rate is ahead, either the rule
# overshoots (common with Adam at large batches: try `"sqrt"` in the panel) or, with few epochs, the
# smaller rates at small batches simply learn less. Warm-up matters most for the largest batches and
# rates. "No clear winner" means the differences lie within the test-set noise.

# %% [markdown]
# Published figures for scale (Goyal et al.'s warm-up study at batch 8,192; measured elsewhere, not here):

# %%
display.table(labkit.results.published("02_batch_size-warmup*"))

# %% [markdown]
# ## 4. Gradient accumulation
# With `grad_accum=k`, labkit splits each batch of $B$ into $k$ micro-batches of $B/k$, runs forward and
# backward on each, divides each loss by $k$ and steps the optimizer once. Gradients add up, so the
# result is the gradient of the mean loss over all $B$ samples, with the activation memory of $B/k$:
#
# $$\nabla \frac{1}{B}\sum_{i=1}^{B} \ell_i = \sum_{j=1}^{k} \nabla \frac{1}{k}\Big(\frac{k}{B}\sum_{i \in
# \text{micro-batch } j} \ell_i\Big).$$
#
# **The mechanism.** The loop in plain PyTorch, and a check that on a model without BatchNorm it gives
# the whole batch's gradient (TF32 off: its rounding would blur the comparison):

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
s = set_up(cfg.replace(pretrained=False, tf32=False))  # the loop's device, seeded model and first batch
model, batch = lab.without_batchnorm(s.model), s.batch()
x, y = batch.images, batch.labels
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
# instead of the whole batch. Below, the largest gradient difference for the model as it is (BatchNorm
# training), with BatchNorm in eval mode (running statistics) and with BatchNorm removed:

# %%
acc = lab.accumulation_table(cfg, accum_steps=4)
acc

# %% jupyter={"source_hidden": true} tags=["check"]
# check: only BatchNorm in training mode makes accumulation differ
gap = acc.frame.set_index("batchnorm").relative_diff
assert gap["none"] < 1e-4 and gap["eval"] < 1e-4, "without batch statistics only float rounding differs"
assert gap["train"] > 1e-2, "BatchNorm in training mode normalises each micro-batch on its own"

# %% [markdown]
# Accumulation trades time for memory: smaller pieces have a smaller activation peak but use the device
# less fully. The runs train for the sweep's epochs, so `grad_accum=1` comes from the cache. The step time
# counts as changed only beyond the runs' p10-p90 spreads: usually it grows, most on a GPU.

# %%
epoch_cfg = cfg.replace(max_steps=None, epochs=P.sweep_epochs)  # as in the sweep: grad_accum=1 is cached
accum = lab.accumulation_sweep(epoch_cfg, grad_accum=[1, 2, 4, 8])
print(accum.finding())
plots.bars(accum.frame, x="grad_accum", ys=["peak_memory_bytes", "step_time_s"],
           reference=labkit.load_reference("02_batch_size-accumulation*"));

# %% [markdown]
# **Under DDP** (notebook 07), each `backward()` all-reduces the gradients across GPUs, wasted during
# accumulation on every micro-batch but the last. `model.no_sync()` skips it; labkit wraps every
# micro-batch but the last in it (`labkit.techniques.accumulation.sync_context`), around the forward *and*
# the backward, because DDP decides during the forward whether to sync.

# %% [markdown]
# ## 5. The largest batch that fits
# `labkit.find_max_batch_size(cfg, budget_bytes=None)` doubles the batch from `cfg.batch_size` until one
# real training step (on synthetic inputs) no longer fits, then bisects to the exact largest size. On a
# GPU without a budget a batch fits when the step does not run out of memory; with a budget, and always
# on a CPU, when the measured peak stays within it.
#
# **The mechanism.** The back-off loop in plain PyTorch: try a step, catch the out-of-memory error, free
# the cache (after the `except` block: see the comment), try a smaller batch.

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

# %% [markdown]
# Here the budget is a pretend GPU twice the size of one baseline step's peak:

# %%
BUDGET = 2 * capacity.step_memory(cfg, cfg.batch_size).total_bytes  # a pretend GPU
search = capacity.batch_search(cfg, budget_bytes=BUDGET)  # find_max_batch_size, keeping every probe
print(f"largest batch within {BUDGET / 2**20:.3g} MiB: {search.best} "
      f"({len(search.tried)} probes in {search.elapsed_s:.1f} s)"
      + (f"; the search stopped at its limit, {search.limit_reason}" if search.hit_limit else ""))
plots.batch_search(search);

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the search ended on the exact boundary of the budget
tried = {p.batch_size: p for p in search.tried}
assert tried[search.best].fits and tried[search.best].peak_bytes <= BUDGET
assert not tried[search.best + 1].fits  # the bisection ended on the exact boundary
assert labkit.find_max_batch_size(cfg, budget_bytes=BUDGET, start=search.best, limit=search.best + 1) == search.best

# %% [markdown]
# ## 6. Predicting memory
# Two small batches are enough to draw the line of section 1 and extrapolate it. Below, the prediction
# from batches of 16 and 32 is checked against steps measured at larger sizes:

# %%
table = lab.prediction_table(cfg, fit_sizes=(16, 32), check_sizes=(64, 128, 256))
print(table.finding())
plots.line(table.frame, x="batch_size", y="peak_memory_bytes", hue="kind", logx=True);

# %% jupyter={"source_hidden": true} tags=["check"]
# check: a line through two small batches predicts larger ones within 25 %
assert table.frame.prediction_error.dropna().abs().max() < 0.25  # a line through two small batches: close, not exact

# %% [markdown]
# The prediction is usually a little low for large batches: two small batches miss per-sample costs that
# show up only at scale (temporary buffers of the backward pass). `labkit.estimate_memory` fits a ladder
# of sizes instead, and splits its estimate by category *at the peak*, during the backward pass, when most
# gradients do not exist yet and the activations dominate:

# %%
display.table(lab.estimate_frame(labkit.estimate_memory(cfg, batch_size=1024)))

# %% [markdown]
# ## 7. A language model
# A language model's batch is counted in tokens: rows x length, padding included. Its loss is a mean over label
# tokens, so accumulation divides each micro-batch's summed loss by the step's label tokens (notebook 10 shows
# why). Here the profile's Llama takes 8 padded rows of text in 1, 2 and 4 micro-batches.
# **Predict first:** the peak with 4 micro-batches, as a fraction of one batch's?

# %%
guess_lm_peak = None  # YOUR GUESS: e.g. 0.5

# %%
lm_accum = lab.lm_accumulation()  # grad_accum 1, 2, 4 on the same 8 rows (cached)
lm_peaks = lm_accum.frame.peak_memory_bytes
print(guesses.versus(guess_lm_peak, lm_peaks.iloc[-1] / lm_peaks.iloc[0], "peak, 4 micro-batches / one batch"))
lm_accum

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the same losses as one large batch, with a lower peak in smaller micro-batches
assert lm_accum.frame.error.isna().all() and (lm_accum.frame.loss_diff < 1e-5).all()
assert lm_peaks.is_monotonic_decreasing and lm_peaks.iloc[-1] < lm_peaks.iloc[0]

# %% [markdown]
# ## 8. Your turn: the panel
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
# | out of memory at a batch that "should" fit | cache, fragmentation, eval batch | `find_max_batch_size`, headroom |
# | larger batch, worse accuracy, same epochs | fewer steps, learning rate not scaled | scale lr with warm-up |
# | loss explodes after scaling the lr | no warm-up, or the linear rule with Adam | warm-up, `sqrt` rule, clipping |
# | accumulation differs from the large batch | BatchNorm per micro-batch; loss not divided by k | GroupNorm; divide |
# | DDP with accumulation is slow | an all-reduce on every micro-batch | `no_sync()` (labkit does it) |

# %% [markdown]
# ## Going further
# - How large a batch is still useful depends on the noise of the gradient: McCandlish et al.'s
#   *gradient noise scale* predicts the batch beyond which more samples per step stop paying.
# - For very large batches, layer-wise learning-rate rules (LARS for SGD, LAMB for Adam) keep training
#   stable where the linear rule breaks.
# - Hugging Face Accelerate's `find_executable_batch_size` is a simpler back-off: a decorator that halves
#   the batch after each out-of-memory error.

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
# The next one uses **your own** numbers: the line of section 2 and the pretend GPU of section 5. Under
# the check, your answer stands beside what `find_max_batch_size` found by probing. They often differ by
# a few samples: the line averages whole runs' peaks, a probe measures the one step it tries. Which would
# you trust on a real GPU, and how much headroom would you leave?

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

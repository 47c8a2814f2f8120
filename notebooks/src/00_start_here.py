# %% [markdown]
# # Start here: how labkit measures fine-tuning
#
# Every notebook in this lab changes one thing about fine-tuning and shows what it does to four numbers:
# **time, memory, accuracy and size**. They are only worth something if measured correctly, so this
# notebook shows *how* labkit measures, live on your machine, and the few lines of plain PyTorch behind each
# measurement, so you can measure your own loop the same way.
#
# **You will learn**
# 1. why a GPU timer needs synchronisation and every timer needs warm-up, and how to write one;
# 2. the difference between *allocated* and *reserved* memory, how to read the peak, and what a training
#    step's memory is made of;
# 3. how a baseline fine-tune of a pretrained model looks in numbers: loss curve, step time, throughput,
#    peak memory, accuracy, model size and achieved FLOP/s;
# 4. how to rerun an experiment from the control panel.
#
# **What you need:** nothing before this notebook. A CPU is fine for everything here. On a CPU, section 1's
# synchronised and unsynchronised timings differ only by noise (a CPU has nothing to wait for), which is
# itself the lesson, and section 5 has no utilisation figure: it compares your run with published GPU peaks.

# %%
import labkit
from labkit import guesses, plots, views
from labkit.labs import start_here as lab  # this notebook's experiments and findings
from labkit.labs.start_here import exercises  # this notebook's exercises: question, check, solution
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
print(f"profile {P.name}: {P.train_size} training images, {P.max_steps} steps per fine-tune")
labkit.env_report()

# %% [markdown]
# The report answers the questions every later notebook asks: is there a GPU, which compute capability
# (7.5 = T4, 6.0 = P100, 8.0+ = Ampere or newer), does it run **bf16 natively** (a T4 only emulates it, so
# labkit says `bf16: False` there), does it have **tensor cores**, and is **TF32** allowed for float32 matrix
# multiplies and convolutions. labkit sets TF32 explicitly in every run and records it: a float32 baseline
# that silently used TF32 is not a float32 baseline.

# %% [markdown]
# ## 1. Timing: warm-up and synchronisation
# A CUDA GPU runs kernels **asynchronously**: `loss.backward()` returns as soon as the kernels are
# queued, long before they finish. A host clock read right after it measures how fast Python queued the
# work, not the work. The fix is to wait for the GPU (`torch.cuda.synchronize()`) or to time with CUDA
# events, which labkit does. The very first call of anything is also slower than the rest: memory is
# allocated, kernels are chosen, caches are cold. labkit therefore never times its first steps.
#
# $$\text{step time} = \operatorname{median}_{i \in \text{timed steps}} (t^{\text{end}}_i - t^{\text{start}}_i),
# \qquad \text{throughput} = \frac{\text{batch size}}{\text{step time}}$$

# %%
cfg = labkit.config.baseline(P)  # the profile's workload, pretrained: see the line it prints
print(f"workload: {cfg.model} fine-tuned on {cfg.dataset}, batch {cfg.batch_size}, {cfg.max_steps} steps")

# %% [markdown]
# **Predict first.** labkit times one training step of the baseline three ways: its very first call, the
# warm median with synchronisation (the right number), and the warm median read without synchronising.
# How many times slower than a warm step is the very first call, on this machine?

# %%
guess_first_call = None  # YOUR GUESS: first call / warm median, e.g. 3

# %%
demo = lab.timing_demo(cfg, repeats=P.repeats)
print(guesses.versus(guess_first_call, demo.pitfalls.cold_vs_warm, "first call / warm median", "x"))
demo

# %%
plots.bar(demo.frame, x="method", y="time_s");

# %% [markdown]
# What you should see: on a GPU, the first call is many times slower than the warm median (it allocates
# memory, chooses kernels, creates cuBLAS/cuDNN handles), and the unsynchronised reading is too small
# whenever the GPU has real work to do; if the GPU finishes a step faster than Python queues it, the CPU
# side is the bottleneck and the readings agree. On a CPU, the first call is still slower, but the two warm
# readings agree: CPU operations finish before they return. A first call looks warm when an earlier cell
# already ran the same operations; warm up anyway. labkit takes the two warm readings alternately, so that
# both see the same load, and calls a gap real only outside the warm steps' 10-90% spread.

# %% [markdown]
# **The mechanism.** The same timer in plain PyTorch, for your own loop. `sync` waits for the GPU
# (`torch.cuda.synchronize`); on a CPU there is nothing to wait for. `synchronise=False` is the classic
# mistake. `trainer.step` is labkit's training step for `cfg` (forward, backward, optimizer step); any
# function works.

# %%
import statistics
import time

import torch

trainer = labkit.train.Trainer(cfg)  # the baseline's model, optimizer and data
images, labels = next(iter(trainer.loader))
step, device = (lambda: trainer.step(images, labels)), trainer.device
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


# %%
def median_step_s(step, warmup=3, repeats=10, synchronise=True):
    for _ in range(warmup):  # first calls: memory allocation, kernel choice, cold caches
        step()
    sync()  # the warm-up's queued work must not land in the first timed step
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        if synchronise:
            sync()  # wait until the GPU has finished before reading the clock
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# %% [markdown]
# On a GPU, CUDA **events** time the work on the GPU itself: record one before and one after, wait
# for the second, and read the time between them. labkit's `StepTimer` uses them (one
# synchronisation at the end instead of one per step).

# %%
def median_step_s_events(step, warmup=3, repeats=10):  # CUDA only
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()  # wait for this step's kernels only
        times.append(start.elapsed_time(end) / 1e3)  # milliseconds -> seconds
    return statistics.median(times)


# %%
right, wrong = median_step_s(step), median_step_s(step, synchronise=False)
events = median_step_s_events(step) if device.type == "cuda" else None
print(f"synchronised: {right * 1e3:.2f} ms, not synchronised: {wrong * 1e3:.2f} ms ({wrong / right:.2f}x)"
      + (f", CUDA events: {events * 1e3:.2f} ms" if events else " (no CUDA events on a CPU)"))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the plain timers agree with labkit's StepTimer, timed alternately so that both see the same load
assert demo.pitfalls.first_call_s > 0 and demo.pitfalls.warm_median_s > 0 and len(demo.frame) == 3
timers = [median_step_s] + ([median_step_s_events] if device.type == "cuda" else [])
ratios = {plain_timer.__name__: [] for plain_timer in timers}
for _ in range(3):  # a few steps with each plain timer, then as many with labkit's, three times over
    for plain_timer in timers:
        plain = plain_timer(step, warmup=1, repeats=3)
        engine = labkit.measure.StepTimer(device)
        for _ in range(3):
            engine.start()
            step()
            engine.stop()
        ratios[plain_timer.__name__].append(plain / statistics.median(engine.times_s()))
assert all(0.5 < statistics.median(r) < 2 for r in ratios.values()), ratios

# %% [markdown]
# ## 2. Memory: allocated vs reserved, and what a step is made of
# PyTorch's CUDA **caching allocator** keeps freed blocks to reuse them. So there are two numbers:
# *allocated* (bytes in live tensors, `torch.cuda.max_memory_allocated`) and *reserved* (what the cache
# holds, `torch.cuda.max_memory_reserved`, roughly what `nvidia-smi` shows minus the CUDA context).
# Reserved memory hides changes: a technique that frees activations may leave reserved memory where it
# was. labkit compares **allocated** peaks, measured after `reset_peak_memory_stats`, and shows reserved
# separately. On a CPU there is no cache: labkit counts every live tensor exactly.
#
# A training step's memory has parts: **parameters**, **gradients** (same size as the trainable
# parameters), **optimizer state** (AdamW keeps two extra numbers per parameter), **activations** saved
# by the forward pass for the backward pass (they grow with the batch size), and **other** (temporary
# buffers of the backward pass). labkit tracks them with PyTorch's `MemTracker` on a separate, untimed
# step. Activations peak at the end of the forward pass, gradients and temporary buffers later.

# %% [markdown]
# **The mechanism.** Peak memory of one step in plain PyTorch. On a GPU: reset the allocator's peak,
# run the step, read `max_memory_allocated` (live tensors) and `memory_reserved` (what the cache holds).
# On a CPU, `MemTracker` counts every live tensor instead.

# %%
from torch.distributed._tools.mem_tracker import MemTracker
if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()  # weights, optimizer state: live before the step
    step()
    peak_bytes = torch.cuda.max_memory_allocated() - before  # what the step added, at its peak
    reserved_bytes = torch.cuda.memory_reserved()  # what the cache holds (nvidia-smi, roughly)
    print(f"the step added {peak_bytes / 2**20:.1f} MiB at its peak, {reserved_bytes / 2**20:.1f} MiB reserved")
else:
    tracker = MemTracker()  # no allocator statistics on a CPU: count every live tensor
    tracker.track_external(trainer.model, trainer.optimizer)
    with tracker:
        step()
    peak_bytes = tracker.get_tracker_snapshot("peak")[device]["Total"]
    print(f"all live tensors at the step's peak: {peak_bytes / 2**20:.1f} MiB (a CPU has no cache to reserve)")

# %% jupyter={"source_hidden": true} tags=["check"]
# the same step measured with labkit.measure: the allocator's peak on a GPU, MemTracker on a CPU
if device.type == "cuda":
    labkit.measure.reset_peak(device)
    base = torch.cuda.memory_allocated()
    step()
    engine_peak = labkit.measure.cuda_peak_memory(device)[0] - base
else:
    engine_peak = labkit.measure.track_step_memory(step, trainer.model, trainer.optimizer, device).total_peak_bytes
assert abs(peak_bytes - engine_peak) <= 0.05 * engine_peak, (peak_bytes, engine_peak)

# %% [markdown]
# **Predict first.** The full fine-tune below tracks one step by category. What fraction of the
# step's peak do the **activations** take, at their own peak (0..1)?

# %%
guess_activation_share = None  # YOUR GUESS: activations / peak memory, e.g. 0.5

# %%
res = labkit.fit(cfg)
print(lab.memory(res))
print(guesses.versus(guess_activation_share, lab.activation_share(res), "activations / peak memory"))
plots.memory_breakdown({"baseline": res});

# %% [markdown]
# How to read it. On a GPU, comparisons use the allocated figure, not the reserved one nvidia-smi shows.
# Because each category peaks at its own moment, the categories' peaks add up to more than the memory held
# at the step's total peak. On a GPU the allocator's peak also lies a little above the tensors labkit
# tracks: cuBLAS/cuDNN workspaces and the allocator's rounding of each block.

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the breakdown has activations, and one gradient per trainable parameter
assert res.peak_memory_bytes > 0 and res.memory["activations"] > 0
# one gradient per trainable parameter ("parameters" also holds the small BatchNorm buffers)
assert 0.9 * res.memory["parameters"] <= res.memory["gradients"] <= res.memory["parameters"]

# %% [markdown]
# ## 3. The baseline fine-tune
# `labkit.fit(cfg)` is the one training loop of the whole lab. It fine-tuned the **pretrained** workload
# printed in section 1: at the `ci` and `quick` profiles a small CNN, `small_cnn`, on `shapes10` (ten shapes,
# 32x32 colour images, generated so that it works offline); at `full` an ImageNet-pretrained ResNet-18 on
# CIFAR-10. ImageNet weights come from torchvision; for `small_cnn`, labkit ships its own small checkpoint,
# pretrained on a *different* task (`shapes_source`: ten other shapes). That is the usual fine-tuning
# situation: the pretraining classes are not the new ones.

# %%
print(lab.headline(res))
print("weights:", res.weights)
plots.loss_curve({"baseline": res});

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the fine-tune learned (finite losses, falling loss, accuracy above chance)
import math

assert all(math.isfinite(v) for v in res.losses)
k = max(1, len(res.losses) // 4)
# a pretrained start lands well above chance; one from random weights (said loudly above) may not in so few steps
assert sum(res.losses[-k:]) / k < sum(res.losses[:k]) / k or res.weights == "random", "the loss should fall"
assert res.accuracy > 0.2 or res.weights == "random", "well above chance (10%)"

# %% [markdown]
# ## 4. Pretrained vs from scratch
# Fine-tuning means starting from weights that already know something. The same run from random
# weights shows what the pretrained start is worth after the same number of steps. Two accuracies on the
# same test set differ by chance too; labkit calls a difference real only above about two standard errors
# of that sampling noise.

# %%
scratch = lab.from_scratch(cfg, pretrained=res)  # the same run from random weights, beside the pretrained one
scratch

# %%
plots.loss_curve(scratch.runs);

# %% [markdown]
# ## 5. Achieved FLOP/s
# labkit counts the floating-point operations of one training step with PyTorch's `FlopCounterMode`
# (on its own untimed step) and divides by the step time. On a GPU with a known datasheet peak it also
# reports the fraction of that peak you reached (model FLOP utilisation, MFU):
#
# $$\text{achieved FLOP/s} = \frac{\text{FLOPs per step}}{\text{step time}}, \qquad
# \text{MFU} = \frac{\text{achieved FLOP/s}}{\text{peak FLOP/s of the device at this precision}}$$
#
# Real training stays below the peak: small kernels cannot fill a GPU, and a step also launches kernels and
# updates weights. The small CNN of `ci` and `quick` leaves any GPU almost idle; the ResNet-18 of `full`
# keeps it busier, still well short of the datasheet figure. That is a finding, not a bug; bigger batches
# and models raise MFU. Mixed precision often *lowers* it, even when the step gets faster: the peak it is
# divided by rises 8x on a T4 (8.1 TFLOP/s fp32 to 65 TFLOP/s fp16, its datasheet), while the step time falls
# far less.
# labkit counts the FLOPs that actually ran, so with checkpointing (notebook 03) the recomputed forward
# is counted too: what the PaLM paper calls hardware FLOP utilisation (HFU) rather than MFU.

# %%
print(f"{res.flops_per_step / 1e9:.2f} GFLOP per step, {res.achieved_flops / 1e9:.1f} GFLOP/s achieved")
print(f"MFU: {res.mfu:.1%}" if res.mfu is not None else "No datasheet peak for this device, so no MFU.")

# %% [markdown]
# How far is that from what the hardware can do? The chart puts your run's achieved FLOP/s next to
# the datasheet peaks of the GPUs this lab is used on (hatched: NVIDIA's published figures, not
# measurements) and, where `labkit bench` has measured this run on a real GPU (committed under
# `src/labkit/assets/reference/` with the GPU, date and versions), those runs too. The axis is
# logarithmic. The gap between your bar and the peaks is the room the later notebooks work in.

# %%
measured = labkit.load_reference("00_start_here-baseline*")  # none until a GPU run is shipped
peaks = lab.flops_against_peaks(res, measured)
peaks

# %%
plots.bar(peaks.live, x="setup", y="achieved_flops", reference=peaks.reference, logy=True);

# %% [markdown]
# ## 6. Your turn: the panel
# Pick a model, a batch size and the amount of training data, then press **Run**. Finished runs are
# cached on disk (`labkit.results.results_dir()` says where), so rerunning the same settings is instant.

# %%
panel = ExperimentPanel(
    run=labkit.results.cached_fit,
    controls={"model": ["small_cnn", "shufflenet_v2_x0_5", "resnet18"],
              "batch_size": (16, 256, 16),
              "train_size": [P.train_size // 4, P.train_size // 2, P.train_size]},
    base=cfg, show=views.run_overview, title="Baseline fine-tune")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | a speed-up vanishes when timed again | first call timed, or no synchronisation on GPU | warm up, synchronise |
# | memory unchanged after a change | reading the cache (nvidia-smi, `memory_reserved`) | `max_memory_allocated` |
# | a float32 baseline suspiciously fast on Ampere+ | TF32 left implicit | set TF32 explicitly (labkit records it) |
# | loss becomes NaN | too high a learning rate, fp16 overflow | lower `lr`, `grad_clip`, bf16 (fp32's range) |
#
# Read `max_memory_allocated` after `reset_peak_memory_stats`. A GradScaler does not prevent a NaN loss: it only
# skips the steps whose gradients overflowed.

# %% [markdown]
# ## Going further
# - `torch.utils.benchmark.Timer` does warm-up, synchronisation and repeats for you
#   (`Timer(stmt="step()", globals={"step": step}).blocked_autorange()`), and reports the spread.
# - On a GPU, `torch.cuda.memory._record_memory_history()` and `torch.cuda.memory._dump_snapshot("mem.pickle")`
#   record every allocation of a step; drag the file onto https://pytorch.org/memory_viz to see which
#   tensor lived when.
# - `torch.profiler.profile(activities=[...CPU, ...CUDA])` splits a step's time by operator and shows
#   the gaps where the GPU waited for Python.

# %% [markdown]
# ## Summary
# - Time with warm-up excluded and the GPU synchronised; report the median and the spread.
# - Compare allocated peaks, not reserved memory; split memory into parameters, gradients, optimizer
#   state and activations to see which part a technique changes.
# - `labkit.fit(cfg)` gives all of it for one config; `labkit.sweep(cfg, batch_size=[...])` for many.

# %% [markdown]
# ## Further reading
# - PyTorch, *CUDA semantics: asynchronous execution* and *memory management*:
#   https://pytorch.org/docs/stable/notes/cuda.html
# - PyTorch, *Understanding CUDA memory usage* (snapshots, the memory viewer):
#   https://pytorch.org/docs/stable/torch_cuda_memory.html
# - PyTorch recipe, *PyTorch Benchmark* (`torch.utils.benchmark`):
#   https://pytorch.org/tutorials/recipes/recipes/benchmark.html
# - Chowdhery et al. 2022, *PaLM*, appendix B, where model FLOP utilisation (MFU) is defined:
#   https://arxiv.org/abs/2204.02311
# - NVIDIA T4 product page, with its datasheet (the 8.1 and 65 TFLOP/s peaks):
#   https://www.nvidia.com/en-us/data-center/tesla-t4/

# %% [markdown]
# ## Exercises
# The first asks for code: a timer that is right on a GPU. Its checker runs your function on a pretend
# GPU whose steps return before their work is done, as CUDA kernels do.

# %%
print(exercises.question("00.timer"))


# %%
def time_steps(step, sync, warmup=3, repeats=10):
    """Return the durations (seconds) of `repeats` timed calls of step(), after `warmup` untimed ones."""
    raise NotImplementedError  # YOUR CODE


exercises.check("00.timer", time_steps)

# %% [markdown]
# The next one uses **your own** timing run from section 1. When you have it, reason about it: how many
# timed steps would it take before that ratio falls below 1.05? What does that say about a benchmark of
# a handful of steps?

# %%
mine = demo.warmup_numbers()  # your first call and warm median, from section 1
print(exercises.question("00.warmup_error", mine))

# %%
answer = None  # YOUR CODE: a ratio, e.g. 1.5
exercises.check("00.warmup_error", answer, mine)

# %%
print(exercises.question("00.throughput"))

# %%
answer = None  # YOUR CODE: samples per second
exercises.check("00.throughput", answer)

# %%
print(exercises.question("00.mfu"))

# %%
answer = None  # YOUR CODE: a fraction between 0 and 1
exercises.check("00.mfu", answer)

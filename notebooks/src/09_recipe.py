# %% [markdown]
# # The recipe: stack the techniques, profile a step, troubleshoot
#
# Notebooks 01-08 each changed one thing. A real fine-tune stacks them, and stacked techniques do not simply
# multiply their savings. This notebook applies a staged recipe that follows notebooks 01-08 (blog posts circulate
# ones that do not: "bigger batch, same learning rate, checkpointing always on") one stage at a time, asks what
# order the measurements suggest, profiles a step, and hands broken configs to `labkit.doctor`.
#
# **You will learn**
# 1. a recipe as a YAML `RunConfig`, applied and measured stage by stage, in the recipe's order and the measured one;
# 2. `torch.profiler` on one training step before and after mixed precision, and a trace to open in Perfetto;
# 3. `labkit.doctor` diagnosing an exploding loss, AMP slower than fp32, accuracy lost to quantization, pruning
#    that frees no memory, and a hanging distributed run;
# 4. what each technique of notebooks 01-08 bought on this machine, and a language model's recipe.
#
# **What you need:** notebooks 01-08 (section 6 reads their cached runs; unrun ones show as "not run yet"). A CPU
# runs every section, but there the mixed-precision stage (sections 2-3) is fp32, its ratios noise, and the
# profiler's bf16 step (section 4) is emulated, slower than fp32; a GPU shows the speed-up.

# %%
import torch
import torch.nn.functional as F
import yaml

import labkit
from labkit import display, guesses, plots, views
from labkit.labs import recipe as lab  # this notebook's experiments and findings
from labkit.labs.recipe import exercises  # this notebook's exercises: question, check, solution
from labkit.runsetup import set_up  # a run's device, splits, seeded model and first batch, as the loop's
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
labkit.env_report()

# %% [markdown]
# ## 1. The recipe as a config
# The recipe, as the YAML file labkit ships: each key is one stage, applied on top of the ones above it. It is a
# `RunConfig`, so `labkit.load_config` checks every field (a misspelt key is an error, not a silently ignored line):

# %%
print(lab.RECIPE_PATH.read_text())
recipe = labkit.load_config(lab.RECIPE_PATH)
print({name: getattr(recipe, name) for name in ("batch_size", "lr", "lr_warmup_steps", "precision", "quantize")})

# %% [markdown]
# Stacking is a loop over the file's keys (labkit's stages keep a larger batch's learning rate and warm-up with
# it). `cfg.replace` validates each step, so a combination that cannot work (say `freeze` with `lora_rank`) fails
# at the stage that introduces it:

# %%
with open(lab.RECIPE_PATH) as f:
    stages = yaml.safe_load(f)  # {field: value}, in the file's order

cfg = lab.workload(P)  # the baseline: the profile's pretrained model, whole epochs
stacked = [cfg]
for name, value in stages.items():
    stacked.append(stacked[-1].replace(**{name: value}))  # one stage on top of the ones before

print(f"baseline: {cfg.model} on {cfg.dataset}, batch {cfg.batch_size}, {cfg.epochs} epochs, {cfg.precision}")
print(f"last stage: batch {stacked[-1].batch_size}, {stacked[-1].optimizer}, freeze {stacked[-1].freeze}, "
      f"quantize {stacked[-1].quantize}")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the plain loop ends at the lab's stacked config; the lab's stages group the keys that belong together
engine = [c for _, c in lab.stacked_configs(cfg, lab.recipe_stages())]
assert engine[-1] == stacked[-1] and all(c in stacked for c in engine) and stacked[-1].quantize == recipe.quantize
assert [k for s in lab.recipe_stages() for k in s.changes] == list(stages)  # the file's keys, in its order

# %% [markdown]
# The last stage, `quantize`, acts on the trained model: `fit` trains as before, then scores a quantized copy
# (`result.inference`); the cache reuses the trained weights.
#
# ## 2. Stage by stage
# Each stage is trained from the same pretrained weights for the same epochs, so a larger batch sees the same
# data in fewer, larger steps. The table gives epoch time, peak memory, and the deployed model's accuracy and
# size. **Predict first:** after all five stages, what are peak memory and epoch time as a share of the
# baseline's?

# %%
guess_peak_ratio = None  # YOUR GUESS: the whole recipe's peak memory / the baseline's, e.g. 0.4
guess_time_ratio = None  # YOUR GUESS: the whole recipe's epoch time / the baseline's, e.g. 0.5

# %%
rec = lab.staged(cfg)  # the given order, each stage alone, and the measured order (all cached)
base, last = rec.given.iloc[0], rec.given.iloc[-1]
print(guesses.versus(guess_peak_ratio, last.peak_memory_bytes / base.peak_memory_bytes, "peak, recipe / baseline"))
whole = rec.whole_time()  # the last stage's epoch time against the baseline's, with both runs' spreads
print(guesses.versus(guess_time_ratio, whole, "epoch time, recipe / baseline"))
rec  # both orders stacked, and what the recipe did

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every stage ran, each one stacked on the one before; quantization shrank the deployed model
assert rec.given.error.isna().all() and rec.measured.error.isna().all() and len(rec.given) == 6
assert rec.given.deployed_size_bytes.iloc[-1] < 0.5 * rec.given.deployed_size_bytes.iloc[-2]
assert rec.given.epoch_time_s.gt(0).all() and rec.given.deployed_accuracy.between(0, 1).all()
assert rec.given.iloc[-1].freeze == "medium" and rec.given.iloc[-1].optimizer == "adamw8bit"

# %%
axes = plots.lines(rec.frame, x="stage", hue="order",
                   ys=["epoch_time_s", "peak_memory_bytes", "accuracy", "model_size_bytes"])

# %% [markdown]
# How to read it (the line under the table names what happened here; a time counts as changed only outside the
# runs' 10th-90th percentile spread, an accuracy only outside the test split's noise):
#
# - **A larger batch** uses more memory (notebook 02). It pays in time where the smaller batch left the device
#   idle; with fewer steps, accuracy falls unless the learning rate grows: the recipe scales it and warms it up.
# - **`precision: auto`** is bf16 on an A100 and on a CPU with native bf16, fp16 on a T4, fp32 on a P100 and
#   on a CPU that would emulate bf16: there this stage changes nothing, by design.
# - **Checkpointing** is not in it: it trades time for activation memory, which pays only when memory is the
#   limit (03); the panel below can add it.
# - **The 8-bit optimizer** shrinks AdamW's states, which follow the trainable parameters: few after freezing.
# - **Freezing** removes gradients, optimizer state and most of the backward pass: often the largest saving.
# - **int8 for inference** changes nothing in training and cuts the file to about a quarter.
#
# ## 3. The order the measurements suggest
# Each stage also ran **alone** on the baseline. Ranking the training stages by what each bought alone
# (peak-memory ratio times epoch-time ratio, smallest first) gives another order; a stage that changes nothing on
# this device (`precision: auto` where it stays fp32) goes after the others, whatever its timing noise, and
# quantization stays last: it acts on the trained model. The chart above shows both orders; each stage alone:

# %%
rec.each_alone  # each stage alone on the baseline, and the order that suggests

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the measured order holds the same stages, training ones first; both orders end at the same config
assert sorted(s.key for s in rec.order) == sorted(s.key for s in rec.stages) and rec.order[-1].key == "quantize"
assert rec.given.iloc[-1][["batch_size", "freeze", "quantize"]].tolist() == \
    rec.measured.iloc[-1][["batch_size", "freeze", "quantize"]].tolist()
assert rec.alone.error.isna().all() and len(rec.alone) == 6

# %% [markdown]
# Both orders end at the same config; the order decides where you can stop: put the stage that buys the most
# first. Interactions are why an "alone" ratio does not predict its stacked one (exercise 2 measures it).
#
# ## 4. Where the time goes: the profiler
# `torch.profiler` records every operator a step runs, with its own ("self") time. The plain version, on
# a step of the same model: warm up, then profile one:

# %%
from torch.profiler import ProfilerActivity, profile
run = set_up(cfg)  # the run's device, seeded model and first batch, as the loop sets them up
device, model, batch = run.device, run.model, run.batch()
x, y = batch.images, batch.labels
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
def step():
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
step(), step()  # warm-up: the first steps allocate memory and pick kernels

# %%
gpu = device.type == "cuda"  # on a GPU, record its kernels too, and sort by the device's time
with lab.quiet_native_output(), profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as prof:
    step(), torch.cuda.synchronize() if gpu else None  # the kernels finish inside the profile
self_us = "self_device_time_total" if gpu else "self_cpu_time_total"
top = sorted(prof.key_averages(), key=lambda e: getattr(e, self_us), reverse=True)[:5]
print(*(f"{e.key[:34]:<34} {getattr(e, self_us) / 1e3:8.2f} ms self, {e.count} calls" for e in top), sep="\n")

# %% [markdown]
# (`lab.quiet_native_output()` hides stderr output from Kineto, the profiler's C++ library, which Jupyter shows
# as a red box.) The engine profiles a step of its own loop the same way, in fp32 and in the mixed
# precision this device would use (bf16 where `auto` keeps fp32), groups the operators by kind, and writes
# Chrome traces. **Predict first:** in fp32, what share of the step's operator time goes to matmuls and
# convolutions?

# %%
guess_conv_share = None  # YOUR GUESS: share of the fp32 step's operator time in matmuls and convolutions, e.g. 0.4

# %%
steps = lab.profile_pair(cfg)  # fp32, then the device's mixed precision
before, after = steps.before, steps.after
share = before.kinds.set_index("kind").share.get("matmul / convolution", 0.0)
print(guesses.versus(guess_conv_share, share, "matmul and convolution share, fp32"))
steps  # self time by kind of work in both steps

# %% jupyter={"source_hidden": true} tags=["check"]
# check: both steps were profiled, the shares add up, the traces are files a browser can open, and matmuls and
# convolutions lead the engine's fp32 profile and are among the plain profile's top five
assert lab.op_kind(before.ops.operator.iloc[0]) == "matmul / convolution"
assert any(lab.op_kind(e.key) == "matmul / convolution" for e in top)
assert before.precision == "fp32" and after.precision == lab.profiler_precision(cfg)
assert abs(before.kinds.share.sum() - 1) < 1e-6 and before.trace_path.stat().st_size > 1000
assert after.trace_path.exists() and len(before.ops) == lab.PROFILE_TOP

# %%
axes = plots.bars(steps.long(), x="kind", ys=["self_ms", "share"], hue="precision")
print("traces:", before.trace_path, after.trace_path, sep="\n")
display.table(after.ops, ["operator", "kind", "calls", "self_ms", "total_ms", "share"])  # mixed precision's top

# %% [markdown]
# Open a trace in https://ui.perfetto.dev or `chrome://tracing`: every operator is a bar on a timeline, nested
# under its caller, forward then backward then the optimizer.
#
# On a tensor-core GPU the matmuls and convolutions get much faster in fp16/bf16 and the step
# becomes bound by everything else (elementwise kernels, normalization, the optimizer, casts): AMP's speed-up
# (2-3x, PyTorch's AMP recipe) is less than the tensor cores' (T4 datasheet: 65 TFLOPS fp16, 8.1 fp32). On a CPU
# without bf16 instructions the convolutions get slower, bf16 being emulated in float32, and the casts'
# share grows (the line under the table says which happened here).
#
# ## 5. The doctor
# `labkit.doctor(cfg)` runs short probes for the troubleshooting table's symptoms. Each finding gives the
# observation, likely cause and a remedy as config changes, and where a run can tell, tries it (`checked`). A
# healthy config first:

# %%
print(labkit.doctor(lab.doctor_config(cfg)))  # one epoch of at most 100 steps

# %% [markdown]
# **Loss becomes NaN (or explodes).** SGD at learning rate 50: each step overshoots, the loss grows by orders of
# magnitude, and in fp16 it overflows to inf and NaN.

# %%
nan = labkit.doctor(lab.broken(cfg, "nan_loss"))["nan_loss"]  # optimizer sgd, lr 50
print(nan)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: found, blamed on the learning rate, and the named remedy no longer explodes
assert nan.problem and "exploding gradients" in nan.cause and nan.fix["lr"] < 50 and nan.checked

# %% [markdown]
# **AMP slower than fp32.** fp16 at batch 8. On a CPU without fp16 instructions autocast emulates it; on a GPU a
# batch this small keeps the tensor cores idle. The doctor times a few steps of each and names the cause
# fitting this device:

# %%
amp = labkit.doctor(lab.broken(cfg, "amp_slower"))["amp_slower"]  # precision fp16, batch 8
print(amp)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the verdict follows the measured times (on any device), and a slow result names a cause
assert amp.status in ("problem", "ok") and amp.problem == (amp.numbers["ratio"] > labkit.troubleshoot.SLOWER)
assert not amp.problem or ("tensor cores" in amp.cause or "batch" in amp.cause or "small" in amp.cause)

# %% [markdown]
# **Accuracy drops a lot after quantization.** Weights rounded to 3 bits (simulated, kept in float32). The doctor
# measures the drop against the test set's noise and, if real, keeps the first and last layers in float,
# one at a time (chosen on the validation split, checked on the test split):

# %%
quant = labkit.doctor(lab.broken(cfg, "quantization_drop"))["quantization_drop"]  # quantize int3_simulated
print(quant)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the drop is real and keeping the named layers in float recovers accuracy, on a model that learned (one
# that started from random weights, said loudly above, may be at chance with no accuracy to lose)
if quant.numbers["float_accuracy"] > 0.3:
    assert quant.problem and quant.numbers["drop"] > quant.numbers["noise"]
    assert quant.numbers["fixed_accuracy"] > quant.numbers["quantized_accuracy"] and quant.fix["quantize_keep_float"]

# %% [markdown]
# **Memory not reduced after pruning.** Half the weights zeroed by magnitude. They are zeros, and still stored:

# %%
prune = labkit.doctor(lab.broken(cfg, "pruning_memory"))["pruning_memory"]  # prune_amount 0.5
print(prune)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: half the weights are zero, the file did not shrink, and structured pruning does shrink it (to a little over
# half: the stem, the BatchNorm layers and the classifier keep their size; ResNet-18: 0.51)
assert prune.problem and abs(prune.numbers["nonzero_share"] - 0.5) < 0.02 and prune.numbers["size_ratio"] > 0.95
assert prune.numbers["fixed_size_ratio"] < 0.6 and prune.fix == {"prune_structured": True}

# %% [markdown]
# **A distributed run that hangs.** Two processes; rank 1 stops taking part after step 2, as if stuck in I/O,
# and rank 0 waits for it in the next all-reduce. With torch's default process-group timeout (30 minutes
# for gloo, 10 for NCCL) that is a long silence; the doctor launches with a short one, so the hang becomes an
# error naming the rank within seconds:

# %%
hang = labkit.doctor(cfg.replace(epochs=1, max_steps=P.max_steps), **lab.HANG)["distributed_hang"]
print(hang)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the hang is found, the silent rank named, within a few timeouts
assert hang.problem and hang.numbers["rank"] == 1 and "stopped taking part" in hang.cause
assert hang.numbers["elapsed_s"] < 20 * hang.numbers["timeout_s"] + 60

# %% [markdown]
# ## 6. Notebooks 01-08 on this machine
# `lab.summary()` reads your cache and pairs each technique's run with the same
# run without it (mixed precision against fp32, freezing against none, ...): time (training time per sample;
# inference latency for pruning and quantization), peak memory and size as ratios, accuracy as a change in
# points. The line under the table names a time saving only
# where the runs' step-time spreads do not overlap. The hatched bars are the published figure (PyTorch's AMP
# recipe: 2-3x on tensor-core GPUs), not a measurement here.

# %%
summary = lab.summary(P)  # one row per technique: its run against the same run without it
measured = summary.frame[summary.frame.pairs > 0]  # the techniques not run yet are named below the table
axes = plots.bars(measured, x="label", ys=["time_ratio", "memory_ratio", "size_ratio", "accuracy_change"],
                  reference=lab.reference_rows())  # the published AMP speed-up, in the time chart
summary

# %% jupyter={"source_hidden": true} tags=["check"]
# check: one row per technique of 01-08; every measured ratio is positive
assert set(summary.frame.notebook) == {"01", "02", "03", "04", "05", "06", "07", "08"}
assert (measured.time_ratio > 0).all() and (measured.size_ratio.dropna() > 0).all()

# %%
display.table(labkit.results.published("01_mixed_precision-speedup*", "09_recipe-*"))  # published, not ours

# %% [markdown]
# These numbers move with the hardware: on a CPU mixed precision often costs time; on tensor-core GPUs PyTorch's
# AMP recipe reports 2-3x. The recipe that fits is the one measured where it will run.
#
# ## 7. A language model's recipe
# The same stacking for the profile's pretrained language model fine-tuned on sorting digits (notebook 08's),
# with the language-model lessons: packed rows (10), `precision: auto` (01), LoRA on every linear layer (08),
# 8-bit AdamW (03). **Predict first:** the whole recipe's peak as a fraction of the baseline's?

# %%
guess_lm_recipe_peak = None  # YOUR GUESS: e.g. 0.5

# %%
print(lab.LM_RECIPE_PATH.read_text())
lm_rec = lab.lm_stages()  # the file's stages stacked in its order (cached)
lm_peak = lm_rec.frame.peak_memory_bytes
print(guesses.versus(guess_lm_recipe_peak, lm_peak.iloc[-1] / lm_peak.iloc[0], "recipe peak / baseline peak"))
lm_rec

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every stage ran, LoRA trains a small share, and the whole recipe lowers the peak
trainable = lm_rec.frame.num_trainable_params
assert lm_rec.frame.error.isna().all() and trainable.iloc[-1] < 0.2 * trainable.iloc[0]
assert lm_peak.iloc[-1] < lm_peak.iloc[0]

# %% [markdown]
# ## 8. Your turn: the panel
# Choose the stages and press **Run**; runs are cached, and the bars compare every setting run this session
# (bs: batch size, ckpt: checkpointing).

# %%
panel = ExperimentPanel(
    run=lab.panel_run, base=lab.panel_config(cfg),
    controls={"batch_size": [64, 128, 256], "precision": ["fp32", "auto", "bf16"], "checkpointing": [False, True],
              "optimizer": ["adamw", "adamw8bit"], "freeze": [None, "light", "medium", "heavy", "head_only"],
              "quantize": [None, "int8_static", "int8_dynamic", "fp16"]},
    show=views.Bars("setting", ("epoch_time_s", "peak_memory_bytes", "accuracy", "model_size_bytes")),
    title="The recipe, your stages")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | loss becomes NaN | exploding gradients, fp16 overflow | lower LR, gradient clipping, bf16, GradScaler |
# | accuracy drops after quantization | sensitive layers quantized | keep LayerNorm/first/last in float |
# | AMP slower than fp32 | no tensor cores (P100, CPU), tiny batches | check capability, larger batch, channels_last |
# | distributed run hangs | a rank died or never joined | process-group timeouts, check backend |
# | memory not reduced after pruning | zeros still stored densely | structured pruning, sparse storage |
# | memory looks unchanged with AMP | reading the cache, not the allocator | `max_memory_allocated`, reset peak stats |
# | stacked recipe slower than one stage alone | a stage that costs time and buys nothing here | drop it |
# | profiler times differ from step time | profiler overhead; "self" excludes callees | compare profiles |

# %% [markdown]
# ## Going further
# - **`torch.compile`** fuses the elementwise kernels that dominate a mixed-precision step on a GPU; profile before
#   and after, and exclude the compilation (the first steps) from the timing.
# - **`schedule=torch.profiler.schedule(wait, warmup, active)`** with `on_trace_ready=tensorboard_trace_handler`
#   profiles a few steps of a long run; `profile_memory=True` adds each operator's allocations.
# - **Memory snapshots**: `torch.cuda.memory._record_memory_history()` and `_dump_snapshot()` give a timeline of
#   every allocation on a GPU (https://pytorch.org/memory_viz).
# - **A recipe for a transformer**: LoRA (notebook 08) instead of freezing, `lora_rank: 8` with
#   `lora_targets: [qkv]` in the YAML; QLoRA's 4-bit base for models that do not fit.
#
# ### The doctor from the command line
# `labkit doctor CONFIG.yaml` runs the same diagnosis on a saved config and exits with 1 on a problem, so a
# script can stop on it.

# %%
path = labkit.save_config(lab.broken(cfg, "pruning_memory"), lab.trace_folder() / "broken_pruning.yaml")
# !{sys.executable} -m labkit.cli doctor {path}


# %% [markdown]
# ## Summary
# - A recipe is a `RunConfig` in YAML, applied a key at a time; `load_config` checks every field.
# - Stacked techniques interact: measure each stage where it stands and keep the ones that buy something here.
# - `torch.profiler`: warm up, profile one step, sort by self time, group by kind; a trace shows the timeline.
# - `labkit.doctor(cfg)` and `labkit doctor CONFIG.yaml`: symptom, likely cause, remedy, and the remedy tried.
# - Your own numbers of notebooks 01-08 beside the published ones: the techniques that pay on this hardware.

# %% [markdown]
# ## Further reading
# - PyTorch, *Profiling your PyTorch module* and the `torch.profiler` docs: https://pytorch.org/tutorials/beginner/profiler.html
# - PyTorch, *Performance tuning guide*: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
# - Hugging Face, *Methods and tools for efficient training on a single GPU*: https://huggingface.co/docs/transformers/perf_train_gpu_one
# - Perfetto trace viewer: https://ui.perfetto.dev
# - PyTorch, *Automatic Mixed Precision* recipe: https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html

# %% [markdown]
# ## Exercises
# The first asks you to code the rule that turned the alone-runs into the measured order; the checker compares
# yours with labkit's on two recipes.

# %%
print(exercises.question("09.measured_order"))


# %%
def measured_order(alone):
    """Return the stage names in the order to stack them (see the question above)."""
    raise NotImplementedError  # YOUR CODE


exercises.check("09.measured_order", measured_order)

# %% [markdown]
# The next one uses **your own** runs: the peak-memory ratio of each training stage alone. After answering, compare
# your product with the stacked ratio printed below it. Which stages interact, and why does the product
# miss?

# %%
mine = rec.own_stack_numbers()
print(exercises.question("09.own_stack", mine))

# %%
answer = None  # YOUR CODE: the product, a ratio to the baseline's peak
exercises.check("09.own_stack", answer, mine)
print(f"stacked, measured: {rec.stacked_memory_ratio():.3f}x the baseline's peak")

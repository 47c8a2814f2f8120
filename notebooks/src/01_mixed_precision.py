# %% [markdown]
# # Mixed precision: fp16 with a GradScaler, bf16, and what they really save
#
# 16-bit floats halve the bytes of every activation and let GPUs use their tensor cores. This notebook writes
# the mixed-precision step in plain PyTorch, checks it against labkit's, then runs one fine-tune in **fp32**,
# **fp32 with TF32**, **fp16 with a GradScaler** and **bf16**.
#
# **You will learn**
# 1. how fp32, fp16 and bf16 differ, and why fp16 needs a *GradScaler* and bf16 does not;
# 2. the mixed-precision step (`autocast`, scale, `unscale_` before clipping, `step`, `update`) and TF32;
# 3. what mixed precision does to step time, peak memory and accuracy on *your* hardware, and why the memory
#    saving can look small;
# 4. which ops autocast keeps in float32, and which precision to choose on a T4, a P100, an A100 or a CPU;
# 5. the same switch on a language model, and the fp16-weights error learners hit on a T4.
#
# **What you need:** notebook 00 (labkit's timing and memory measurement). The speed-ups need a GPU with tensor
# cores (a free T4). On a CPU everything runs, but section 3's speeds depend on its instruction set, and its
# TF32 line shows only noise.

# %%
import labkit
from labkit import equivalence, guesses, plots, views
from labkit.labs import mixed_precision as lab, start_here  # lab: this notebook's experiments and findings
from labkit.labs.mixed_precision import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import precision
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
ENV = labkit.env_report()
LOW = precision.low_precision_for(ENV)  # bf16 where native, fp16 on tensor-core GPUs without it
ENV

# %% [markdown]
# ## 1. Three formats
# A floating-point number spends its bits on an **exponent** (the range) and a **mantissa** (the precision).
# fp16 spends few on the exponent: it is precise near 1 but overflows above 65504, and a number below about
# 6e-8 rounds to 0. bf16 keeps fp32's exponent (the same range) and gives up mantissa bits instead
# (read from `torch.finfo`):

# %%
lab.formats()

# %% [markdown]
# Both of fp16's problems in three lines, with the fix for the first: multiply by $2^{16}$ before the cast,
# divide again in float32. That is all a GradScaler does (section 5 counts it on a real batch).

# %%
import torch

tiny = torch.tensor(1e-8)  # a small gradient, fine in float32
print(f"fp16: {tiny.half().item():g}; scaled by 2**16 first: {(tiny * 2**16).half().float().item() / 2**16:g}")
print(f"fp16 of 70000 (above its largest value, 65504): {torch.tensor(70000.0).half().item()}")

# %% [markdown]
# *Mixed* precision means that under `torch.autocast` matrix multiplies and convolutions run in 16 bits, cheap
# ops after them (ReLU, additions) run on the 16-bit results, and precision-sensitive ops stay float32
# (section 6). Weights, gradients and optimizer state stay float32 (the "master weights"). For fp16, the
# **GradScaler** scales the loss by a large factor $s$ before `backward()` and unscales the gradients before
# the optimizer step:
#
# $$g = \frac{1}{s}\,\nabla_\theta\,(s \cdot L), \qquad s \leftarrow s/2 \text{ after an inf/NaN gradient}.$$

# %% [markdown]
# ## 2. The mixed-precision step
# The whole technique in plain PyTorch. The gradients must be **unscaled before clipping** (clipping the scaled
# ones would clip the true gradients at `max_norm / s`), and `scaler.step` replaces `optimizer.step` (skipping
# it when a gradient overflowed). For bf16, pass `dtype=torch.bfloat16` and a pass-through
# `torch.amp.GradScaler(enabled=False)`.

# %%
import torch.nn.functional as F

def amp_step(model, images, labels, optimizer, scaler, dtype=torch.float16, max_norm=1.0):
    with torch.amp.autocast(images.device.type, dtype=dtype):  # matmuls and convolutions in 16 bits
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()  # backward of loss x s: small gradients survive fp16
    scaler.unscale_(optimizer)  # gradients / s, in place, before clipping them
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # optimizer.step(), skipped if a gradient is inf or NaN
    scaler.update()  # halve s after an overflow, double it after a clean stretch
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()

scaler = torch.amp.GradScaler(ENV["device"])  # once, before the loop: torch.amp.GradScaler("cuda") on a GPU


# %% [markdown]
# In labkit this is one field: `RunConfig(precision="fp16")` turns on autocast and a GradScaler, `"bf16"`
# autocast alone, `"auto"` picks for the hardware. The check below compares the gradients `amp_step` and
# labkit's `Trainer.step` give the optimizer from the same weights and batches.

# %% jupyter={"source_hidden": true} tags=["check"]
# the plain step gives the optimizer the same gradients, weights and scale as labkit's Trainer.step
for name in dict.fromkeys(["fp16", LOW]):
    comparison = equivalence.compare_step(amp_step, labkit.config.baseline(P).replace(precision=name, grad_clip=1.0))
    assert comparison.same(rel_tol=1e-4), (name, comparison)

# %% [markdown]
# **TF32**, the other switch: on Ampere and newer GPUs, float32 matmuls and convolutions may run on tensor
# cores with a 10-bit mantissa. PyTorch's defaults differ (convolutions on, matmuls off), so a default "fp32"
# CNN is partly TF32, shrinking apparent mixed-precision speed-ups. labkit sets and records both flags
# in every run (`RunConfig(tf32=...)`):

# %%
if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch 2.9+: the current API ("tf32" or "ieee")
    torch.backends.cuda.matmul.fp32_precision = "ieee"  # float32 matmuls in full float32 ("tf32": TF32 on Ampere+)
    torch.backends.cudnn.conv.fp32_precision = "ieee"  # cuDNN convolutions: PyTorch's default is TF32
else:  # torch 2.5-2.8: the older switches
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
print(labkit.env.tf32_state())  # labkit.env.set_tf32(False) leaves the same state

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the two switches set by hand are the state labkit.env.set_tf32 leaves
plain = labkit.env.tf32_state()  # after the two assignments above
labkit.env.set_tf32(True)
assert labkit.env.tf32_state() == {"matmul": True, "conv": True}
labkit.env.set_tf32(False)
assert labkit.env.tf32_state() == plain == {"matmul": False, "conv": False}

# %% [markdown]
# ## 3. The comparison
# The baseline fine-tune of notebook 00, four times: fp32, fp32 + TF32, fp16 + GradScaler, bf16.
#
# **Predict first.** Two guesses for `LOW`, the setup this machine would use (printed first): its peak memory
# as a fraction of fp32's, and its speed as a multiple of fp32's.

# %%
print(f"LOW here: {LOW}")
guess_memory_fraction = None  # YOUR GUESS: LOW peak memory / fp32 peak memory, e.g. 0.7
guess_speedup = None  # YOUR GUESS: fp32 step time / LOW step time, e.g. 2

# %%
cfg = labkit.config.baseline(P)
runs = lab.compare(cfg, ENV)  # fp32, fp32 + TF32, fp16 + GradScaler, bf16 (cached: a rerun is instant)
speedup = runs.speedup(LOW)  # its .band: the ratios the two runs' step-time spreads allow
print(guesses.versus(guess_memory_fraction, runs.peak_fraction(LOW), f"{LOW} peak memory / fp32 peak memory"))
print(guesses.versus(guess_speedup, speedup, f"{LOW} speed / fp32 speed", "x"))
runs

# %%
df = runs.frame  # one row per setup, every column
ref = lab.table(labkit.load_reference("01_mixed_precision-compare*"))
plots.bars(df, x="setup", ys=["step_time_s", "peak_memory_bytes", "accuracy"], reference=ref);

# %% jupyter={"source_hidden": true} tags=["check"]
# every setup ran, except possibly bf16 on a GPU without native bf16 (some pre-Ampere GPUs refuse it)
assert (df.error.isna() | ((df.setup == "bf16") & (ENV["bf16"] is False) & (ENV["device"] == "cuda"))).all()
by = df[df.error.isna()].set_index("setup")  # the setups that ran
# weights, gradients and optimizer state are float32 in every setup; only activations change
for part in ("parameters", "gradients", "optimizer_state"):
    assert by[f"mem_{part}_bytes"].nunique() == 1, part
copies = by.loc["fp32", "mem_parameters_bytes"] / 2  # autocast's 16-bit weight copies count with the activations
for low in by.index.intersection(["bf16", "fp16 + GradScaler"]):
    assert by.loc[low, "mem_activations_bytes"] - copies < by.loc["fp32", "mem_activations_bytes"], low

# %% [markdown]
# How to read it. A setup is faster or slower only when its step times' 10-90% spread does not overlap fp32's.
# On tensor-core GPUs the precisions they accelerate usually win (fp16 on a T4; fp16 and bf16 on an A100), by
# more the larger the model and batch. On a P100 (no tensor cores) AMP can be *slower*; bf16 before Ampere is
# emulated or refused. On a CPU, bf16 can beat fp32 with AVX512-BF16 or AMX; fp16 is emulated and many times
# slower. TF32 exists only on Ampere and later. Accuracy should be close in every setup (an emulated run is cut
# short, and its line says so). Hatched bars: runs measured on real GPUs with `labkit bench`.

# %% [markdown]
# Published speed-ups beside yours (hatched, not measured here): the PyTorch AMP recipe expects
# "significant (2-3X) speedup" with tensor cores and "a modest speedup" without
# ([recipe](https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html)); the T4's datasheet peaks,
# 65 TFLOP/s fp16 over 8.1 fp32, bound any model's gain there
# ([datasheet](https://www.nvidia.com/en-us/data-center/tesla-t4/)).

# %%
live, published = runs.speedups(labkit.load_reference("01_mixed_precision-speedup-published*"))
plots.bar(live, x="setup", y="speedup_vs_fp32", reference=published);

# %% [markdown]
# ## 4. Where the memory goes
# A common complaint: "I switched on AMP and memory barely dropped". Parameters, gradients and
# AdamW's two moments stay float32, 16 bytes per parameter in every setup. Only the **activations** saved for
# the backward pass shrink (with the temporary buffers, "other"), and not all of them: ops autocast keeps in
# float32 save float32 tensors. Autocast also caches 16-bit copies of the weights during the step (2 more
# bytes per parameter).

# %%
print(start_here.memory(runs.runs["bf16"]))
plots.memory_breakdown(df, label="setup");

# %% [markdown]
# Two more reasons the saving can hide. On a GPU, **reserved** memory (what `nvidia-smi` shows) stays where an
# earlier, larger peak left it; labkit compares allocated peaks (notebook 00). And activations grow with the
# batch, the fixed part does not, so the saving grows with it. A short run per batch size suffices:

# %%
mem = lab.memory_savings(cfg, LOW)  # fp32 and LOW at the profile's batch sizes, a few steps each
mem

# %%
plots.bars(mem.frame, x="batch_size", hue="precision", ys=["peak_memory_bytes", "mem_activations_bytes"],
           reference=labkit.load_reference("01_mixed_precision-memory*"));

# %% jupyter={"source_hidden": true} tags=["check"]
# check: activations shrink at the largest batch, and the saving grows with the batch (at a small batch autocast's
# 16-bit weight copies can outweigh what the activations save, when the model is large for its inputs)
ok = mem.frame[mem.frame.error.isna()]
act = ok.pivot(index="batch_size", columns="precision", values="mem_activations_bytes")
assert act[LOW].iloc[-1] < act["fp32"].iloc[-1], "activations shrink at the largest batch"
saved = ok.pivot(index="batch_size", columns="precision", values="peak_memory_bytes").pipe(lambda t: t["fp32"] - t[LOW])
assert saved.iloc[-1] > saved.iloc[0], "the saving grows with the batch"

# %% [markdown]
# ## 5. The GradScaler made visible
# Gradients below fp16's 6e-8 are common: a confident model has a small loss, and a loss averaged over $N$
# samples divides the gradient reaching each sample's *activations* by $N$ (the weight gradient sums them
# again). One batch goes through `backward()` three ways; labkit counts gradient elements non-zero in float32
# but exactly **zero** in fp16. A `loss_multiplier` of 0.001 stands for a small loss.

# %%
under = lab.gradient_underflow(cfg, loss_multipliers=(1.0, 1e-3))
under

# %% jupyter={"source_hidden": true} tags=["check"]
# check: without scaling fp16 zeroes gradients that loss scaling keeps
small = under.frame[under.frame.loss_multiplier == 1e-3].set_index("run")
assert small.loc["fp16, no scaling", "zeroed_gradients"] > small.iloc[2]["zeroed_gradients"]
assert small.loc["fp32", "zeroed_gradients"] == 0

# %% [markdown]
# The scale adapts: whenever a scaled gradient overflows (inf or NaN), the GradScaler **skips**
# that optimizer step and halves the scale; after `growth_interval` clean steps in a row it doubles it. Here it
# starts at $2^{20}$ and may grow every 4 steps, to show both moves in a short run (PyTorch's defaults are
# $2^{16}$ and 2000):

# %%
trace = lab.scaler_trace(cfg, steps=P.max_steps // 2, init_scale=2.0**20, growth_interval=4)
plots.loss_scale(trace.frame)
print(trace.finding())

# %% [markdown]
# The scale first falls to a level the gradients tolerate. With a growth interval of 4 it keeps probing upward
# and skips a step whenever a probe overflows: hence PyTorch's default of 2000. A run that skips many steps
# trains less than its step count says. bf16 has fp32's range: no scaler.

# %% [markdown]
# ## 6. What autocast keeps in float32
# Autocast keeps three lists: ops it always runs in low precision (matrix multiplies, convolutions), ops it
# always runs in float32 because rounding hurts them (losses; on CUDA also softmax, layer norm, exp, sums), and
# the rest, which follow their inputs. The lists differ by device and PyTorch version, so labkit asks the
# installed PyTorch:

# %%
lab.autocast_dtypes(ENV["device"], LOW)


# %% [markdown]
# To force a region to float32, nest `torch.autocast(device_type, enabled=False)` **and** cast its inputs with
# `.float()` (with autocast off, ops run in their inputs' dtype). `torch.amp.custom_fwd(device_type=...,
# cast_inputs=torch.float32)` does the same for a custom `autograd.Function`; `precision.run_in_fp32(fn, *inputs)`
# is one, which recomputes `fn` in the backward pass to save memory. Both agree:

# %%
def logsumexp(t):  # a numerically sensitive piece
    return t.exp().sum(dim=-1).log()


x = (torch.randn(4, 64, device=ENV["device"]) / 8).requires_grad_()
with torch.autocast(ENV["device"], dtype=precision.DTYPES[LOW]):
    inside = x @ x.T  # a matmul: low precision
    with torch.autocast(ENV["device"], enabled=False):  # this region in float32
        forced = logsumexp(inside.float())
    via_labkit = precision.run_in_fp32(logsumexp, inside)
print(f"matmul under autocast: {inside.dtype}; autocast off + .float(): {forced.dtype}; "
      f"run_in_fp32: {via_labkit.dtype}")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: nested autocast + .float() and run_in_fp32 give the same values and gradients
assert forced.dtype == via_labkit.dtype == torch.float32 and torch.allclose(forced, via_labkit)
(grad_forced,) = torch.autograd.grad(forced.sum(), x, retain_graph=True)
(grad_labkit,) = torch.autograd.grad(via_labkit.sum(), x)
assert torch.allclose(grad_forced, grad_labkit, rtol=1e-3, atol=1e-6)

# %% [markdown]
# ## 7. Which precision here?
# The advice below uses this machine's capabilities and, on a CPU, section 3's measurements.

# %%
print(runs.advice())

# %% [markdown]
# | hardware | tensor cores | native bf16 | usual choice |
# | --- | --- | --- | --- |
# | P100 (6.0) | no | no | fp16 saves memory; measure its speed |
# | T4 (7.5), V100 (7.0) | fp16 | emulated | fp16 + GradScaler |
# | A100, L4, H100 (8.0+) | fp16, bf16, TF32 | yes | bf16 (no scaler) |
# | CPU | no | with AVX512-BF16 / AMX | bf16 if measured faster, else fp32 |
#
# A P100 runs fp16 at twice its fp32 rate on paper, but autocast's casts and small kernels often eat that. On
# a CPU, low precision is faster only with those instructions; memory shrinks either way.

# %% [markdown]
# ## 8. A language model
# The same switch on the profile's Llama (`tiny_llama` at `ci`, a 10M one at `quick`, SmolLM2-135M's shape at
# `full`) on packed real text, counted in tokens/s. **Predict first:** LOW's tokens/s as a multiple of fp32's?

# %%
guess_lm_speedup = None  # YOUR GUESS: e.g. 1.5

# %%
lm = lab.lm_compare(LOW)  # fp32 and LOW on the language model (cached)
lm_speedup = lm.speedup(LOW)
print(guesses.versus(guess_lm_speedup, lm_speedup, f"{LOW} tokens/s / fp32 tokens/s", "x"))
lm

# %% jupyter={"source_hidden": true} tags=["check"]
# check: both ran (bf16 may be refused on a GPU without it); where both ran, the activations shrank
arms = lm.frame
assert arms.error.isna().all() or (LOW == "bf16" and ENV["device"] == "cuda")
if arms.error.isna().all():
    assert arms.mem_activations_bytes.iloc[1] < arms.mem_activations_bytes.iloc[0]

# %% [markdown]
# The pitfall on a T4: a model loaded in fp16 (`torch_dtype=torch.float16`) and trained under fp16 autocast with a
# GradScaler stops at its first step. Here on this device, with `labkit.troubleshoot.explain` naming the cause:

# %%
pitfall = lab.fp16_weights_pitfall(device=ENV["device"])
print(labkit.troubleshoot.explain(pitfall["error"]))
print(f"The same step with float32 trainable weights trains: loss {pitfall['fixed_loss']:.3f}.")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: fp16 weights are refused by the scaler, the doctor names it, float32 weights train
assert "unscale FP16 gradients" in pitfall["error"] and labkit.troubleshoot.explain(pitfall["error"]).problem
assert pitfall["fixed_loss"] == pitfall["fixed_loss"] > 0

# %% [markdown]
# ## 9. Your turn: the panel
# Choose a precision, a batch size and a model, and press **Run**. Each run is added to the charts: compare,
# say, fp32 and bf16 at batch 256 on `resnet18`. Finished runs are cached.

# %%
panel = ExperimentPanel(
    run=labkit.results.cached_fit,
    controls={"precision": list(labkit.choices.PRECISIONS), "batch_size": (16, 256, 16),
              "model": ["small_cnn", "shufflenet_v2_x0_5", "resnet18"]},
    base=cfg, show=views.History(("step_time_s", "peak_memory_bytes")), title="Mixed precision")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | AMP slower than fp32 | no tensor cores (P100, most CPUs), tiny batch | check capability; larger batch |
# | memory looks unchanged with AMP | reading nvidia-smi; the fixed part dominates | allocated peak; larger batch |
# | loss becomes NaN in fp16 | a forward value overflowed 65504 | bf16, or that op in float32 (section 6) |
# | fp16 training stalls, gradients zero | underflow below 6e-8 without loss scaling | GradScaler |
# | "fp32" suspiciously fast on Ampere+ | TF32 on | set `RunConfig(tf32=...)` explicitly |
# | bf16 very slow on a T4 | emulated (capability < 8.0) | fp16 + GradScaler |
# | "Attempting to unscale FP16 gradients" | weights loaded in fp16 | float32 trainable weights |
#
# A GradScaler does not prevent a NaN loss: it only skips steps whose *gradients* overflowed.

# %% [markdown]
# ## Going further
# **channels_last.** Tensor-core convolutions want channels last in memory (NHWC);
# PyTorch's default is NCHW, so cuDNN may transpose around every convolution. `RunConfig(channels_last=True)`
# stores the model and inputs that way; with AMP on a GPU it often helps, on a CPU it depends. Measured here:

# %%
layouts = lab.layouts(cfg, LOW)  # fp32 and LOW, each in both memory layouts
layouts

# %%
plots.bar(layouts.frame, x="precision", y="step_time_s", hue="channels_last",
          reference=labkit.load_reference("01_mixed_precision-layouts*"));

# %% [markdown]
# - `torch.compile(model)` fuses autocast's casts with the ops around them.
# - fp8 training (L4, H100 and newer) uses per-tensor scales: Transformer Engine, torchao's `float8`.
# - `torch.set_float32_matmul_precision("high")` allows TF32 for matmuls only.

# %% [markdown]
# ## Summary
# - Mixed precision runs matmuls and convolutions in 16 bits; weights, gradients and optimizer state stay
#   float32, so the saving is in the activations and grows with the batch.
# - The step: autocast around forward and loss, `scaler.scale(loss).backward()`, `unscale_` before clipping,
#   `scaler.step`, `scaler.update`; bf16 uses the same code with a disabled scaler.
# - fp16 needs a GradScaler; bf16 has fp32's range and needs none.
# - Whether it is faster depends on the hardware: measure against a true fp32 baseline with TF32 stated.

# %% [markdown]
# ## Further reading
# - Micikevicius et al. 2018, *Mixed Precision Training* (loss scaling, fp32 master weights):
#   https://arxiv.org/abs/1710.03740
# - Kalamkar et al. 2019, *A Study of BFLOAT16 for Deep Learning Training*: https://arxiv.org/abs/1905.12322
# - PyTorch, *Automatic Mixed Precision* (autocast op lists): https://pytorch.org/docs/stable/amp.html
# - PyTorch recipe, *Automatic Mixed Precision*: https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html
# - PyTorch, *TensorFloat-32 on Ampere and later devices*:
#   https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices
# - NVIDIA, *Train With Mixed Precision*: https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/

# %% [markdown]
# ## Exercises
# The first asks for code: the mixed-precision step, from memory. The checker runs it in fp16
# and bf16 against `Trainer.step` and names what differs.

# %%
print(exercises.question("01.amp_step"))


# %%
def my_amp_step(model, images, labels, optimizer, scaler, dtype, max_norm=1.0):
    """One mixed-precision training step; returns the loss."""
    raise NotImplementedError  # YOUR CODE


exercises.check("01.amp_step", my_amp_step)

# %% [markdown]
# The next one uses **your own** comparison from section 3; the line under the check gives the measured saving.
# Which categories of section 4's breakdown explain the difference, and would it grow at a larger batch?

# %%
mine = runs.own_saving_numbers(LOW)  # your fp32 and LOW runs, from section 3
print(exercises.question("01.own_saving", mine))

# %%
answer = None  # YOUR CODE: a fraction between 0 and 1
exercises.check("01.own_saving", answer, mine)
print(runs.own_saving(LOW))

# %%
print(exercises.question("01.amp_saving"))

# %%
answer = None  # YOUR CODE: a fraction between 0 and 1
exercises.check("01.amp_saving", answer)

# %%
print(exercises.question("01.loss_scale"))

# %%
answer = None  # YOUR CODE: the exponent k
exercises.check("01.loss_scale", answer)

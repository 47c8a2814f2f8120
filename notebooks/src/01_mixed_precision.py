# %% [markdown]
# # Mixed precision: fp16 with a GradScaler, bf16, and what they really save
#
# Training in 16-bit floats instead of 32-bit ones halves the bytes of every activation and lets GPUs
# use their tensor cores. This notebook writes the mixed-precision training step in plain PyTorch, checks
# it against labkit's, then runs the same fine-tune in **fp32**, **fp32 with TF32**, **fp16 with a
# GradScaler** and **bf16**, and measures what each one changes.
#
# **You will learn**
# 1. how fp32, fp16 and bf16 differ (range vs precision), and why fp16 needs a *GradScaler* and bf16 does not;
# 2. the mixed-precision step itself: `autocast`, `scaler.scale(loss).backward()`, `unscale_` before
#    clipping, `step`, `update`; and the TF32 switches;
# 3. what mixed precision does to step time, peak memory and accuracy on *your* hardware;
# 4. why the memory saving can look small: which parts stay in fp32, and how the saving grows with the batch;
# 5. which operations autocast keeps in float32, and how to force a region of your own to float32;
# 6. when channels_last helps, and which precision to choose on a T4, a P100, an A100 or a CPU.
#
# **What you need:** notebook 00 (how labkit times and measures memory). A GPU with tensor cores (a
# free T4) is where the speed-ups appear. On a CPU everything runs, but the speed comparison measures
# this CPU's instruction set: without AVX512-FP16 or AMX-FP16, fp16 is emulated and much slower than fp32,
# so the published speed-ups of section 3 stand in for a GPU's.

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
# A floating-point number spends its bits on an **exponent** (the range) and a **mantissa** (the
# precision). fp16 spends few on the exponent: it is precise near 1 but overflows above 65504, and a
# number smaller than about 6e-8 (its smallest value) is rounded to 0 or to that value, losing all its
# digits. bf16 keeps fp32's exponent (the same range) and gives up mantissa bits instead. The table is read from `torch.finfo`:

# %%
lab.formats()

# %% [markdown]
# Three lines show both of fp16's problems, and the fix for the first one: a gradient of 1e-8 is fine in
# float32, becomes 0 in fp16, and survives when it is multiplied by $2^{16}$ first and divided again in
# float32. That multiply-then-divide is all a GradScaler does (section 5 counts it on a real batch).

# %%
import torch

tiny = torch.tensor(1e-8)  # a small gradient, fine in float32
print(f"fp16: {tiny.half().item():g}; scaled by 2**16 first: {(tiny * 2**16).half().float().item() / 2**16:g}")
print(f"fp16 of 70000 (above its largest value, 65504): {torch.tensor(70000.0).half().item()}")

# %% [markdown]
# *Mixed* precision means that, under `torch.autocast`, matrix multiplies and convolutions are cast to
# 16 bits, the cheap ops after them (ReLU, additions) simply run on the 16-bit results, and
# precision-sensitive ops are kept in float32 (section 6). The weights, their gradients and the optimizer
# keep float32 (the "master weights"). fp16's narrow range adds one more piece, the **GradScaler**: it multiplies the loss by a
# large factor $s$ before `backward()`, so that small gradients do not round to zero in fp16, and divides
# the gradients by $s$ before the optimizer step:
#
# $$g = \frac{1}{s}\,\nabla_\theta\,(s \cdot L), \qquad s \leftarrow s/2 \text{ on an inf/NaN gradient (the step is skipped)}.$$

# %% [markdown]
# ## 2. The mixed-precision step
# Here is the whole technique, as plain PyTorch you can paste into your own loop. The order matters:
# the gradients must be **unscaled before clipping** (clipping the scaled ones would in effect clip
# the true gradients at `max_norm / s`, far too tight), and `scaler.step` must replace `optimizer.step` (it skips the step when a
# gradient overflowed). For bf16, pass `dtype=torch.bfloat16` and a disabled scaler
# (`GradScaler(enabled=False)` passes every call straight through), so one function serves both.

# %%
import torch.nn.functional as F


def amp_step(model, images, labels, optimizer, scaler, dtype=torch.float16, max_norm=1.0):
    with torch.autocast(images.device.type, dtype=dtype):  # matmuls and convolutions in 16 bits
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()  # backward of loss x s: small gradients survive fp16
    scaler.unscale_(optimizer)  # gradients / s, in place, before clipping them
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # optimizer.step(), skipped if a gradient is inf or NaN
    scaler.update()  # halve s after an overflow, double it after a clean stretch
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


# %% [markdown]
# In labkit all of this is one field: `RunConfig(precision="fp16")` turns on autocast and a GradScaler,
# `precision="bf16"` autocast alone, `precision="auto"` picks for the hardware. The check below runs
# `amp_step` and labkit's `Trainer.step` side by side from the same weights on the same batches and
# compares the gradients the optimizer receives (`labkit.equivalence.compare_step`).

# %% jupyter={"source_hidden": true} tags=["check"]
# the plain step gives the optimizer the same gradients, weights and scale as labkit's Trainer.step
for name in dict.fromkeys(["fp16", LOW]):
    comparison = equivalence.compare_step(amp_step, labkit.config.baseline(P).replace(precision=name, grad_clip=1.0))
    assert comparison.same(rel_tol=1e-4), (name, comparison)

# %% [markdown]
# **TF32**, the other switch of this notebook. On Ampere and newer GPUs, float32 matrix multiplies and
# convolutions may run on tensor cores with a 10-bit mantissa. Two flags decide it; labkit sets both
# before every run (`RunConfig(tf32=...)`) and records them, because PyTorch's defaults differ
# (convolutions on, matmuls off):

# %%
torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls: full float32 (True: TF32 on Ampere+)
torch.backends.cudnn.allow_tf32 = False  # cuDNN convolutions: PyTorch's default is True
print(labkit.env.tf32_state())  # labkit.env.set_tf32(False) sets exactly these two

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the two flags set by hand are the state labkit.env.set_tf32 leaves
plain = labkit.env.tf32_state()  # after the two assignments above
labkit.env.set_tf32(True)
assert labkit.env.tf32_state() == {"matmul": True, "conv": True}
labkit.env.set_tf32(False)
assert labkit.env.tf32_state() == plain == {"matmul": False, "conv": False}

# %% [markdown]
# ## 3. The comparison
# The baseline fine-tune of notebook 00, four times. TF32 is its own line: on Ampere and newer GPUs,
# TF32 makes float32 matrix multiplies run on tensor cores with a 10-bit mantissa. A "float32" baseline
# that silently used TF32 is a classic error: it makes every mixed-precision speed-up look smaller.
# PyTorch's defaults already let cuDNN *convolutions* use TF32 on those GPUs, so a default "fp32" CNN is
# partly TF32; labkit sets TF32 explicitly in each run (off for its fp32 line) and records it.

# %% [markdown]
# **Predict first.** Write down two guesses for the setup this machine would use, `LOW` (printed by the
# next cell's first line): its peak memory as a fraction of fp32's, and its speed as a multiple of fp32's.

# %%
print(f"LOW here: {LOW}")
guess_memory_fraction = None  # YOUR GUESS: LOW peak memory / fp32 peak memory, e.g. 0.7
guess_speedup = None  # YOUR GUESS: fp32 step time / LOW step time, e.g. 2

# %%
cfg = labkit.config.baseline(P)
runs = lab.compare(cfg)  # fp32, fp32 + TF32, fp16 + GradScaler, bf16 (cached: a rerun is instant)
df = lab.table(runs)
ref = lab.table(labkit.load_reference("01_mixed_precision-compare*"))
print(lab.summary(df, ENV))
print(lab.tf32_finding(df, ENV))
print(guesses.versus(guess_memory_fraction, lab.peak_fraction(df, LOW), f"{LOW} peak memory / fp32 peak memory"))
print(guesses.versus(guess_speedup, lab.speedup(df, LOW), f"{LOW} speed / fp32 speed", "x"))
plots.bars(df, x="setup", ys=["step_time_s", "peak_memory_bytes", "accuracy"], reference=ref);

# %%
df[["setup", "step_time_s", "throughput", "peak_memory_bytes", "reserved_memory_bytes", "accuracy", "mfu"]]

# %% jupyter={"source_hidden": true} tags=["check"]
# every setup ran, except possibly bf16 on a GPU without native bf16 (some pre-Ampere GPUs refuse it)
assert (df.error.isna() | ((df.setup == "bf16") & (ENV["bf16"] is False) & (ENV["device"] == "cuda"))).all()
by = df[df.error.isna()].set_index("setup")  # the setups that ran
# weights, gradients and optimizer state are float32 in every setup; only activations change
for part in ("parameters", "gradients", "optimizer_state"):
    assert by[f"mem_{part}_bytes"].nunique() == 1, part
for low in by.index.intersection(["bf16", "fp16 + GradScaler"]):
    assert by.loc[low, "mem_activations_bytes"] < by.loc["fp32", "mem_activations_bytes"], low

# %% [markdown]
# How to read it. The sentences above are computed from this run. On a GPU with tensor cores, the
# precisions they accelerate are usually faster than fp32 (fp16 on a T4 or V100; fp16 and bf16 on an
# A100, L4 or H100), by more the larger the model and the batch; with a model as small as this one,
# part of each step is fixed overhead that precision cannot speed up. On a P100 (no tensor cores) AMP
# can be *slower*, and bf16 on a GPU before Ampere is emulated (slow) or, for some operations,
# unsupported: the table then shows that run's error instead of a number. On a CPU the answer depends on the instruction set
# (section 8 says what this one has): with AVX512-BF16 or AMX, bf16 can beat fp32; without fp16
# arithmetic, fp16 is converted around float32 arithmetic and can be many times slower. labkit warns
# when that happens instead of quietly running fp32. The hatched bars, when present, are reference
# runs measured on real GPUs with `labkit bench`; none has been committed yet.
#
# Accuracy after the same steps should be close in every setup: mixed precision changes the rounding,
# not the training. (A run in an emulated precision is cut short, and the summary says after how many
# steps its accuracy was measured.)

# %% [markdown]
# Published speed-ups, for comparison with yours (hatched, never measured by this lab): the PyTorch
# AMP recipe expects "significant (2-3X) speedup" on tensor-core GPUs (Volta, Turing, Ampere) and "a
# modest speedup" before them ([recipe](https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html));
# the T4's datasheet peaks, 65 TFLOP/s fp16 on tensor cores over 8.1 TFLOP/s fp32, bound what any model
# could gain there ([datasheet](https://www.nvidia.com/en-us/data-center/tesla-t4/)). A small CNN stays
# well below both: part of its step is fixed overhead that precision does not speed up.

# %%
live, published = lab.speedups(df, labkit.load_reference("01_mixed_precision-speedup-published*"))
plots.bar(live, x="setup", y="speedup_vs_fp32", reference=published);

# %% [markdown]
# ## 4. Where the memory goes
# A common puzzle: "I switched on AMP and memory barely dropped." The breakdown shows why. Parameters,
# gradients and AdamW's two moments stay float32: 16 bytes per parameter, whatever the precision. Only
# the **activations** saved for the backward pass shrink (with the backward pass's temporary buffers,
# "other"), and not all of them: ops that autocast runs in float32 (section 6) save float32 tensors. Autocast
# also keeps 16-bit copies of the weights during the step, its cast cache (2 more bytes per parameter).

# %%
print(start_here.memory(runs["bf16"]))
plots.memory_breakdown(df, label="setup");

# %% [markdown]
# Two more reasons the saving can hide. First, on a GPU, **reserved** memory (what `nvidia-smi`
# shows) stays where an earlier, larger peak left it: the caching allocator keeps freed blocks. Compare
# `max_memory_allocated` after `reset_peak_memory_stats`, as labkit does. Second, activations grow with
# the batch and the fixed part does not, so the saving grows with the batch size. A short run per
# batch size is enough to measure memory:

# %%
memory_cfg = cfg.replace(max_steps=P.warmup_steps + 4, evaluate=False)
mem = labkit.sweep(memory_cfg, precision=["fp32", LOW], batch_size=list(P.batch_sizes))
print(lab.memory_savings(mem, LOW))
ref_mem = labkit.load_reference("01_mixed_precision-memory*")
plots.bars(mem, x="batch_size", hue="precision", ys=["peak_memory_bytes", "mem_activations_bytes"],
           reference=ref_mem);

# %% jupyter={"source_hidden": true} tags=["check"]
# check: activations shrink at every batch size, and the saving grows with the batch
ok = mem[mem.error.isna()]
act = ok.pivot(index="batch_size", columns="precision", values="mem_activations_bytes")
assert (act[LOW] < act["fp32"]).all(), "activations shrink at every batch size"
saved = ok.pivot(index="batch_size", columns="precision", values="peak_memory_bytes").pipe(lambda t: t["fp32"] - t[LOW])
assert saved.iloc[-1] > saved.iloc[0], "the saving grows with the batch"

# %% [markdown]
# ## 5. The GradScaler made visible
# fp16 cannot hold numbers below about 6e-8. Gradients that small are common: a confident model has a
# small loss and small gradients. Averaging the loss over $N$ samples (or tokens) also divides the gradient
# that reaches each sample's *activations* by $N$: in fp16 those per-sample activation gradients are the
# ones that underflow. The weight gradient sums them over the batch, so averaging does not shrink it.
# Below, one batch goes through `backward()` three ways, and labkit counts the gradient elements that
# are non-zero in float32 but came out exactly **zero** in fp16. The rows with `loss_multiplier` 0.001
# multiply the loss by 1e-3 to stand for such a small loss.

# %%
under = lab.gradient_underflow(cfg, loss_multipliers=(1.0, 1e-3))
under[["loss_multiplier", "run", "zeroed_gradients", "zeroed_fraction", "max_rel_error"]]

# %% jupyter={"source_hidden": true} tags=["check"]
# check: without scaling fp16 zeroes gradients that loss scaling keeps
small = under[under.loss_multiplier == 1e-3].set_index("run")
assert small.loc["fp16, no scaling", "zeroed_gradients"] > small.iloc[2]["zeroed_gradients"]
assert small.loc["fp32", "zeroed_gradients"] == 0

# %% [markdown]
# The scale itself is chosen on the fly. The GradScaler starts high, and whenever a scaled gradient
# overflows (inf or NaN) it **skips** that optimizer step and halves the scale; after
# `growth_interval` clean steps in a row it doubles it again. Here it starts at $2^{20}$ and may grow
# every 4 steps, to make both moves visible in a short run (PyTorch's defaults are $2^{16}$ and 2000):

# %%
trace = lab.scaler_trace(cfg, steps=P.max_steps, init_scale=2.0**20, growth_interval=4)
print(lab.scaler_finding(trace))
plots.loss_scale(trace);

# %% [markdown]
# The scale first falls to a level the gradients tolerate, skipping a step each time it halves. With a
# growth interval of 4 it then keeps probing upward and pays a skipped step whenever a probe overflows:
# that is why PyTorch's default interval is 2000. A few skipped steps are harmless, but a run that skips
# many trains less than its step count says (the printed count is this run's). bf16 has fp32's range:
# no underflow of this kind, no scaler, no skipped steps.

# %% [markdown]
# ## 6. What autocast keeps in float32
# Autocast does not run everything in 16 bits. It keeps three lists: ops it always runs in the low
# precision (matrix multiplies, convolutions), ops it always runs in float32 because they are
# sensitive to rounding (losses; on CUDA also softmax, layer norm, exp, sums), and the rest, which
# follow their inputs. The lists differ between CPU and CUDA and between PyTorch versions, so labkit
# asks the installed PyTorch instead of quoting a table:

# %%
lab.autocast_dtypes(ENV["device"], LOW)


# %% [markdown]
# To force a region of your own model to float32 inside an autocast region, turn autocast off there with
# a nested `torch.autocast(device_type, enabled=False)` **and** cast its inputs with `.float()`: with
# autocast off, ops run in their inputs' dtype, so a 16-bit input would stay 16-bit. The decorator
# `torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` does the same, but only for the
# `forward` of a custom `torch.autograd.Function` (old tutorials use the deprecated
# `torch.cuda.amp.custom_fwd`). `labkit.techniques.precision.run_in_fp32(fn, *inputs)` is such a
# Function: it keeps only the inputs and recomputes `fn` in the backward pass, trading time for memory.
# Both give the same values and gradients:

# %%
def logsumexp(t):  # a numerically sensitive piece
    return t.exp().sum(dim=-1).log()


x = (torch.randn(4, 64, device=ENV["device"]) / 8).requires_grad_()
with torch.autocast(ENV["device"], dtype=precision.DTYPES[LOW]):
    inside = x @ x.T  # a matmul: low precision
    with torch.autocast(ENV["device"], enabled=False):  # this region in float32
        forced = logsumexp(inside.float())
    via_labkit = precision.run_in_fp32(logsumexp, inside)
print(f"matmul under autocast: {inside.dtype}; autocast off + .float(): {forced.dtype}; run_in_fp32: {via_labkit.dtype}")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: nested autocast + .float() and run_in_fp32 give the same values and gradients
assert forced.dtype == via_labkit.dtype == torch.float32 and torch.allclose(forced, via_labkit)
(grad_forced,) = torch.autograd.grad(forced.sum(), x, retain_graph=True)
(grad_labkit,) = torch.autograd.grad(via_labkit.sum(), x)
assert torch.allclose(grad_forced, grad_labkit, rtol=1e-3, atol=1e-6)

# %% [markdown]
# ## 7. channels_last
# Convolutions on tensor cores want the channels as the fastest-moving dimension (NHWC). PyTorch's
# default layout is NCHW, so cuDNN may transpose around every convolution. `RunConfig(channels_last=True)`
# stores the model and inputs in channels_last; on a GPU with AMP this often helps convolutional nets,
# and in fp32 it matters less. On a CPU the effect depends on the oneDNN kernels. Measured here:

# %%
layouts = labkit.sweep(cfg, precision=["fp32", LOW], channels_last=[False, True])
print(lab.channels_last_finding(layouts))
plots.bar(layouts, x="precision", y="step_time_s", hue="channels_last",
          reference=labkit.load_reference("01_mixed_precision-layouts*"));

# %% [markdown]
# ## 8. Which precision here?
# The advice below is computed from this machine's capabilities and from what the comparison in
# section 3 measured.

# %%
print(lab.advice(ENV, df))

# %% [markdown]
# | hardware | tensor cores | native bf16 | usual choice |
# | --- | --- | --- | --- |
# | P100 (6.0) | no | no | fp16 saves memory; its double-rate fp16 arithmetic may or may not beat fp32: measure |
# | T4 (7.5), V100 (7.0) | fp16 | no (emulated) | fp16 + GradScaler |
# | A100, L4, H100 (8.0+) | fp16, bf16, TF32 | yes | bf16 (no scaler) |
# | CPU | no | with AVX512-BF16 / AMX | measure: bf16 with those instructions, else fp32 |

# %% [markdown]
# ## 9. Your turn: the panel
# Choose a precision, a batch size and a model, and press **Run**. Each run is added to the charts, so
# you can compare, say, fp32 and bf16 at batch 256 on `resnet18`. Finished runs are cached.

# %%
panel = ExperimentPanel(
    run=labkit.results.cached_fit,
    controls={"precision": ["fp32", "fp16", "bf16", "auto"], "batch_size": (16, 256, 16),
              "model": ["small_cnn", "shufflenet_v2_x0_5", "resnet18"]},
    base=cfg, show=views.History(("step_time_s", "peak_memory_bytes")), title="Mixed precision")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | AMP slower than fp32 | no tensor cores (P100, most CPUs), tiny batches, fp16 emulated on CPU | check the capability (section 8), larger batch, channels_last |
# | memory looks unchanged with AMP | reading reserved memory / nvidia-smi; fixed part dominates | `max_memory_allocated` after `reset_peak_memory_stats`; larger batch |
# | loss becomes NaN in fp16 | a forward value above 65504 overflowed | bf16 (fp32's range), or that op in float32 (section 6); a GradScaler only skips steps whose *gradients* overflowed |
# | fp16 training stalls, gradients zero | underflow below 6e-8 without loss scaling | GradScaler |
# | a "fp32" baseline that is suspiciously fast on Ampere+ | TF32 on | set TF32 explicitly (`RunConfig(tf32=...)`) |
# | bf16 very slow on a T4 | no native bf16 (capability < 8.0): emulated | fp16 + GradScaler |

# %% [markdown]
# ## Going further
# - `torch.compile(model)` fuses the casts autocast inserts with the ops around them; under mixed
#   precision that often removes much of the fixed overhead a small model pays.
# - fp8 training (Ada and Hopper GPUs: L4, H100, and newer) goes one step further, with per-tensor scales instead of one loss
#   scale: NVIDIA's Transformer Engine and torchao's `float8` training.
# - `torch.set_float32_matmul_precision("high")` is another way to allow TF32 for matmuls (not for
#   convolutions); labkit sets both flags explicitly instead.

# %% [markdown]
# ## Summary
# - Mixed precision runs matmuls and convolutions in 16 bits; weights, gradients and optimizer state
#   stay float32, so the memory saving is in the activations and grows with the batch.
# - The step is autocast around the forward and the loss, then `scaler.scale(loss).backward()`,
#   `unscale_` before clipping, `scaler.step`, `scaler.update`: the same code serves bf16 with a disabled scaler.
# - fp16 needs a GradScaler (underflow, then overflow handling); bf16 has fp32's range and needs none.
# - Whether it is faster depends on the hardware: measure, as this notebook did, and compare against a
#   true fp32 baseline with TF32 stated.

# %% [markdown]
# ## Further reading
# - Micikevicius et al. 2018, *Mixed Precision Training* (loss scaling, fp32 master weights):
#   https://arxiv.org/abs/1710.03740
# - Kalamkar et al. 2019, *A Study of BFLOAT16 for Deep Learning Training*: https://arxiv.org/abs/1905.12322
# - PyTorch, *Automatic Mixed Precision* (autocast op lists, GradScaler): https://pytorch.org/docs/stable/amp.html
# - PyTorch recipe, *Automatic Mixed Precision*: https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html
# - PyTorch, *TensorFloat-32 on Ampere and later devices*:
#   https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices
# - NVIDIA, *Train With Mixed Precision*: https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/

# %% [markdown]
# ## Exercises
# The first asks for code: the mixed-precision step, from memory if you can. The checker runs it in fp16
# and in bf16 against labkit's `Trainer.step` and names what differs.

# %%
print(exercises.question("01.amp_step"))


# %%
def my_amp_step(model, images, labels, optimizer, scaler, dtype, max_norm=1.0):
    """One mixed-precision training step; returns the loss."""
    raise NotImplementedError  # YOUR CODE


exercises.check("01.amp_step", my_amp_step)

# %% [markdown]
# The next one uses **your own** comparison from section 3. Then reason about it: the printed line under
# the check compares your answer with the measured saving. Which categories of the breakdown in section 4
# explain the difference, and would it grow or shrink at a larger batch?

# %%
mine = lab.own_saving_numbers(df, LOW)  # your fp32 and LOW runs, from section 3
print(exercises.question("01.own_saving", mine))

# %%
answer = None  # YOUR CODE: a fraction between 0 and 1
exercises.check("01.own_saving", answer, mine)
print(lab.own_saving_finding(df, LOW))

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

# %% [markdown]
# # Quantization: fewer bits per number, and where it pays
#
# Quantization stores weights, and sometimes activations, in fewer bits than float32: 16-bit floats, 8-bit
# or 4-bit integers. A model gets smaller, and faster wherever the hardware has kernels for the narrow
# type. The seeds of this lab quantized a fine-tuned CNN and met four puzzles: int8 dynamic barely
# shrank its file; fp16 looked fastest on one machine and slowest on another; fp16 and int8 would not
# combine; accuracy fell a lot in one run. This notebook measures every common method on two models,
# a small vision transformer (Linear-heavy, where int8 pays) and a CNN, and explains each puzzle live.
#
# **You will learn**
# 1. affine quantization from scratch: scale and zero point, symmetric vs asymmetric, per tensor vs per
#    channel, in plain PyTorch checked equal to `torch.quantize_per_tensor` / `quantize_per_channel`, and
#    what each choice costs in error;
# 2. one table of fp32, fp16, bf16, int8 dynamic, int8 weight-only, static int8 (calibrated), QAT, 4-bit
#    and bitsandbytes on both models: file size, CPU latency, GPU latency, accuracy;
# 3. the current API (torchao's `quantize_`) beside the deprecated one most code uses
#    (`torch.ao.quantization.quantize_dynamic`), and which was faster here;
# 4. the seeds' puzzles: why a CNN's file barely shrinks, when fp16 is fast, why fp16 and int8 dynamic do
#    not stack, and which layers to keep in float when accuracy drops;
# 5. fine-tune then quantize (PTQ) against quantization-aware fine-tuning (QAT), accuracy and time.
#
# **What you need:** notebook 00 (the four numbers). A CPU is fine, and is where most of this runs: the
# int8 kernels of `torch.ao` are CPU kernels, and CPU inference is what quantization is often for. On a
# GPU, the table adds GPU latencies and the methods with GPU kernels (torchao's int4, bitsandbytes),
# which a CPU reports as "not run here".

# %%
import copy

import torch
from torch import nn

import labkit
from labkit import guesses, plots, views
from labkit.labs import quantization as lab  # this notebook's experiments and findings
from labkit.labs.quantization import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import quantization
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
print(lab.library_versions())
labkit.env_report()


# %% [markdown]
# ## 1. The mechanism: affine quantization
# An 8-bit integer has 256 values. To store a float tensor `w` in it, map its range `[min, max]` (widened
# to include 0, so that 0 stays exact) onto the integers:
#
# - **scale** `s = (max - min) / 255`: the float step between two neighbouring integers;
# - **zero point** `z = -round(min / s)`: the integer that stands for 0.0;
# - quantize `q = clamp(round(w / s) + z, 0, 255)`; dequantize `w ≈ (q - z) * s`.
#
# That is **asymmetric** (unsigned, `quint8`). **Symmetric** quantization fixes `z = 0` and uses signed
# integers `-128..127` with `s = max|w| / 127.5`: simpler arithmetic (no zero point in the matmul), at the
# price of wasting part of the range when `w` is lopsided. Weights are roughly symmetric around 0, so
# they are usually quantized symmetrically; activations after a ReLU are all positive, and asymmetric
# suits them. **Per tensor** uses one `(s, z)` for the whole tensor; **per channel** one per output
# channel (row), so that a row of small weights is not rounded with the step of a row of large ones.
# In plain PyTorch:

# %%
def qparams(w, symmetric):
    low, high = min(w.min().item(), 0.0), max(w.max().item(), 0.0)  # the range, widened to include 0
    if symmetric:  # int8 -128..127, zero at 0
        return max(-low, high) / 127.5, 0, -128, 127
    scale = (high - low) / 255  # uint8 0..255
    return scale, int(round(-low / scale)), 0, 255


def quantize(w, symmetric):
    scale, zero_point, qmin, qmax = qparams(w, symmetric)
    q = torch.clamp(torch.round(w / scale) + zero_point, qmin, qmax)
    return q, (q - zero_point) * scale  # the integers, and the floats they stand for


# %%
vit_cfg, cnn_cfg = lab.workloads(P).values()  # tiny_vit and the profile's CNN
vit, vit_result = lab.fine_tuned(vit_cfg)
w = vit.block1.attn.qkv.weight.detach().cpu()  # the first attention layer's q, k, v projection
for symmetric in (False, True):
    q, restored = quantize(w, symmetric)
    scale, zero_point, _, _ = qparams(w, symmetric)
    dtype = torch.qint8 if symmetric else torch.quint8
    torchs = torch.quantize_per_tensor(w, scale, zero_point, dtype)  # torch's quantized tensor
    differ = int((q != torchs.int_repr()).sum())
    print(f"{'symmetric ' if symmetric else 'asymmetric'}: scale {scale:.5f}, zero point {zero_point:3d}, "
          f"integers {int(q.min())}..{int(q.max())}, mean error {(restored - w).abs().mean():.2e}")
    print(f"            {differ} of its {w.numel():,} integers differ from torch.quantize_per_tensor's")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the plain code gives torch's integers (a value exactly on a rounding tie may round the other way:
# torch multiplies by 1/scale, the cell divides) and labkit's qparams are the plain ones
for symmetric in (False, True):
    q, restored = quantize(w, symmetric)
    scale, zero_point, _, _ = qparams(w, symmetric)
    torchs = torch.quantize_per_tensor(w, scale, zero_point, torch.qint8 if symmetric else torch.quint8).int_repr()
    assert (q - torchs).abs().max() <= 1 and int((q != torchs).sum()) <= max(1, w.numel() // 10_000)
    s, z = quantization.affine_qparams(w, symmetric=symmetric)
    assert abs(float(s) - scale) <= 1e-6 * scale and int(z) == zero_point
    assert (restored - w).abs().max() <= scale / 2 + 1e-6  # rounding error: at most half a step

# %% [markdown]
# Per channel is the same arithmetic with one `(s, z)` per row: labkit's `quantization.affine_qparams(w,
# symmetric, dim=0)` computes them as torch's observers do, and `quantize_affine` gives the integers
# `torch.quantize_per_channel` stores. The four schemes on this weight and on the largest weight of the
# CNN (relative error = norm of the error / norm of the weight):

# %%
cnn, cnn_result = lab.fine_tuned(cnn_cfg)
cnn_weight = max((m.weight for m in cnn.modules() if isinstance(m, nn.Conv2d)), key=lambda t: t.numel())
errors = lab.scheme_errors({f"{vit_cfg.model} qkv": w, f"{cnn_cfg.model} largest conv": cnn_weight})
print(lab.scheme_finding(errors))
errors

# %% jupyter={"source_hidden": true} tags=["check"]
# check: labkit's per-channel integers are torch.quantize_per_channel's, and per channel never loses to per tensor
scales, zeros = quantization.affine_qparams(w, symmetric=True, dim=0)
mine = quantization.quantize_affine(w, scales, zeros, symmetric=True, dim=0)
assert torch.equal(mine, torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8).int_repr().long())
e = errors.set_index(["weight", "scheme", "granularity"]).relative_error
for name in errors.weight.unique():
    for scheme in ("symmetric", "asymmetric"):
        assert e[(name, scheme, "per channel")] <= e[(name, scheme, "per tensor")] * 1.001

# %% [markdown]
# Each integer step is one `scale`, so the rounding error of a value is at most half a step: a narrower
# range (per channel, or asymmetric on a lopsided tensor) means a smaller step and a smaller error. The
# printed lines say which scheme won on each weight here. A single large weight (an outlier) stretches
# the range of its whole tensor or row and coarsens everything else in it; that is why per-channel
# weights are the default in every int8 recipe, and why LLM.int8() (bitsandbytes, below) keeps outlier
# features in 16 bits.
#
# ## 2. Every method on two models
# `quantization.quantize(model, method, calibration=None)` returns a quantized copy by one of
# `quantization.METHODS`:

# %%
lab.methods_table()

# %% [markdown]
# **Dynamic** quantization stores the Linear weights in int8 and quantizes each batch's activations on
# the fly (their range is measured per call); **weight-only** keeps activations in float and
# dequantizes the weights inside the matmul (it saves memory, and time only where memory traffic is the
# bottleneck: large models, small batches); **static** fixes every activation's range beforehand from a
# few **calibration** batches of training data, so convolutions and additions run in int8 too. **QAT**
# fine-tunes with the rounding simulated (section 4). Two models: `tiny_vit`, whose work is almost all
# in Linear layers, and the profile's CNN, whose work is in convolutions.
#
# **Predict first.** For `tiny_vit`: what fraction (0..1) of the fp32 file will int8 dynamic keep, and
# how many times fp32's speed will it run on this machine's CPU at batch 64?

# %%
guess_size_fraction = None  # YOUR GUESS: int8 dynamic file / fp32 file, e.g. 0.5
guess_speedup = None  # YOUR GUESS: fp32 latency / int8 dynamic latency on the CPU, e.g. 2

# %%
table = lab.compare({vit_cfg.model: vit_cfg, cnn_cfg.model: cnn_cfg})  # every method, both models
print(lab.compare_finding(table))
dyn = table[(table.model == vit_cfg.model) & (table.method == "int8_dynamic")].iloc[0]
print(guesses.versus(guess_size_fraction, dyn.size_vs_fp32, "int8 dynamic file / fp32 file"))
print(guesses.versus(guess_speedup, dyn.cpu_speedup, "int8 dynamic CPU speed-up"))
plots.bars(table, x="method", ys=lab.chart_metrics(table), hue="model");

# %%
view = lab.table_view(table)  # `table` itself has every column, the API and the raw numbers
view.style.hide(axis="index").format(precision=2, na_rep="")  # styled: long reasons are shown whole

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every method ran or says why; int8 shrinks the Linear-heavy model to under a third; the
# casts halve both files; nothing that ran lost more than a few points on the ViT
t = table.set_index(["model", "method"])
assert (table.ran | table.reason.notna()).all()
assert t.size_vs_fp32[(vit_cfg.model, "int8_dynamic")] <= 0.30
assert 0.45 < t.size_vs_fp32[(vit_cfg.model, "fp16")] < 0.55 and 0.45 < t.size_vs_fp32[(cnn_cfg.model, "bf16")] < 0.55
assert t.size_vs_fp32[(cnn_cfg.model, "int8_dynamic")] > 0.9  # the CNN's convolutions stay float
noise = labkit.measure.accuracy_noise(t.test_accuracy[(vit_cfg.model, "fp32")], min(P.test_size, lab.EVAL_IMAGES))
for method in ("fp16", "bf16", "int8_dynamic", "int8_weight_only", "int8_bnb"):
    if t.ran[(vit_cfg.model, method)]:
        assert t.accuracy_drop[(vit_cfg.model, method)] <= noise + 0.02, method

# %% [markdown]
# The `int8_qat` row had extra fine-tuning steps (section 4), so its accuracy is not quantization's alone.
# Sizes are exact on any machine; latencies are this machine's, with the threads recorded (fewer threads
# or a busy machine change them, not the sizes). The speed-up of int8 is bounded by the share of time the
# model spends in the layers int8 replaces: attention's softmax, LayerNorm, GELU and the additions stay in
# float, so a model at 50 % Linear time cannot run more than 2x faster however fast its int8 matmuls are
# (Amdahl's law). int8 matmuls gain most on CPUs with int8 dot-product instructions (AVX512-VNNI, AMX);
# on AVX2 alone the gain is smaller. On a GPU, `torch.ao`'s int8 kernels do not exist: there int8 pays
# through torchao's kernels (often with `torch.compile`) or bitsandbytes, mainly for large models.
#
# ### Two APIs for the same method
# `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)` is what the seeds and
# most tutorials use; it is deprecated since torch 2.10 (labkit silences exactly its deprecation
# warnings) and runs only on the CPU. torchao's `quantize_(model, Int8DynamicActivationInt8WeightConfig())`
# is its successor: it swaps each Linear weight for a quantized tensor subclass in place, runs on CPU and
# GPU, and is written to be compiled with `torch.compile`. Here both ran in eager mode:

# %%
print(lab.api_finding(table))

# %% [markdown]
# Which is faster depends on the kernels each dispatches to on this hardware and on compilation: torchao's
# eager path quantizes each token's activations with separate PyTorch operations before its int8 matmul,
# where `torch.ao`'s `quantize_dynamic` calls one fbgemm/oneDNN kernel that does both; with `torch.compile`
# torchao fuses those operations. On a GPU only torchao
# runs. Colab and Kaggle preinstall their own torchao, sometimes older than the version this notebook was
# tested with; the first cell printed both.
#
# ## 3. The puzzles
# ### 3.1 "int8 dynamic barely shrank the CNN"

# %%
print(lab.size_finding(table))

# %% [markdown]
# `quantize_dynamic` and torchao's configs replace **Linear** layers; a CNN keeps almost all its weights in
# convolutions, which they leave in float32. Static quantization (and QAT) quantize convolutions too,
# because it knows each activation's range in advance. The share of parameters in Linear layers predicts
# the file size; exercise 2 asks you to do that from your own numbers.
#
# ### 3.2 "fp16 was fastest"

# %%
print(lab.fp16_finding(table))

# %% [markdown]
# A cast to fp16 always halves the file, but it is only faster where the hardware computes in fp16: GPUs
# with tensor cores (T4, V100 and later) do, and there fp16 inference is usually the fastest float option.
# Most CPUs have no fp16 arithmetic (AVX512-FP16 and AMX-FP16 are recent server features), so PyTorch
# converts each fp16 operation to float32 and back, which is slower than fp32. bf16 is native on CPUs with
# AVX512-BF16 or AMX and on Ampere+ GPUs. The printed line says which case this machine is.
#
# ### 3.3 "fp16 and int8 dynamic do not stack"
# A natural idea: cast to fp16, then quantize the Linear layers to int8, for the smallest model of both.

# %%
stack = lab.stacking(vit_cfg)
print(stack)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the fp16 model quantized to int8 dynamic cannot run on fp16 inputs
assert stack.fp16_input_error is not None and stack.int8_bytes < stack.fp16_bytes

# %% [markdown]
# They are two answers to the same question, not two layers of savings: int8 dynamic already stores the
# Linear weights in 1 byte, and its kernels take float32 activations (they quantize them to int8 on the
# fly), so fp16 activations have nowhere to go; what is left in fp16 (LayerNorm, biases, embeddings) is a
# small part of the file. Choose one per deployment: fp16/bf16 where the hardware computes in it (GPUs),
# int8 where int8 kernels exist (CPUs; GPUs through torchao or bitsandbytes).
#
# ### 3.4 "Accuracy dropped a lot after quantization"
# When accuracy falls, a few sensitive layers usually carry the loss: the first layer (it sees raw
# pixels, whose range differs from everything after it, and has few weights to average rounding errors
# over), the last (its outputs are the logits, where a rounding error changes the argmax directly), and
# normalisation layers (LayerNorm divides by a standard deviation computed from quantized inputs). Two
# studies on the validation split: static int8 with everything quantized against those layers kept in
# float (`quantize(..., keep_float=("stem", "head", "LayerNorm"))`); and, since int8 may leave nothing to
# win back, weights rounded to 4 and 3 bits (simulated with `quantization.fake_quantize_weights`: the
# rounded values stored as floats), with the first and last layers kept in float or not:

# %%
sensitive = lab.sensitivity(vit_cfg)
print(lab.sensitivity_finding(sensitive, vit_cfg))
fig, (left, right) = plots.grid(2)
plots.bar(sensitive[sensitive.study.isin(["fp32", "int8 static"])], x="choice", y="val_accuracy", ax=left)
plots.bar(sensitive[sensitive.study.str.contains("simulated")], x="label", y="val_accuracy", ax=right)
fig.tight_layout()

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each int8 choice keeps what it says in float, and more float layers never make the file smaller
s = sensitive[sensitive.study == "int8 static"].set_index("choice")
assert list(s.index) == list(lab.KEEP_FLOAT_CHOICES)
assert s.model_size_bytes["all int8"] <= s.model_size_bytes["first+last+LN float"] < sensitive.model_size_bytes.iloc[0]
assert set(sensitive.study) == {"fp32", "int8 static", *(f"{b}-bit weights (simulated)" for b in lab.SIMULATED_BITS)}


# %% [markdown]
# The choices are made on the validation split, never on the test split. Where quantizing everything cost
# less than the noise, there was nothing to win back (the printed lines say which studies that was).
# Fewer bits make each rounding step coarser, and the layers that cannot absorb it show first: the layer
# whose choice won most back is the one to keep in float. Keeping a small first or last layer in float
# costs little size: the first layer of `tiny_vit` (patch embedding and positions) holds under 3 % of
# its parameters, the last under 0.3 %.
#
# ## 4. Fine-tune then quantize, or quantization-aware training
# **Post-training quantization** (PTQ, everything above) rounds a trained model. **Quantization-aware
# training** (QAT) fine-tunes with the rounding simulated in the forward pass, so the weights learn to sit
# where rounding hurts least; the backward pass treats the rounding as the identity (the
# straight-through estimator, since `round` has zero gradient almost everywhere). In plain PyTorch:

# %%
def fake_quantize(x, scale, zero_point, qmin=-128, qmax=127):
    q = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax)
    rounded = (q - zero_point) * scale
    return x + (rounded - x).detach()  # forward: the rounded value; backward: gradient 1 (straight through)


x = torch.linspace(-1.5, 1.5, 13, requires_grad=True)
yours = fake_quantize(x, 0.01, 0)
yours.sum().backward()
mine_grad = x.grad.clone()
x.grad = None
torchs = torch.fake_quantize_per_tensor_affine(x, 0.01, 0, -128, 127)
torchs.sum().backward()
print(f"outputs equal torch's: {torch.allclose(yours, torchs)}; gradients: yours {mine_grad.tolist()[:4]}..., "
      f"torch's {x.grad.tolist()[:4]}...")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the outputs are torch's; the gradient passes inside the range; torch's zeroes it where the value was clipped
assert torch.allclose(yours, torchs)
inside = (x.detach() / 0.01).abs() <= 127
assert torch.equal(x.grad[inside], mine_grad[inside]) and (x.grad[~inside] == 0).all()

# %% [markdown]
# torch's version also zeroes the gradient of clipped values (they cannot move back into range through
# the rounding), which is the one difference from the three-line version. labkit's `prepare_qat` inserts
# such fake-quantize steps for every weight and activation (torch.ao's FX graph mode), `fit` fine-tunes the
# result like any model, and `convert_qat` turns it into the int8 model. The seed's recipe: train in float,
# then fine-tune a few more steps quantization-aware. Three recipes from the same fine-tuned `tiny_vit`: PTQ
# at once; as many more float steps, then PTQ (to separate QAT's effect from the extra training); and the
# QAT steps:
#
# **Predict first.** How many points of test accuracy will QAT gain over PTQ at once?

# %%
guess_qat_points = None  # YOUR GUESS: QAT accuracy - PTQ accuracy, in points, e.g. 2

# %%
recipes = lab.qat_vs_ptq(vit_cfg)  # PTQ at once; more float steps, then PTQ; QAT steps
print(lab.qat_finding(recipes))
gain = (recipes.test_accuracy.iloc[2] - recipes.test_accuracy.iloc[0]) * 100
print(guesses.versus(guess_qat_points, gain, "QAT - PTQ, points"))
recipes

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the two continued runs took the same number of steps, and both were timed
assert recipes.extra_steps.iloc[1] == recipes.extra_steps.iloc[2] > 0
assert (recipes.test_accuracy.between(0, 1)).all() and recipes.step_time_s.iloc[1:].gt(0).all()

# %% [markdown]
# QAT pays where PTQ loses accuracy: low bit widths (4 bits and below), models with outliers, tasks where a
# point matters. When PTQ is already within the noise of fp32, as int8 often is, QAT has nothing to win
# back, and each of its steps costs more than a float step (a fake-quantize step on every weight and
# activation, in the forward and the backward). The printed line says which case this run was, against the noise of the test split.
#
# ### bitsandbytes: LLM.int8() and NF4
# The table's `int8_bnb` row is bitsandbytes' `Linear8bitLt` (LLM.int8(), Dettmers et al. 2022): int8 weights
# with the few activation columns above a threshold (outlier features) multiplied in 16 bits; it takes fp16 inputs and casts float32 ones. `nf4_bnb` is
# `Linear4bit` with the 4-bit NormalFloat type of QLoRA (Dettmers et al. 2023): 16 levels placed at the
# quantiles of a normal distribution, one scale per block of 64 weights. They are built for large
# language models on GPUs; on a CPU bitsandbytes 0.50 runs them with its PyTorch fallback (without the
# optional `kernels` package, slower), so their CPU latency here says little. Its CPU kernel also needs layers with a multiple of 32 outputs, so there
# the 10-class head stays float, and the CNN, whose only Linear layer is its head, reports NF4 as not run.
# The 4-bit file is the
# smallest of the table; notebook 08 fine-tunes LoRA adapters on such a base (QLoRA).
#
# ## 5. Your turn: the panel
# Choose the model, the method and the number of calibration batches (static int8 only), and press
# **Run**. Each run adds bars to the charts: file size and CPU speed against fp32, and test accuracy.
# Try `int8_static` with 1 calibration batch and with 16.

# %%
panel = ExperimentPanel(
    run=lab.panel_run, controls={"seed": [0, 1]},
    options={"model": [vit_cfg.model, cnn_cfg.model], "method": list(lab.TABLE_METHODS),
             "calibration": (1, 32, 1)},
    base=vit_cfg, show=views.Bars("method", ("size_vs_fp32", "cpu_speedup", "test_accuracy"), hue="model"),
    estimate=lab.panel_estimate, title="Quantization")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | accuracy drops a lot after quantization | sensitive layers quantized (first, last, LayerNorm); too few or unrepresentative calibration batches | keep those layers in float (`keep_float`); calibrate on training batches; per-channel weights; QAT |
# | the file barely shrinks | the method quantizes Linear layers only and the model is convolutional | static int8 or QAT for convolutions |
# | fp16 is slower than fp32 | no fp16 arithmetic (most CPUs) | bf16 where native, int8 on CPUs, fp16 on tensor-core GPUs |
# | `expected scalar type Float but found Half` | fp16 and int8 dynamic combined | one or the other; int8 kernels take float32 activations |
# | `NotImplementedError: Could not run 'quantized::...' with arguments from the 'CUDA' backend` | a `torch.ao` quantized model moved to a GPU | `torch.ao` int8 is CPU-only: run it on the CPU, or use torchao / bitsandbytes on the GPU |
# | no speed-up from int8 | a tiny model bound by overheads; time in layers int8 does not replace; no VNNI/AMX | measure the Linear share first; larger batches; `torch.compile` with torchao |
# | torchao silently quantized nothing | a layer's shape does not fit the kernel (int4 group size) | check the layers' weight types after `quantize_` (labkit raises when nothing changed) |
# | deprecation warnings from `torch.ao.quantization` | the API is deprecated since torch 2.10 | torchao's `quantize_` (eager) and PT2E (`prepare_pt2e`) for static |

# %% [markdown]
# ## Going further
# - **PT2E static quantization** (torchao's `prepare_pt2e` / `convert_pt2e` with `X86InductorQuantizer`)
#   replaces FX graph mode: `torch.export` the model, quantize the graph, `torch.compile` it. Compilation
#   takes minutes on a small CPU, which is why this notebook uses FX graph mode.
# - **Weight-only 4-bit for LLMs**: GPTQ (Frantar et al. 2022) and AWQ (Lin et al. 2023) choose the
#   rounding using calibration data; torchao and `transformers` integrate them.
# - **SmoothQuant** (Xiao et al. 2022) moves activation outliers into the weights so that both quantize to int8.
# - **fp8** (H100 and later): `Float8DynamicActivationFloat8WeightConfig` in torchao, training in fp8 too.
# - **Mixed precision per layer**: keep the layers a sensitivity scan marks in higher precision (as notebook
#   04 did for pruning).

# %% [markdown]
# ## Summary
# - Affine quantization: `q = clamp(round(w / s) + z)`, `w ≈ (q - z) s`; the error is at most half a step, so
#   a narrower range (per channel; asymmetric for lopsided tensors) means a smaller error.
# - `quantize(model, method)` covers the common methods; sizes are exact everywhere, speed depends on the
#   kernels the hardware has: int8 on CPUs (VNNI/AMX best), fp16/bf16 on GPUs with tensor cores.
# - int8 dynamic and weight-only quantize Linear layers only: a transformer shrinks to under a third, a
#   CNN barely; static int8 and QAT quantize convolutions too, with calibration batches.
# - fp16 and int8 dynamic do not stack; choose one per target.
# - When accuracy drops, keep the first, last and LayerNorm layers in float; QAT helps where PTQ loses.
# - torchao's `quantize_` is the current API; `torch.ao.quantization` is deprecated but still what most code runs.

# %% [markdown]
# ## Further reading
# - Jacob et al. 2018, *Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
#   Inference*: https://arxiv.org/abs/1712.05877
# - Krishnamoorthi 2018, *Quantizing deep convolutional networks for efficient inference: A whitepaper*:
#   https://arxiv.org/abs/1806.08342
# - Nagel et al. 2021, *A White Paper on Neural Network Quantization*: https://arxiv.org/abs/2106.08295
# - Dettmers et al. 2022, *LLM.int8()*: https://arxiv.org/abs/2208.07339 and 2023, *QLoRA*:
#   https://arxiv.org/abs/2305.14314
# - torchao quantization overview: https://docs.pytorch.org/ao/stable/quantization_overview.html
# - PyTorch, *Quantization* (the deprecated `torch.ao` API and its migration):
#   https://docs.pytorch.org/docs/stable/quantization.html

# %% [markdown]
# ## Exercises
# The first asks for code: per-channel symmetric int8 by hand. The checker compares your integers and
# scales with `torch.quantize_per_channel`'s.

# %%
print(exercises.question("06.per_channel"))


# %%
def per_channel_int8(weight):
    """Return (q, scale): int8 integers of weight's shape and one scale per output channel (dim 0)."""
    raise NotImplementedError  # YOUR CODE


exercises.check("06.per_channel", per_channel_int8)

# %% [markdown]
# The next one uses **your own** table: `tiny_vit`'s share of parameters in Linear layers, and what int8
# dynamic did to its file. After answering: why did the file keep a little more than your estimate? And
# what would the same estimate give for the CNN?

# %%
mine = lab.own_size_numbers(table, vit_cfg.model)
print(exercises.question("06.own_size", mine))

# %%
answer = None  # YOUR CODE: a fraction, 0..1
exercises.check("06.own_size", answer, mine)

# %%
print(exercises.question("06.nf4_bytes"))

# %%
answer = None  # YOUR CODE: GB
exercises.check("06.nf4_bytes", answer)

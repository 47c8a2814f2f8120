# %% [markdown]
# # Quantization: fewer bits per number, and where it pays
#
# Quantization stores weights, and sometimes activations, in fewer bits than float32. A model gets smaller, and
# faster wherever the hardware has kernels for the narrow type. This notebook measures every common method on a
# small vision transformer and a CNN, tests four popular claims, then quantizes a fine-tuned language model.
#
# **You will learn**
# 1. affine quantization in plain PyTorch: scale, zero point, symmetric or not, per tensor or per channel;
# 2. every common method on both models: file size, latency, accuracy; torchao's `quantize_` and PT2E beside the
#    deprecated `torch.ao` APIs;
# 3. which claims hold: "4x smaller", "fp16 is fastest", "fp16 and int8 stack", "no accuracy lost";
# 4. fine-tune then quantize (PTQ) against quantization-aware fine-tuning (QAT);
# 5. int8 dynamic quantization of a fine-tuned language model.
#
# **What you need:** notebook 00. A CPU is fine (`torch.ao`'s int8 kernels are CPU-only); a GPU adds GPU
# latencies and torchao's int4. Some speed differences of small models lie within the noise, as the findings say.

# %%
import copy

import torch
from torch import nn

import labkit
from labkit import display, guesses, plots, views
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
# to include 0, so 0 stays exact) onto the integers:
#
# - **scale** `s = (max - min) / 255`: the float step between two neighbouring integers;
# - **zero point** `z = -round(min / s)`: the integer that stands for 0.0;
# - quantize `q = clamp(round(w / s) + z, 0, 255)`; dequantize `w ≈ (q - z) * s`.
#
# That is **asymmetric** (unsigned). **Symmetric** fixes `z = 0` and uses `-128..127` with
# `s = max|w| / 127.5`: no zero point in the matmul, but part of the range is wasted when `w` is lopsided.
# Weights sit roughly symmetric around 0; post-ReLU activations are all positive, suiting asymmetric.
# **Per tensor** uses one `(s, z)` for the whole tensor, **per channel** one per output row. In plain PyTorch:

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
    print(f"{'symmetric ' if symmetric else 'asymmetric'}: scale {scale:.3g}, zero point {zero_point:3d}, "
          f"mean error {(restored - w).abs().mean():.2e}; {differ} of {w.numel():,} integers differ from torch's")

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
# Per channel is the same arithmetic with one `(s, z)` per row (`quantization.affine_qparams(w, symmetric,
# dim=0)`, as torch's observers compute them). The four schemes on this weight and the CNN's largest
# (relative error = norm of the error / norm of the weight):

# %%
cnn, cnn_result = lab.fine_tuned(cnn_cfg)
cnn_weight = max((m.weight for m in cnn.modules() if isinstance(m, nn.Conv2d)), key=lambda t: t.numel())
errors = lab.scheme_errors({f"{vit_cfg.model} qkv": w, f"{cnn_cfg.model} largest conv": cnn_weight})
errors

# %% jupyter={"source_hidden": true} tags=["check"]
# check: labkit's per-channel integers are torch.quantize_per_channel's, and per channel never loses to per tensor
scales, zeros = quantization.affine_qparams(w, symmetric=True, dim=0)
mine = quantization.quantize_affine(w, scales, zeros, symmetric=True, dim=0)
assert torch.equal(mine, torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8).int_repr().long())
e = errors.frame.set_index(["weight", "scheme", "granularity"]).relative_error
for name in errors.frame.weight.unique():
    for scheme in ("symmetric", "asymmetric"):
        assert e[(name, scheme, "per channel")] <= e[(name, scheme, "per tensor")] * 1.001

# %% [markdown]
# The rounding error is at most half a step, so a narrower range means a smaller error: per channel never loses to
# per tensor, and an outlier stretches only its own row. Hence int8 recipes quantize weights per channel.
#
# ## 2. Every method on two models
# `quantization.quantize(model, method, calibration=None)` returns a quantized copy by one of
# `quantization.METHODS`:

# %%
methods = lab.methods_table()
methods  # `methods.frame` also says which touch Linear layers only

# %% [markdown]
# **Dynamic** stores the Linear weights in int8 and quantizes each batch's activations on the fly; **weight-only**
# keeps activations in float and dequantizes the weights inside the matmul; **static** fixes every activation's
# range beforehand from a few **calibration** batches, so convolutions run in int8 too. **QAT** fine-tunes with
# the rounding simulated (section 4).
#
# **Predict first.** For `tiny_vit`: what fraction of the fp32 file will int8 dynamic keep, and how many
# times fp32's speed will it run on this CPU?

# %%
guess_size_fraction = None  # YOUR GUESS: int8 dynamic file / fp32 file, e.g. 0.5
guess_speedup = None  # YOUR GUESS: fp32 latency / int8 dynamic latency on the CPU, e.g. 2

# %%
table = lab.method_comparison({vit_cfg.model: vit_cfg, cnn_cfg.model: cnn_cfg})  # every method, both models
dyn = table.row(vit_cfg.model, "int8_dynamic")
print(guesses.versus(guess_size_fraction, dyn.size_vs_fp32, "int8 dynamic file / fp32 file"))
print(guesses.versus(guess_speedup, dyn.cpu_speedup, "int8 dynamic CPU speed-up"))
plots.bars(table.frame, x="method", ys=table.metrics(), hue="model");

# %%
table  # `table.frame` has every column: api, ratios, noise, threads, ...

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every method ran or says why; int8 shrinks the Linear-heavy model to under a third; the
# casts halve both files; nothing that ran lost more than a few points on the ViT
t = table.frame.set_index(["model", "method"])
assert (t.ran | t.reason.notna()).all()
assert t.size_vs_fp32[(vit_cfg.model, "int8_dynamic")] <= 0.30
assert 0.45 < t.size_vs_fp32[(vit_cfg.model, "fp16")] < 0.55 and 0.45 < t.size_vs_fp32[(cnn_cfg.model, "bf16")] < 0.55
assert t.size_vs_fp32[(cnn_cfg.model, "int8_dynamic")] > 0.9  # the CNN's convolutions stay float
fp32 = t.loc[(vit_cfg.model, "fp32")]
noise = labkit.measure.accuracy_noise(fp32.test_accuracy, int(fp32.test_images))
for method in ("fp16", "bf16", "int8_dynamic", "int8_weight_only", "int8_bnb"):
    if t.ran[(vit_cfg.model, method)]:
        assert t.accuracy_drop[(vit_cfg.model, method)] <= noise + 0.02, method

# %% [markdown]
# Latencies are timed in turns, fp32 twice: the gap between the two is the **timing noise**, and a speed-up inside
# it counts as "within the noise". The gain is bounded by the time in the layers int8 replaces: softmax,
# LayerNorm and GELU stay in float, so a model at 50 % Linear time cannot run more than 2x faster (Amdahl's law).
# int8 gains most on CPUs with AVX512-VNNI or AMX. The `int8_qat` row had extra fine-tuning steps.
#
# **Two APIs.** `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)` is what most
# tutorials use: deprecated since torch 2.10, CPU only. torchao's `quantize_(model,
# Int8DynamicActivationInt8WeightConfig())` is its successor: it swaps each Linear weight for a quantized tensor
# subclass, runs on CPU and GPU, and is written to be compiled:

# %%
print(table.api_finding())

# %% [markdown]
# In eager mode torchao quantizes activations in separate operations, `quantize_dynamic` in one fused kernel.

# %% [markdown]
# Published figures for scale (int8 in PyTorch's blog and documentation; measured elsewhere, not here):

# %%
display.table(labkit.results.published("06_quantization-speedup*", "06_quantization-size*", "06_quantization-compute*"))

# %% [markdown]
# **Two flows for static int8.** The table's `int8_static` is FX graph mode (`torch.ao`'s `prepare_fx` /
# `convert_fx`), which PyTorch is retiring. Its successor, **PT2E** (torchao), exports the model, lets a quantizer
# mark what to quantize, calibrates, converts:

# %%
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

calibration = lab.calibration_batches(cnn_cfg)
model = copy.deepcopy(cnn).cpu().eval()
batch = {0: torch.export.Dim("batch")}  # strict: the capture torchao's quantizer matches on every torch since 2.5
graph = torch.export.export(model, (calibration[0],), dynamic_shapes=(batch,), strict=True).module()
quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
prepared = prepare_pt2e(graph, quantizer)  # an observer on every tensor the quantizer marked
with torch.no_grad():
    for images in calibration:  # the observers record each activation's range
        prepared(images)
int8_graph = convert_pt2e(prepared)  # int8 weights; quantize -> dequantize around each int8 operation

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the plain lines give the engine's int8_pt2e model (the same outputs), and both flows quantize the same layers
engine = quantization.quantize(cnn, "int8_pt2e", calibration)
with torch.no_grad():
    assert torch.allclose(int8_graph(calibration[0]), engine(calibration[0]), atol=1e-5)
fx_int8 = quantization.quantize(cnn, "int8_static", calibration)
assert quantization.int8_layers(engine) == quantization.int8_layers(fx_int8) != []

# %% [markdown]
# **Predict first.** Will PT2E's accuracy differ from FX's on the CNN, beyond the noise?

# %%
guess_pt2e_points = None  # YOUR GUESS: PT2E accuracy - FX accuracy, in points, e.g. 0

# %%
flows = lab.flows(cnn_cfg)  # the table's FX row beside PT2E, the same calibration batches
pt2e_points = (flows.frame.test_accuracy.iloc[2] - flows.frame.test_accuracy.iloc[1]) * 100
print(guesses.versus(guess_pt2e_points, pt2e_points, "PT2E - FX, points"))
flows

# %% jupyter={"source_hidden": true} tags=["check"]
# check: both flows stored the same layers in int8 and shrank the CNN alike
assert flows.frame.same_layers.iloc[1:].all() and (flows.frame.size_vs_fp32.iloc[1:] < 0.35).all()

# %% [markdown]
# Both use one x86 recipe (int8 weights per channel, uint8 activations): the same layers, nearly the same numbers.
# The PT2E graph computes in float32 around quantize/dequantize steps, so its latency is not int8's; `torch.compile`
# lowers it to int8 kernels (slow to compile, skipped here).

# %% [markdown]
# ## 3. Four popular claims, tested
# Each circulates in tutorials and forums, usually from one model on one machine.
#
# ### 3.1 "int8 quantization makes a model four times smaller"

# %%
print(table.size_finding())

# %% [markdown]
# It holds for the Linear-heavy model only. `quantize_dynamic` and torchao's configs replace **Linear** layers; a
# CNN's weights sit almost all in convolutions, left in float32. Static int8 and QAT quantize convolutions too. The
# Linear layers' share of parameters predicts the file size (exercise 2).
#
# ### 3.2 "fp16 is the fastest way to run a model"

# %%
print(table.fp16_finding())

# %% [markdown]
# fp16 always halves the file, but it is faster only where the hardware computes in fp16: GPUs with tensor cores
# (T4 and later). Most CPUs lack fp16 arithmetic, so each operation converts to float32 and back.
#
# ### 3.3 "Cast to fp16, then quantize to int8, for the smallest model"

# %%
stack = lab.stacking(vit_cfg)
stack

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the fp16 model quantized to int8 dynamic cannot run on fp16 inputs
sizes = stack.frame.set_index("variant").model_size_bytes
assert stack.fp16_input_error is not None and sizes["int8 dynamic"] < sizes["fp16"]

# %% [markdown]
# With `torch.ao`'s int8 dynamic quantization they do not stack: its kernels take float32 activations only.
# torchao's int8 weight-only layers do run on an fp16 model.
#
# ### 3.4 "Quantization costs no accuracy"
# When accuracy falls, a few sensitive layers usually carry the loss: the first (it sees raw pixels), the last
# (a logit's rounding error flips the argmax) and normalisation layers. Two studies on the validation
# split: static int8, everything quantized or those layers kept in float (`keep_float=("stem", "head",
# "LayerNorm")`); and weights rounded to 4 and 3 bits (simulated), the first and last layers kept or not:

# %%
sensitive = lab.sensitivity(vit_cfg)
studies = sensitive.frame
fig, (left, right) = plots.grid(2)
plots.bar(studies[studies.study.isin(["fp32", "int8 static"])], x="choice", y="val_accuracy", ax=left)
plots.bar(studies[studies.study.str.contains("simulated")], x="label", y="val_accuracy", ax=right)
fig.tight_layout()
sensitive

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each int8 choice keeps what it says in float, and more float layers never make the file smaller
s = studies[studies.study == "int8 static"].set_index("choice")
assert list(s.index) == list(lab.KEEP_FLOAT_CHOICES)
assert s.model_size_bytes["all int8"] <= s.model_size_bytes["first+last+LN float"] < studies.model_size_bytes.iloc[0]
assert set(studies.study) == {"fp32", "int8 static", *(f"{b}-bit weights (simulated)" for b in lab.SIMULATED_BITS)}


# %% [markdown]
# Where quantizing everything stays within the noise, the claim holds. Fewer bits make each step coarser, and the
# sensitive layers show first: the choice that won most back names the layer to keep in float (chosen on
# validation, never test data). They hold under 3 % of `tiny_vit`'s parameters.
#
# ## 4. Fine-tune then quantize, or quantization-aware training
# **Post-training quantization** (PTQ, everything above) rounds a trained model. **Quantization-aware
# training** (QAT) fine-tunes with the rounding simulated in the forward pass, so the weights learn to sit
# where rounding hurts least; the backward pass treats the rounding as the identity (the straight-through
# estimator, since `round` has zero gradient almost everywhere). In plain PyTorch:

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
# torch's version also zeroes the gradient of clipped values, the one difference. labkit's `prepare_qat`
# inserts such steps for every weight and activation, `fit` fine-tunes the result, and `convert_qat` makes
# the int8 model. Three recipes from the same fine-tuned `tiny_vit`: PTQ at once; as many more float steps
# as QAT takes, then PTQ (to separate QAT's effect from the extra training); and the QAT steps.
#
# **Predict first.** How many points of test accuracy will QAT gain over PTQ at once?

# %%
guess_qat_points = None  # YOUR GUESS: QAT accuracy - PTQ accuracy, in points, e.g. 2

# %%
recipes = lab.qat_vs_ptq(vit_cfg)  # PTQ at once; more float steps, then PTQ; QAT steps
gain = (recipes.frame.test_accuracy.iloc[2] - recipes.frame.test_accuracy.iloc[0]) * 100
print(guesses.versus(guess_qat_points, gain, "QAT - PTQ, points"))
recipes

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the two continued runs took the same number of steps, and both were timed
r = recipes.frame
assert r.extra_steps.iloc[1] == r.extra_steps.iloc[2] > 0
assert (r.test_accuracy.between(0, 1)).all() and r.step_time_s.iloc[1:].gt(0).all()

# %% [markdown]
# QAT pays where PTQ loses accuracy: 4 bits and below, models with outliers. When PTQ is already within the
# noise of fp32, as int8 often is, QAT has nothing to win back. A QAT step costs more (fake quantization both
# ways), which on tiny models may hide in the noise.
#
# ## 5. A fine-tuned language model
# The classic case for int8 dynamic quantization: a fine-tuned transformer served on a CPU. Here the profile's
# fine-tuned Llama (notebook 08's), every Linear in int8 or all but the output layer, scored on sorting digits.
# **Predict first:** the int8 file as a fraction of fp32's?

# %%
guess_lm_size = None  # YOUR GUESS: e.g. 0.25

# %%
lm_quant = lab.lm_quantization()  # fp32, int8 dynamic (output layer int8 or float), fp32 timed again (cached)
print(guesses.versus(guess_lm_size, lm_quant.frame.size_ratio.iloc[1], "int8 file / fp32 file"))
lm_quant

# %% jupyter={"source_hidden": true} tags=["check"]
# check: int8 shrinks the file (embeddings stay float), least with an int8 copy of a tied output layer, and keeps
# the answers' perplexity close to fp32's
q = lm_quant.frame.set_index("variant")
smaller, larger = (lab.HEAD_FLOAT, lab.ALL_INT8) if q.tied[lab.FP32] else (lab.ALL_INT8, lab.HEAD_FLOAT)
assert q.size_ratio[smaller] < q.size_ratio[larger] < 1
assert (q.perplexity[[lab.ALL_INT8, lab.HEAD_FLOAT]] < 1.2 * q.perplexity[lab.FP32]).all()

# %% [markdown]
# The token embeddings are a lookup, not a Linear layer, and stay float: the file shrinks toward a quarter only as
# far as Linear weights dominate. Where the output layer costs quality, keeping it in float wins it back. A
# **tied** output layer (SmolLM2, Qwen2.5: one matrix with the embeddings) gets an int8 copy beside the float
# embeddings, so there keeping it float is smaller; the finding says which case this is.
#
# ## 6. Your turn: the panel
# Choose model, method and calibration batches (static int8 only), and press **Run**; each run adds bars
# for size and CPU speed against fp32 and test accuracy. Try `int8_static` with 1 calibration batch and 16.

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
# | accuracy drops a lot | sensitive layers quantized; few calibration batches | `keep_float`; more calibration; QAT |
# | the file barely shrinks | Linear-only method on a CNN | static int8 or QAT |
# | fp16 slower than fp32 | no fp16 arithmetic (most CPUs) | bf16 where native, int8 on CPUs |
# | `expected scalar type Float but found Half` | fp16 and int8 dynamic combined | one or the other |
# | `Could not run 'quantized::...'` on `'CUDA'` | a `torch.ao` int8 model on a GPU | the CPU, or torchao |
# | no speed-up from int8 | tiny model; time outside Linear; no VNNI/AMX | larger batch; compile |
# | torchao quantized nothing | a shape the kernel refuses (int4 group size) | check weight types (labkit raises) |

# %% [markdown]
# ## Going further
# - **bitsandbytes.** `int8_bnb` is LLM.int8(); `nf4_bnb` is QLoRA's 4-bit NormalFloat (notebook 08). Both
#   target GPUs; on a CPU a slow fallback needs 32k outputs, so the 10-class head stays float.
# - **PT2E to int8 kernels:** `torch.compile(int8_graph)`; QAT by PT2E: `quantization.prepare_qat_pt2e`.
# - **GPTQ and AWQ** choose 4-bit weight rounding from calibration data; **SmoothQuant** moves activation
#   outliers into the weights; **fp8** (H100 and later) is in torchao too.
# - Colab and Kaggle preinstall their own torchao (the first cell prints its version).

# %% [markdown]
# ## Summary
# - Affine quantization: `q = clamp(round(w / s) + z)`, `w ≈ (q - z) s`; the error is at most half a step.
# - Sizes are exact everywhere; speed depends on kernels: int8 on CPUs, fp16/bf16 on GPUs.
# - int8 dynamic quantizes Linear layers only: a transformer shrinks to under a third (its embeddings stay
#   float), a CNN barely; static int8 and QAT quantize convolutions too.
# - fp16 and `torch.ao`'s int8 dynamic do not stack; torchao's weight-only int8 runs on a 16-bit model.
# - When accuracy drops, keep the first, last and LayerNorm layers in float; QAT helps where PTQ loses.
# - torchao's `quantize_` and PT2E are the current APIs; `torch.ao.quantization` is deprecated.

# %% [markdown]
# ## Further reading
# - Jacob et al. 2018, *Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
#   Inference*: https://arxiv.org/abs/1712.05877
# - Nagel et al. 2021, *A White Paper on Neural Network Quantization*: https://arxiv.org/abs/2106.08295
# - Dettmers et al. 2022, *LLM.int8()*: https://arxiv.org/abs/2208.07339 and 2023, *QLoRA*:
#   https://arxiv.org/abs/2305.14314
# - torchao quantization overview: https://docs.pytorch.org/ao/stable/quantization_overview.html
# - PyTorch, *Quantization* (the deprecated `torch.ao` API): https://docs.pytorch.org/docs/stable/quantization.html

# %% [markdown]
# ## Exercises
# The first asks for code: per-channel symmetric int8 by hand, checked against `torch.quantize_per_channel`.

# %%
print(exercises.question("06.per_channel"))


# %%
def per_channel_int8(weight):
    """Return (q, scale): int8 integers of weight's shape and one scale per output channel (dim 0)."""
    raise NotImplementedError  # YOUR CODE


exercises.check("06.per_channel", per_channel_int8)

# %% [markdown]
# The next one uses **your own** table: `tiny_vit`'s share of parameters in Linear layers, and what int8
# dynamic did to its file. After answering: why did the file keep a little more than your estimate?

# %%
mine = table.own_size_numbers(vit_cfg.model)
print(exercises.question("06.own_size", mine))

# %%
answer = None  # YOUR CODE: a fraction, 0..1
exercises.check("06.own_size", answer, mine)

# %%
print(exercises.question("06.nf4_bytes"))

# %%
answer = None  # YOUR CODE: GB
exercises.check("06.nf4_bytes", answer)

# %% [markdown]
# # Pruning: why zeros alone change nothing, and how to make pruning real
#
# A claim common in forum threads on pruning: "I pruned 80 % of the weights by magnitude, and the model got
# no smaller and no faster; accuracy even went up." This notebook reproduces it, explains it, and then makes
# pruning pay: sparse storage, 2:4 sparsity, a sensitivity scan, and structured pruning, which builds a
# smaller dense model that is really faster.
#
# **You will learn**
# 1. magnitude pruning in plain PyTorch, checked equal to `torch.nn.utils.prune`; layer-wise vs global;
# 2. why zeros stored densely leave size, memory and latency unchanged (and masks make the checkpoint
#    *larger*); when COO/CSR storage pays; what 2:4 sparsity needs;
# 3. a sensitivity scan on the validation split, and per-layer ratios chosen from it;
# 4. structured pruning by hand and for every layer, before and after a recovery fine-tune;
# 5. how to tell whether "accuracy rose after pruning" is real: repeats over seeds.
#
# **What you need:** notebook 00 (how labkit measures time and memory). A CPU is fine except for the 2:4
# speed measurement in section 2, which needs an Ampere or newer GPU (A100, L4, H100; not a T4) and
# elsewhere says why it did not run. Latencies are this machine's; each finding calls a difference real
# only outside the spread it measured.

# %%
import labkit
from labkit import display, guesses, plots, views
from labkit.labs import pruning as lab  # this notebook's experiments and findings
from labkit.labs.pruning import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import pruning
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
labkit.env_report()

# %% [markdown]
# ## 1. The puzzle
# Every section prunes one fine-tuned model: notebook 00's baseline, trained once, then read from labkit's
# cache (`lab.fine_tuned`).

# %%
cfg = labkit.config.baseline(P)
model, result = lab.fine_tuned(cfg)
x = lab.example_batch(cfg)  # 64 test images, as the model sees them
print(f"{cfg.model} fine-tuned for {result.steps} steps: test accuracy {result.accuracy:.1%}, "
      f"{result.num_params:,} parameters")

# %% [markdown]
# **The mechanism.** Magnitude (L1) pruning keeps the weights with the largest absolute values. For one
# layer and a fraction `amount`, the `k = round(amount x numel)` smallest magnitudes go; `kthvalue(k)` is
# the largest of them. `torch.nn.utils.prune` keeps the result as a mask: it adds `weight_orig` (a
# parameter), `weight_mask` (a buffer) and a hook that recomputes `weight = weight_orig * weight_mask`
# before every forward. `prune.remove` makes it permanent: the zeros move into `weight`, the extras go.

# %%
import copy

import torch
import torch.nn.utils.prune as prune


def l1_mask(weight, amount):
    k = round(amount * weight.numel())  # how many weights go
    if k == 0:
        return torch.ones_like(weight, dtype=torch.bool)
    threshold = weight.abs().flatten().kthvalue(k).values  # the k-th smallest magnitude
    return weight.abs() > threshold  # True: keep


# %%
name = lab.largest_layer(model)
layer = copy.deepcopy(model.get_submodule(name))  # the largest conv of the fine-tuned model
mask = l1_mask(layer.weight.detach(), 0.5)
prune.l1_unstructured(layer, "weight", amount=0.5)  # torch's: weight_orig, weight_mask and a hook
same = torch.equal(mask, layer.weight_mask.bool())
prune.remove(layer, "weight")  # permanent: the zeros are in weight now, the mask is gone
print(f"{name}: {(layer.weight == 0).float().mean():.0%} of its weights are zero; your mask is torch's: {same}")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the plain mask is torch's, and labkit's l1_unstructured prunes every layer the same way
assert same and not hasattr(layer, "weight_orig")
engine = pruning.l1_unstructured(copy.deepcopy(model), 0.5)
for layer_name, module in pruning.prunable_layers(engine):
    expected = l1_mask(model.get_submodule(layer_name).weight.detach(), 0.5)
    assert int(((module.weight != 0) ^ expected).sum()) <= 2, layer_name  # a tie at the threshold may go either way
assert abs(pruning.sparsity(engine).overall - 0.5) < 0.01

# %% [markdown]
# `scope="layer"` takes the same share from every layer; `scope="global"` takes one threshold for all, so
# layers with small weights lose more. Zeros per layer at 80 % overall:

# %%
lab.per_layer_sparsity(model, 0.8)

# %% [markdown]
# **Predict first.** Pruned globally to 80 % zeros, what fraction (0..1) of the unpruned model's file size
# will the saved file be? And the latency at batch 64, as a multiple of the unpruned model's?

# %%
guess_size_fraction = None  # YOUR GUESS: file size at 80 % zeros / unpruned, e.g. 0.3
guess_latency_ratio = None  # YOUR GUESS: latency at 80 % zeros / unpruned, e.g. 0.5

# %%
puzzle = lab.puzzle(cfg)  # global L1 pruning at 0, 20, 40, 60, 80 %
top = puzzle.iloc[-1]
print(guesses.versus(guess_size_fraction, top.size_ratio, "file size at 80 % zeros / unpruned"))
print(guesses.versus(guess_latency_ratio, top.latency_ratio, "latency at 80 % zeros / unpruned"))
plots.lines(puzzle, x="amount", ys=["model_size_bytes", "inference_peak_bytes", "latency_s", "test_accuracy"]);

# %%
puzzle  # the table, and what moved

# %% jupyter={"source_hidden": true} tags=["check"]
# check: zeros stored densely change neither the file nor the memory; the masks make the file larger
assert (puzzle.model_size_bytes == puzzle.model_size_bytes[0]).all()
# equal on a CPU; on a GPU the convolutions' workspaces may differ by a little from one model to the next
peak = puzzle.inference_peak_bytes
assert ((peak - peak[0]).abs() <= 0.05 * peak[0]).all()
assert (puzzle.size_with_masks_bytes > 1.5 * puzzle.model_size_bytes).all()
assert ((puzzle.sparsity - puzzle.amount).abs() < 0.01).all()
assert (puzzle.nonzero_params.diff().dropna() < 0).all()

# %% [markdown]
# **Why nothing moved.** A pruned weight is a `0.0` in the same dense tensor: the file stores it in 4
# bytes, the forward allocates the same activations, and a dense convolution does the same arithmetic.
# With the masks attached the file holds `weight_orig` *and* `weight_mask`, about twice the size. The
# models were timed in turns, and the line compares their latencies with the dense model's noise: the
# 10th-90th percentile spread of its single calls, and a copy of it timed in the same turns. Dense kernels
# skip no zeros, so a ratio outside it is the machine: other work changing its pace (run the cell again),
# or multiplying zeros drawing less power, letting a power-limited chip clock a few percent higher, far from
# the 5x fewer nonzeros. Only accuracy really moves; whether a *rise* is real is section 5's question.

# %% [markdown]
# ## 2. Sparse storage and 2:4
# `weight.to_sparse()` stores only the nonzeros, in COO format: each keeps its value and one int64 index per
# dimension, 4 + 4 x 8 = 36 bytes for a float32 conv weight against 4 bytes dense. CSR (a matrix: one column
# index per nonzero and a pointer per row) needs 12 bytes per nonzero. Measured on the largest weight, with
# its im2col matrix multiply dense and as CSR, timed in turns:

# %%
storage = lab.sparse_storage(cfg)
fig, (left, right) = plots.grid(2)
plots.line(storage.long("bytes"), x="sparsity", y="weight_bytes", hue="layout", ax=left)
plots.line(storage.long("time"), x="sparsity", y="matmul_s", hue="layout", ax=right)
fig.tight_layout()

# %%
storage

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the byte counts follow the formats' arithmetic (exact, on any machine)
s = storage.set_index("sparsity")
numel = int(s.dense_bytes.iloc[0] / 4)
assert (s.dense_bytes == 4 * numel).all()
assert ((s.coo_bytes - (4 + 8 * 4) * numel * (1 - s.index)).abs() <= 0.001 * 36 * numel).all()
assert s.coo_bytes.iloc[-1] < s.dense_bytes.iloc[-1] < s.coo_bytes[s.index < 0.85].min()

# %% [markdown]
# Sparse *speed* is another matter: a CSR multiply reads memory irregularly, so on a CPU it beats the dense
# kernel beyond its call-to-call spread only at high sparsity, if at all. Sparse hardware wants a fixed
# pattern: **2:4 semi-structured sparsity** keeps 2 of every 4 consecutive weights, which Ampere and newer
# GPUs run on sparse tensor cores (`torch.sparse.to_sparse_semi_structured`, fp16/bf16) at up to twice the
# dense math throughput (Mishra et al. 2021, https://arxiv.org/abs/2104.08378), a ceiling whole layers
# reach only in part. Its accuracy cost is measured on any machine, its speed only on such a GPU:

# %%
semi = lab.semi_structured(cfg)
print(semi)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: 2:4 zeroes exactly half of each layer it applies to, and says why when it cannot time it
assert semi.layers and 0 < semi.sparsity <= 0.5 + 1e-6
assert (semi.speedup is None) != (semi.reason is None)

# %% [markdown]
# ## 3. Sensitivity scan
# Layers differ in how much pruning they tolerate. The scan prunes one layer at a time, at 30 to 90 %, and
# measures accuracy on the **validation** split: choices made on the test split would overstate its
# accuracy, so it is kept for the final comparison.

# %%
scan = lab.sensitivity_scan(cfg)
plots.line(scan, x="sparsity", y="val_accuracy", hue="layer");

# %% [markdown]
# Each layer then gets the highest sparsity costing it at most 2 points of validation accuracy, compared on
# the test split with one uniform ratio and with global pruning, at the same overall share:

# %%
ratios = scan.ratios(max_drop=0.02)  # layer -> the highest sparsity costing it at most 2 points
compared = lab.compare_ratios(cfg, ratios)
compared

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the scan covers every prunable layer on the validation split; the schemes prune the same share
assert set(scan.layer) == {n for n, _ in pruning.prunable_layers(model)}
assert (scan.base_val_accuracy - lab.accuracy(model, cfg, "val")).abs().max() <= 1 / P.val_size  # GPU: one image
c = compared.set_index("scheme")
assert c.sparsity.drop("unpruned").max() - c.sparsity.drop("unpruned").min() < 0.01

# %% [markdown]
# The line says which of three outcomes happened: the scan's ratios won, the uniform ratio won, or the
# difference is within the test split's noise, common at moderate sparsity. A one-layer-at-a-time scan
# misses how layers interact when pruned together: a good start, not the optimum. Global pruning adapts to
# the weights' scale by itself and is often as good. Either way the zeros are still stored densely.
#
# ## 4. Structured pruning: a smaller dense model
# Removing an output channel of a conv removes a filter, its BatchNorm entry and the matching input channel
# of the next conv: a smaller dense model, faster on any hardware. **The mechanism** on one pair of layers,
# keeping the half of the stem's channels with the largest filter L1 norms:

# %%
from torch import nn


def prune_conv_pair(conv, bn, next_conv, keep):
    """Keep output channels `keep` of conv (and its BatchNorm) and the same input channels of next_conv."""
    new_conv = nn.Conv2d(conv.in_channels, len(keep), conv.kernel_size, conv.stride, conv.padding, bias=False)
    new_conv.weight.data = conv.weight.data[keep].clone()
    new_bn = nn.BatchNorm2d(len(keep))
    for name in ("weight", "bias", "running_mean", "running_var"):
        getattr(new_bn, name).data = getattr(bn, name).data[keep].clone()
    new_next = nn.Conv2d(len(keep), next_conv.out_channels, next_conv.kernel_size, next_conv.stride,
                         next_conv.padding, bias=False)
    new_next.weight.data = next_conv.weight.data[:, keep].clone()
    return new_conv, new_bn, new_next


# %%
mine = labkit.models.build("small_cnn", 10)[0].eval()  # a small_cnn with labkit's pretrained weights
x_small = torch.randn(16, 3, 32, 32)
norms = mine.stem[0].weight.detach().abs().sum(dim=(1, 2, 3))  # L1 norm of each output channel's filter
keep = norms.argsort(descending=True)[: mine.stem[0].out_channels // 2].sort().values
engine = pruning.prune_channels(mine, {"stem.0": 0.5}, x_small[:2]).eval()
mine.stem[0], mine.stem[1], mine.block1[0][0] = prune_conv_pair(mine.stem[0], mine.stem[1], mine.block1[0][0], keep)
mine.eval()  # the new layers start in training mode, as every new nn.Module does
with torch.no_grad():
    diff = (mine(x_small) - engine(x_small)).abs().max().item()
print(f"stem: {engine.stem[0].out_channels} channels kept of {len(norms)}; max difference from labkit's: {diff:.1e}")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the pair pruned by hand is labkit's prune_channels, layer for layer and output for output
assert diff < 1e-5
for a, b in zip(mine.parameters(), engine.parameters(), strict=True):
    assert a.shape == b.shape and torch.equal(a, b)

# %% [markdown]
# labkit's `prune_channels(model, amount, example_inputs)` does this for every conv whose channels flow into
# exactly one other layer through channel-wise layers only (BatchNorm, ReLU, pooling), found on a `torch.fx`
# trace; a conv feeding a residual addition keeps its channels (see Going further).
#
# **Predict first.** With half the channels of every prunable conv removed, what fraction (0..1) of the
# parameters will be left? And of the CPU latency at batch 64?

# %%
guess_param_fraction = None  # YOUR GUESS: parameters after / before, e.g. 0.5
guess_latency_fraction = None  # YOUR GUESS: CPU latency after / before, e.g. 0.5

# %%
structured = lab.structured(cfg, amount=0.5)  # prune; re-estimate BatchNorm; recovery fine-tune
pruned = structured.set_index("model").loc["pruned"]
print(guesses.versus(guess_param_fraction, pruned.num_params_ratio, "parameters after / before"))
print(guesses.versus(guess_latency_fraction, pruned.cpu_latency_s_ratio, "CPU latency after / before"))
plots.bars(structured, x="model", ys=["num_params", "flops", "cpu_latency_s", "test_accuracy"]);

# %%
structured

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the pruned model is really smaller and faster, and recovery does not make it worse
s = structured.set_index("model")
assert s.num_params_ratio["pruned"] <= 1 / 1.9 and s.flops_ratio["pruned"] < 0.6
assert s.model_size_bytes_ratio["pruned"] < 0.6 and s.cpu_latency_s_ratio["pruned"] < 1
recovered, before = (labkit.measure.Measured.accuracy(s.test_accuracy[m], P.test_size)
                     for m in ("pruned + recovery", "pruned"))
recovery = labkit.measure.compare(recovered, before)
assert recovery.real is not None and recovery.direction != -1  # not lower beyond the test noise

# %% [markdown]
# Parameters fall faster than channels: a conv between two pruned layers loses half its inputs *and* half
# its outputs, so a quarter of its weights remain. Latency falls less than FLOPs: a small model also pays
# fixed costs per layer (kernel launches, moving activations), and on a GPU may not get faster at all. On a
# CPU the two latency columns are one measurement; on a GPU the second times CPU copies.
#
# Right after pruning, accuracy drops: the removed channels carried information, and each BatchNorm after a
# pruned conv still uses the unpruned network's statistics. `pruning.recalibrate_batchnorm(model, batches)`
# cheaply re-estimates those with a few forward passes (the third row); the recovery fine-tune fixes both.
# The line says whether accuracy came back within the test split's noise, or how far below it stayed (more
# steps or a smaller amount close the gap).

# %% [markdown]
# Published figures for scale (pruning in the papers and 2:4 sparsity on an A100; measured elsewhere, not here):

# %%
display.table(labkit.results.published("04_pruning-params*", "04_pruning-semi*"))

# %% [markdown]
# ## 5. Did accuracy really rise?
# The claim's rise was seen once. Light pruning zeroes weights that barely mattered, changing a handful of
# predictions either way, within one run's noise. Repeating the fine-tune with other seeds, and pruning
# each, tells chance from effect:

# %%
repeats = lab.repeats(cfg)  # one fine-tune per random seed, each pruned at 20, 40, 60, 80 %
repeats

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every seed x amount ran, and the images gained and lost add up to each change in accuracy
runs = repeats.runs  # one row per seed and amount
assert runs.seed.nunique() >= 2 and len(runs) == runs.seed.nunique() * 4
assert ((runs.gained - runs.lost) / P.test_size - runs.delta).abs().max() < 1e-6

# %% [markdown]
# `gained` and `lost` count the test images the pruned models get right that their unpruned ones got
# wrong, and the reverse: a rise of a few tenths of a point is a few images, about as many lost. The
# line calls the best mean rise possibly real only when the change lies above zero with every random seed
# (the spread of the changes) and beyond the test split's noise; otherwise it is chance.
#
# ## 6. Your turn: the panel
# Choose the method (unstructured: zeros; structured: channels removed), the amount, the recovery steps and
# the fine-tuned model's seed, and press **Run**: each run adds a point to both charts.

# %%
panel = ExperimentPanel(
    run=lab.panel_run, controls={"seed": [0, 1, 2]},
    options={"method": list(lab.METHODS), "amount": [0.2, 0.5, 0.8],
             "recovery_steps": (0, P.max_steps, max(P.max_steps // 4, P.warmup_steps + 3))},
    base=cfg, show=views.Trend("params_removed", ("test_accuracy", "latency_s"), hue="method"),
    estimate=lab.panel_estimate, title="Pruning")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | memory and file size unchanged | zeros stored densely | remove channels; sparse storage if very sparse |
# | the checkpoint got larger | masks still attached | `prune.remove` before saving |
# | no speed-up at 80 % sparsity | dense kernels multiply zeros too | remove channels, or 2:4 on an Ampere+ GPU |
# | accuracy collapses at modest sparsity | a sensitive layer pruned hard | a sensitivity scan; per-layer ratios |
# | accuracy near chance after removing channels | stale BatchNorm statistics | `recalibrate_batchnorm`, then recover |
# | "accuracy rose after pruning" | one run's noise | repeat over seeds, compare with the spread |
# | ratios chosen on the test split | optimistic test accuracy | choose on validation, report on test |
# | a pruned ResNet fails with a shape error | a conv feeding an addition lost channels | a dependency-graph tool |

# %% [markdown]
# ## Going further
# **Residual additions.** A conv that feeds an addition (ResNet) or a concatenation (ShuffleNet) can only
# lose channels together with every layer on the other side; dependency-graph tools such as torch-pruning
# (`DepGraph`, Fang et al. 2023) group those layers, transformers included. How many convs each
# model lets `prune_channels` prune:

# %%
for name in ("small_cnn", "resnet18", "shufflenet_v2_x0_5"):
    built = labkit.models.build(name, 10, pretrained=False)[0]
    convs = [m for m in built.modules() if isinstance(m, nn.Conv2d)]
    chains = pruning.channel_chains(built)
    print(f"{name}: {len(chains)} of its {len(convs)} convs can lose channels ({chains[0].name}, ...)")

# %% [markdown]
# - **Iterative pruning**: prune a little, fine-tune, repeat: higher sparsity at the same accuracy
#   (Han et al. 2015). **Movement pruning** ranks weights by how they move during fine-tuning (Sanh et al. 2020).
# - **The lottery ticket hypothesis**: a sparse subnetwork, rewound to its early weights, trains to full
#   accuracy on its own (Frankle and Carbin 2019).
# - **2:4 training**: torchao trains with 2:4 sparse weights on Ampere+ GPUs, at less accuracy cost.

# %% [markdown]
# ## Summary
# - Magnitude pruning is a mask from a `kthvalue` threshold, per layer or global; in PyTorch
#   `prune.l1_unstructured`, then `prune.remove`.
# - Zeros stored densely change nothing but accuracy, and the masks double the checkpoint until
#   `prune.remove`.
# - Sparse formats pay only at high sparsity (COO: from about 89 % zeros); Ampere+ GPUs accelerate 2:4.
# - Choose per-layer ratios from a sensitivity scan on the validation split.
# - Structured pruning removes channels: a smaller dense model, faster on any hardware, after a recovery
#   fine-tune.
# - A rise in accuracy after pruning is real only if it survives repeats over seeds.

# %% [markdown]
# ## Further reading
# - Han et al. 2015, *Learning both Weights and Connections for Efficient Neural Networks*:
#   https://arxiv.org/abs/1506.02626
# - Li et al. 2017, *Pruning Filters for Efficient ConvNets* (filter L1 norms): https://arxiv.org/abs/1608.08710
# - Blalock et al. 2020, *What is the State of Neural Network Pruning?*: https://arxiv.org/abs/2003.03033
# - Frankle and Carbin 2019, *The Lottery Ticket Hypothesis*: https://arxiv.org/abs/1803.03635
# - PyTorch tutorial, *Pruning*: https://pytorch.org/tutorials/intermediate/pruning_tutorial.html
# - PyTorch tutorial, *Accelerating BERT with semi-structured (2:4) sparsity*:
#   https://pytorch.org/tutorials/advanced/semi_structured_sparse.html
# - Fang et al. 2023, *DepGraph: Towards Any Structural Pruning* (torch-pruning): https://arxiv.org/abs/2301.12900

# %% [markdown]
# ## Exercises
# The first asks for code: global magnitude pruning by hand, one threshold for the whole model, checked
# against `torch.nn.utils.prune.global_unstructured`'s masks.

# %%
print(exercises.question("04.global"))


# %%
def my_global_masks(model, amount):
    """Return {layer name: bool mask} for every Conv2d and Linear layer of model."""
    raise NotImplementedError  # YOUR CODE


exercises.check("04.global", my_global_masks)

# %% [markdown]
# The next one uses **your own** structured pruning: the conv whose channels shrank most. The line under the
# check gives the FLOP counter's measurement. Why did the model's total FLOPs fall by less than this
# layer's?

# %%
slim = pruning.prune_channels(model, 0.5, x[:2])
flops = lab.own_flops(model, slim, x)  # the conv whose in x out channels shrank most
mine = flops.numbers
print(exercises.question("04.own_flops", mine))

# %%
answer = None  # YOUR CODE: a fraction
exercises.check("04.own_flops", answer, mine)
print(flops.finding())

# %%
print(exercises.question("04.coo_break_even"))

# %%
answer = None  # YOUR CODE: a sparsity, 0..1
exercises.check("04.coo_break_even", answer)

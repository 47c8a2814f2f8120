# %% [markdown]
# # Memory savers: gradient checkpointing and 8-bit optimizers
#
# When a fine-tune does not fit, two techniques attack the two big parts of training memory that mixed
# precision leaves alone. **Gradient checkpointing** stores fewer activations and recomputes the rest
# during the backward pass: memory for time. **8-bit optimizers** store AdamW's two moments in one byte
# each instead of four. This notebook measures both, counts bytes per parameter for models up to 175B,
# and stacks the savers one by one.
#
# **You will learn**
# 1. the bytes-per-parameter accounting of training, checked against a measured step and applied to large models;
# 2. `checkpoint(block, x, use_reentrant=False)`, how checkpointing trades step time for activation memory (the
#    sqrt(n) rule), why the *peak* can fall less, and selective checkpointing;
# 3. the one-line swap to bitsandbytes' `AdamW8bit`, and why small tensors keep 32-bit state;
# 4. the savers stacked one by one, on a CNN and on a language model.
#
# **What you need:** notebooks 00 (memory by category) and 01 (mixed precision). A CPU is fine: memory is
# counted exactly there, and bitsandbytes 0.50+ runs its 8-bit optimizers on a CPU (paged ones need CUDA). Step
# times are this machine's, and a verdict calls one changed only beyond its measured spread.

# %%
import labkit
from labkit import display, guesses, plots, views
from labkit.labs import memory_savers as lab  # this notebook's experiments and findings
from labkit.labs.memory_savers import exercises  # this notebook's exercises: question, check, solution
from labkit.runsetup import set_up
from labkit.techniques import checkpointing
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
labkit.env_report()

# %% [markdown]
# ## 1. Where the bytes go
# Training keeps, per parameter: the **weights**, a **gradient**, and the **optimizer state** (AdamW:
# two moments, 8 bytes in fp32; SGD with momentum: 4; 8-bit AdamW: about 2). Half-precision weights add
# an fp32 **master copy** (4 bytes): ZeRO's count for mixed-precision Adam is 2 + 2 + 12 = 16 bytes per
# parameter. (PyTorch's autocast keeps fp32 weights: 4 + 4 + 8.) Then come
# the **activations**, which depend on the batch, not on the parameter count $N$.
#
# $$\text{fixed bytes} = N \times (b_{\text{weights}} + b_{\text{grads}} + b_{\text{optimizer}} + b_{\text{master}})$$
#
# `labkit.training_memory` does this accounting. First, on this notebook's model, against a measured step:

# %%
cfg = labkit.config.baseline(P)
check = lab.calculator_check(cfg)
check

# %% jupyter={"source_hidden": true} tags=["check"]
# within 1 %, plus the CUDA allocator's rounding of every tensor up to a multiple of 512 bytes
assert (check.difference_bytes.abs() <= 0.01 * check.measured_bytes + check.rounding_bytes).all(), "calculator"
check8 = lab.calculator_check(cfg.replace(optimizer="adamw8bit"))
assert (check8.difference_bytes.abs() <= 0.01 * check8.measured_bytes + check8.rounding_bytes).all()

# %% [markdown]
# The same arithmetic for a 7B model (pass other sizes, e.g. `{"175B": 175e9}`, to see theirs):

# %%
lab.scale_table({"7B": 7e9})

# %% [markdown]
# A figure from blog posts and slides on 8-bit optimizers: *"8-bit Adam cuts a 175B
# model's optimizer memory from 1.2 TB to 0.3 TB."* AdamW's two fp32 moments are 8 bytes per parameter;
# 8-bit AdamW's are 2 bytes plus one fp32 scale per 256 values of each moment, 2.03 bytes. The next cell
# computes both in TB ($10^{12}$ bytes) and TiB ($2^{40}$), and with the fp32 master weights that ZeRO
# counts as optimizer state, and says which reading gives the claim's numbers:

# %%
print(lab.optimizer_claim(175e9, (1.2, 0.3)))

# %% [markdown]
# ## 2. Gradient checkpointing
# Checkpointing splits the model's blocks into **segments**, keeps only each segment's input for the
# backward pass, and reruns the segment's forward there. labkit wraps the blocks with
# `torch.utils.checkpoint` (`use_reentrant=False`): `RunConfig(checkpointing=True)` makes every block its
# own segment, `checkpointing=k` groups them into $k$ segments. For $n$ equal blocks that each store one
# tensor the size of their input, stored memory is about
# $\underbrace{k}_{\text{segment inputs}} + \underbrace{n/k}_{\text{one segment recomputed}}$
# such tensors, smallest at $k = \sqrt{n}$ (Chen et al., 2016); the price is one extra forward pass,
# about a third more FLOPs. Real blocks store several tensors each and differ in size, so the optimum can
# differ; labkit's cost model (below) uses the bytes each block really stores.

# %% [markdown]
# **The mechanism.** Checkpointing in your own forward is one line per block. Below, the notebook's model
# runs its blocks under `checkpoint`; the check compares it with labkit's `RunConfig(checkpointing=True)`
# and with the plain model: same loss, same gradients. One thing differs, printed: how many batches each
# model's BatchNorm layers have counted.

# %%
import copy

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(model, x):
    stages = dict(labkit.models.named_stages(model))
    for name in checkpointing.checkpoint_blocks(model):  # stem, blocks: every stage but the head
        x = checkpoint(stages[name], x, use_reentrant=False)  # keep x; recompute the block in backward
    return labkit.models.forward_head(model, x)


# %%
s = set_up(cfg.replace(pretrained=False, tf32=False))  # TF32's rounding would blur the comparison on an Ampere GPU
plain, batch = s.model, s.batch(16)  # the loop's seeded model and first batch
x, y = batch.images, batch.labels
mine, engine = copy.deepcopy(plain), checkpointing.apply_checkpointing(copy.deepcopy(plain), True)
runs = {"plain": (plain, plain), "yours": (mine, lambda t: checkpointed_forward(mine, t)), "labkit": (engine, engine)}
losses = {name: F.cross_entropy(forward(x), y) for name, (_, forward) in runs.items()}
for loss in losses.values():
    loss.backward()
counted = {name: next((int(b) for n, b in m.named_buffers() if n.endswith("num_batches_tracked")), 0)
           for name, (m, _) in runs.items()}  # batches the first BatchNorm layer has counted
print(f"losses {[f'{v.item():.6f}' for v in losses.values()]}; BatchNorm batches counted: {counted}")

# %% jupyter={"source_hidden": true} tags=["check"]
# the same gradients, up to the GPU's non-deterministic kernels
for other in (mine, engine):
    for a, b in zip(plain.parameters(), other.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-5)
if labkit.models.has_batchnorm(plain):
    assert counted["labkit"] == counted["plain"] == 1 and counted["yours"] == 2

# %% [markdown]
# Your version's BatchNorm layers counted the batch twice: the recomputation ran their forward again in
# training mode and updated the running statistics again, so the model drifts from the unchecked one over
# a fine-tune. labkit gives the recomputation scratch copies of the statistics. With LayerNorm
# (transformers) the one-liner is all there is.
#
# **Predict first.** The trade-off below checkpoints ever more segments. With every block checkpointed,
# what will the step's **peak** memory be as a fraction of the unchecked step's (0..1)? And the
# activations alone?

# %%
guess_peak_fraction = None  # YOUR GUESS: peak with every block checkpointed / peak without, e.g. 0.6
guess_activation_fraction = None  # YOUR GUESS: the same for the activations alone

# %%
for k in (1, 2, True):
    print(f"checkpointing={k!r}: segments {checkpointing.checkpoint_segments(cfg.model, k)}")
tradeoff = lab.checkpoint_tradeoff(cfg)
every = tradeoff.frame[tradeoff.frame.error.isna()].iloc[-1]  # every block its own segment
print(guesses.versus(guess_peak_fraction, every.peak_ratio, "peak, every block checkpointed / none"))
print(guesses.versus(guess_activation_fraction, every.activation_ratio, "activations, every block checkpointed / none"))
plots.checkpoint_tradeoff(tradeoff.frame);

# %%
tradeoff

# %% jupyter={"source_hidden": true} tags=["check"]
# check: checkpointing stores fewer activations, costs FLOPs, and learns the same
ok = tradeoff[tradeoff.error.isna()].set_index("segments")
assert len(ok) == len(checkpointing.checkpoint_blocks(cfg.model)) + 1
assert ok.mem_activations_bytes.iloc[1:].min() < ok.mem_activations_bytes[0], "fewer activations stored"
assert (ok.flops_ratio.iloc[1:] > 1.1).all(), "the recomputed forward costs FLOPs"
# checkpointing must not change what the model learns: exactly equal on a CPU; GPU kernels are not
# bitwise deterministic, and their rounding differences grow over training like a change of seed
assert ok.accuracy.max() - ok.accuracy.min() <= labkit.measure.accuracy_noise(ok.accuracy.mean(), P.test_size)

# %% [markdown]
# Left: the memory side (dashed: the cost model's prediction); right: the trade, one point per segment
# count, further left faster, lower smaller. Blog posts on checkpointing often promise *"over 40 % memory
# saved"*. That is often true of the activations, rarely of a small model's peak: the peak moves into the
# backward pass, where a recomputed block's activations and their gradients are alive together, and no
# grouping of whole blocks into segments splits a block. Models with many equal blocks (transformers)
# come much closer to the textbook curve, and there the sqrt(n) rule's choice gives the lowest peak.

# %% [markdown]
# **The next step: selective checkpointing.** Recomputing a whole segment repeats its costly matrix
# multiplies. A policy chooses per operation what to save: below, it saves the matrix multiplies'
# outputs and recomputes the rest (activations, normalisation), on a stack of transformer-style MLP
# blocks, in plain PyTorch (`torch.utils.checkpoint`, 2.4+):

# %%
import functools

from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

SAVE = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}  # the costly ops: keep their outputs


def policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def selective(block, x):
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    return checkpoint(block, x, use_reentrant=False, context_fn=context)


# %%
variants = lab.checkpoint_variants({"no checkpointing": lambda block, x: block(x),
                                    "full checkpointing": lambda block, x: checkpoint(block, x, use_reentrant=False),
                                    "selective (save matmuls)": selective})
variants

# %% jupyter={"source_hidden": true} tags=["check"]
# check: selective checkpointing sits between none and full, with no extra FLOPs
v = variants.frame.set_index("variant")
assert (v.max_grad_diff < 1e-5).all(), "every variant computes the same gradients"
stored = v.activation_bytes
assert stored["full checkpointing"] < stored["selective (save matmuls)"] < stored["no checkpointing"]
assert v.flops["selective (save matmuls)"] == v.flops["no checkpointing"] < v.flops["full checkpointing"]

# %% [markdown]
# Selective checkpointing stores less than the plain forward and recomputes no matrix multiply (the same
# FLOPs); full checkpointing stores least and recomputes part of each block's forward (torch stops once
# the tensors the backward needs exist again, so a block's last matrix multiply is not rerun). FLOPs are
# counted exactly; times depend on the machine: the policy runs in Python for every operation, which can
# make selective checkpointing slower than full on a CPU or with small blocks.

# %% [markdown]
# ## 3. 8-bit optimizers
# bitsandbytes' `AdamW8bit` keeps each moment as 1 byte per value, quantised in blocks of 256 values with
# one fp32 scale per block, and dequantises on the fly in `step()`. Version 0.50 runs it on the CPU too:
# the real optimizer, not a simulation. Tensors with fewer than `min_8bit_size` (4096) elements keep fp32
# state: the saving is not worth the error there.

# %% [markdown]
# **The mechanism.** In your own loop the 8-bit optimizer is a one-line swap; the check compares it with
# what labkit builds for `RunConfig(optimizer="adamw8bit")`, after one step from the same weights. Pass
# `weight_decay` explicitly: `torch.optim.AdamW` and `bnb.optim.AdamW8bit` default to 0.01, `RunConfig`
# to 0.

# %%
import bitsandbytes as bnb

model = copy.deepcopy(plain)  # the model of section 2, any model will do
# instead of torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay):
optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the one-line swap builds the optimizer labkit builds, and steps the same
engine_model = copy.deepcopy(plain)
engine_optimizer = labkit.techniques.optimizers.build_optimizer(engine_model, "adamw8bit", lr=cfg.lr)
F.cross_entropy(model(x), y).backward()
for p, q in zip(model.parameters(), engine_model.parameters(), strict=True):
    q.grad = p.grad.clone()  # the same gradients into both optimizers
optimizer.step()
engine_optimizer.step()
assert type(optimizer) is type(engine_optimizer)
assert all(torch.equal(a, b) for a, b in zip(model.parameters(), engine_model.parameters(), strict=True))
assert labkit.measure.optimizer_state_bytes(optimizer) == labkit.measure.optimizer_state_bytes(engine_optimizer)

# %% [markdown]
# The state after one step, tensor by tensor (`state`, first rows below) and summed by kind:

# %%
trainer = labkit.train.Trainer(cfg.replace(optimizer="adamw8bit"))
trainer.step(*next(iter(trainer.loader)))
state = lab.optimizer_state_table(trainer.optimizer, trainer.model)
display.table(state.frame.head(6), ["tensor", "numel", "state_dtype", "state_bytes", "bytes_per_param"])

# %%
display.table(state.summary())

# %% [markdown]
# So a model saves less the more of its parameters sit in small tensors (BatchNorm, biases, depthwise
# convolutions), whatever its total size. For each model labkit knows, from its tensor sizes alone
# (compare the share below `min_8bit_size` with the state ratio):

# %%
lab.eight_bit_savings()

# %% [markdown]
# Does it cost accuracy? The same fine-tune with AdamW and with 8-bit AdamW. **Predict first:** the
# 8-bit optimizer's state as a fraction of AdamW's, for this model (0..1)?

# %%
guess_state_fraction = None  # YOUR GUESS: 8-bit AdamW state / AdamW state, e.g. 0.25

# %%
eight = labkit.sweep(cfg, optimizer=["adamw", "adamw8bit"])
by = eight.set_index("optimizer")
fraction = by.mem_optimizer_state_bytes["adamw8bit"] / by.mem_optimizer_state_bytes["adamw"]
print(guesses.versus(guess_state_fraction, fraction, "8-bit AdamW state / AdamW state"))
display.table(eight, ["optimizer", "mem_optimizer_state_bytes", "peak_memory_bytes", "step_time_s", "accuracy"])

# %% jupyter={"source_hidden": true} tags=["check"]
# check: 8-bit state is under half of AdamW's, at about the same accuracy
assert by.mem_optimizer_state_bytes["adamw8bit"] < 0.5 * by.mem_optimizer_state_bytes["adamw"]
assert abs(by.accuracy["adamw8bit"] - by.accuracy["adamw"]) < 0.1

# %% [markdown]
# **Paged optimizers** (`optimizer="paged_adamw8bit"`) put the state in CUDA unified memory, which the
# driver pages out to CPU RAM when the GPU runs short, instead of failing. They need a CUDA GPU; on a CPU
# labkit refuses them rather than quietly running plain `adamw8bit`.

# %% [markdown]
# Published figures for scale (bytes per parameter, from ZeRO and the 8-bit optimizers paper; not measured here):

# %%
display.table(labkit.results.published("03_memory_savers-bytes*"))

# %% [markdown]
# ## 4. The staged view
# Tutorials on memory-efficient training usually give an order of cost: mixed precision first (on a GPU
# with tensor cores usually free or faster; on a CPU without native fp16/bf16 it can be slower, as
# notebook 01 measured), then checkpointing (costs time), then an 8-bit optimizer (a little accuracy
# risk). Each stage below adds one saver to the baseline, the last all three:

# %%
staged = lab.staged_runs(cfg)
print(staged.finding())
plots.memory_breakdown(staged.frame, label="stage")
plots.bar(staged.frame, x="stage", y="step_time_s", reference=labkit.load_reference("03_memory_savers-staged*"));

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every stage ran, and stacking the savers lowered the peak
st = staged.frame.set_index("stage")
assert st.error.isna().all()
assert st.peak_memory_bytes["all together"] < st.peak_memory_bytes["baseline"]
assert st.mem_optimizer_state_bytes["+8-bit optimizer"] < st.mem_optimizer_state_bytes["baseline"]

# %% [markdown]
# Which saver matters depends on where the memory is (the printed line ranks them for this run): where
# activations dominate, as in a small CNN at a useful batch size, AMP and checkpointing shrink the
# activation segment, though the *peak* may follow less (section 2); where the fixed part dominates, as
# in a large language model (section 1), the 8-bit optimizer saves most.

# %% [markdown]
# ## 5. A language model
# The same stages on the profile's Llama on packed real text (`tiny_llama` at `ci`, a 10M one at `quick`,
# SmolLM2-135M's shape at `full`), where checkpointing wraps each decoder layer, transformers' own method.
# **Predict first:** what fraction of the activations does per-layer checkpointing keep?

# %%
guess_lm_activations = None  # YOUR GUESS: e.g. 0.3

# %%
lm_staged = lab.lm_staged()  # baseline, +AMP, +checkpointing, +8-bit AdamW, all together (cached)
by_stage = lm_staged.frame.set_index("stage").mem_activations_bytes
print(guesses.versus(guess_lm_activations, by_stage["+checkpointing"] / by_stage["baseline"], "activations kept"))
lm_staged

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every stage ran; checkpointing kept fewer activations, 8-bit AdamW a smaller state
lm_st = lm_staged.frame.set_index("stage")
assert lm_st.error.isna().all() and lm_st.mem_activations_bytes["+checkpointing"] < by_stage["baseline"]
assert lm_st.mem_optimizer_state_bytes["+8-bit optimizer"] < lm_st.mem_optimizer_state_bytes["baseline"]

# %% [markdown]
# Full fine-tuning's bytes per parameter for the models learners bring to a free GPU (by formula, before
# activations): a T4's 15 GiB stops near half a billion parameters; notebook 08 goes further with LoRA and QLoRA.

# %%
lab.hub_scale_table()

# %% [markdown]
# ## 6. Your turn: the panel
# Choose checkpointing (off, every block, or a number of segments), the optimizer, the precision and the
# batch size, and press **Run**. Each run adds a stacked memory bar and a step-time bar.

# %%
panel = ExperimentPanel(
    run=labkit.results.cached_fit,
    controls={"checkpointing": [False, True, 2, 3], "optimizer": ["adamw", "adamw8bit", "sgd"],
              "precision": ["fp32", "bf16", "fp16"], "batch_size": (16, 256, 16)},
    base=cfg, show=views.History(("memory_breakdown", "step_time_s")), title="Memory savers")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | checkpointing saved activations, not the peak | the peak moved into the backward pass | measure the peak |
# | BatchNorm statistics drift with checkpointing | the recompute updated them twice | guard the recompute |
# | `use_reentrant` warning or wrong gradients | the old reentrant checkpoint | `use_reentrant=False` |
# | 8-bit optimizer saves less than 4x | small tensors keep fp32 state, plus block scales | expected |
# | paged optimizer on a CPU | unified memory is a CUDA feature | `adamw8bit` on a CPU |
# | memory looks unchanged | reading reserved memory / nvidia-smi | allocated peaks (labkit's) |

# %% [markdown]
# ## Going further
# - `torch.autograd.graph.save_on_cpu()` offloads saved activations to CPU memory instead of
#   recomputing them: memory for PCIe bandwidth rather than for FLOPs.
# - DeepSpeed's ZeRO and PyTorch's FSDP shard gradients, optimizer state and weights across GPUs; with
#   ZeRO-Offload the optimizer state moves to CPU memory.
# - `torch.compile` can choose what to recompute automatically (its min-cut partitioner), a form of
#   selective checkpointing without a hand-written policy.

# %% [markdown]
# ## Summary
# - Fixed memory is bytes per parameter x parameters: 16 B for AdamW in fp32, or in mixed precision with
#   master weights (ZeRO's accounting); about 10 B with 8-bit AdamW and master weights.
# - Checkpointing is `x = checkpoint(block, x, use_reentrant=False)` per block: at most one extra forward
#   for activation memory; the peak can fall less than the activations. Selective checkpointing
#   recomputes only the cheap ops.
# - `bnb.optim.AdamW8bit(params, lr=...)` replaces `torch.optim.AdamW`: 8 bytes of Adam state per
#   parameter become 2 (Dettmers et al. 2022, the table above) on large tensors; small ones stay 32-bit.
# - Stack savers in order of cost and measure each stage.

# %% [markdown]
# ## Further reading
# - Chen et al. 2016, *Training Deep Nets with Sublinear Memory Cost* (the sqrt(n) schedule):
#   https://arxiv.org/abs/1604.06174
# - PyTorch, `torch.utils.checkpoint` (non-reentrant checkpointing, selective checkpointing):
#   https://pytorch.org/docs/stable/checkpoint.html
# - PyTorch blog, *Current and New Activation Checkpointing Techniques in PyTorch*:
#   https://pytorch.org/blog/activation-checkpointing-techniques/
# - Dettmers et al. 2022, *8-bit Optimizers via Block-wise Quantization*: https://arxiv.org/abs/2110.02861
# - bitsandbytes, *8-bit optimizers*: https://huggingface.co/docs/bitsandbytes/main/en/optimizers
# - Rajbhandari et al. 2020, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*:
#   https://arxiv.org/abs/1910.02054

# %% [markdown]
# ## Exercises
# The first asks for code: checkpoint a small `nn.Sequential` so that its stored activations fall. The
# checker measures your forward's activations with the same tracker labkit uses.

# %%
print(exercises.question("03.checkpoint"))


# %%
def my_checkpointed_forward(blocks, x):
    """Run the nn.Sequential `blocks` on x with checkpoints."""
    raise NotImplementedError  # YOUR CODE


exercises.check("03.checkpoint", my_checkpointed_forward)

# %% [markdown]
# The next one uses **your own** model's tensor sizes, from section 3. Under the check, your arithmetic
# stands beside the bytes the optimizer really holds: the difference is the two quantisation maps shared
# by all tensors (256 float32 values each) and block counts rounded up to whole blocks. Why does a model
# with more of its parameters in small tensors save less?

# %%
mine = state.numbers()  # your model's tensor sizes, from section 3
print(exercises.question("03.own_8bit", mine))

# %%
answer = None  # YOUR CODE: bytes
exercises.check("03.own_8bit", answer, mine)
print(state.finding())

# %%
print(exercises.question("03.adam_state"))

# %%
answer = None  # YOUR CODE: GB
exercises.check("03.adam_state", answer)

# %%
print(exercises.question("03.eight_bit_bytes"))

# %%
answer = None  # YOUR CODE: bytes per parameter
exercises.check("03.eight_bit_bytes", answer)

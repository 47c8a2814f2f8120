# %% [markdown]
# # LoRA and QLoRA: fine-tune a few small matrices instead of the model
#
# A full fine-tune changes every weight of a pretrained model and keeps, per weight, a gradient and two
# AdamW states. LoRA (low-rank adaptation, Hu et al. 2021) freezes the pretrained weights and learns each
# layer's change as the product of two thin matrices, `B @ A`, of a small rank. A handful of small matrices
# train, the optimizer state shrinks with them, and one copy of the base model serves many tasks, each a
# few hundred kB of adapters. QLoRA (Dettmers et al. 2023) goes further and stores the frozen base in
# 4-bit NormalFloat. This notebook builds the layer from scratch, checks it against PEFT and the paper,
# and measures what rank and targets do to the four numbers.
#
# **You will learn**
# 1. the LoRA layer in plain PyTorch: frozen `W`, `A` (rank x in, Kaiming) and `B` (out x rank, zeros), the
#    `alpha / rank` scale, dropout on the LoRA path, merging for inference; and what the seed's snippet got wrong;
# 2. `add_lora` on any model by layer names, checked against `peft.get_peft_model`: the same trainable
#    parameters, outputs and gradients; the paper's 294,912 for RoBERTa-base, recounted;
# 3. rank 1 to 64 on the attention projection and on every Linear layer against full fine-tuning and head-only:
#    trainable share, optimizer state, activations (LoRA can raise them), step time, accuracy;
# 4. the same code path on a transformers model with PEFT (a hub ViT on Colab/Kaggle, a local one offline);
# 5. QLoRA: a 4-bit NF4 base under bf16 adapters, against a bf16 base; merged against unmerged inference.
#
# **What you need:** notebook 05 (freezing) helps; notebook 06 introduced NF4. A CPU is fine: every section
# runs on it. On a GPU the sweep's step times and QLoRA's memory mean more (bitsandbytes' CPU path is a
# fallback).

# %%
import math

import torch
from torch import nn

import labkit
from labkit import guesses, plots, views
from labkit.labs import lora as lab  # this notebook's experiments and findings
from labkit.labs.lora import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import lora
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
print(lab.library_versions())
labkit.env_report()

# %% [markdown]
# ## 1. The mechanism
# The seed of this lab carried a LoRA layer copied from a blog post. Here it is, as it was:

# %%
print(lab.seed_snippet())  # the source of lab.SeedLoRALayer

# %% [markdown]
# Three things are wrong with it, and running it shows each (the cell below runs the layer; nothing is
# hidden in it but the bookkeeping):

# %%
lab.seed_snippet_problems().style.hide(axis="index")  # styled: the long texts are shown whole

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the seed's layer fails as described, and its square-layer merge is silently wrong
problems = lab.seed_snippet_problems()
assert "AttributeError" in problems["what happens"].iloc[0] and "RuntimeError" in problems["what happens"].iloc[1]
assert "off by" in problems["what happens"].iloc[1]


# %% [markdown]
# The layer the paper describes wraps the pretrained `nn.Linear` (weight `W`, out x in) and adds a learned
# update of rank `r`:
#
# $$y = W x + b + \frac{\alpha}{r}\, B\,A\,\mathrm{dropout}(x), \qquad A \in \mathbb{R}^{r \times in},\; B \in \mathbb{R}^{out \times r}$$
#
# `A` starts Kaiming-uniform (as `nn.Linear` starts its weight) and `B` at zeros, so the layer starts out
# exactly equal to the pretrained one. `alpha / r` keeps the update's size about the same when you change
# the rank, so the learning rate need not change with it. In plain PyTorch:

# %%
class LoRA(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        self.base, self.scaling = base, alpha / rank
        base.requires_grad_(False)  # the pretrained weight and bias stay frozen
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))  # zeros: starts equal to base
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear initialises a weight
        self.dropout = nn.Dropout(dropout)  # on the LoRA path only

    def forward(self, x):
        return self.base(x) + (self.dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scaling


# %% [markdown]
# `B A x` is computed as two thin matmuls, `(x Aᵀ) Bᵀ`: the out x in matrix `B A` is never formed while
# training. For inference, **merging** adds it into `W` once, and the layer costs what the base layer did:

# %%
def merge(layer: LoRA) -> nn.Linear:
    with torch.no_grad():
        layer.base.weight += (layer.lora_B @ layer.lora_A) * layer.scaling
    return layer.base  # a plain Linear again


import copy

layer = LoRA(nn.Linear(128, 384), rank=8, alpha=16)
engine = lora.LoRALinear(copy.deepcopy(layer.base), rank=8, alpha=16)  # labkit's layer
nn.init.normal_(layer.lora_B, std=0.02)  # as after some training
engine.lora_A.data.copy_(layer.lora_A.data)
engine.lora_B.data.copy_(layer.lora_B.data)
x = torch.randn(32, 128)
print(f"plain vs labkit, largest output difference: {(layer(x) - engine(x)).abs().max():.1e}")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the plain layer and labkit's give the same outputs and the same gradients for A and B
x = torch.randn(32, 128)
(layer(x) ** 2).sum().backward()
(engine(x) ** 2).sum().backward()
assert torch.allclose(layer(x), engine(x), atol=1e-5)
assert torch.allclose(layer.lora_A.grad, engine.lora_A.grad, atol=1e-4, rtol=1e-4)
assert torch.allclose(layer.lora_B.grad, engine.lora_B.grad, atol=1e-4, rtol=1e-4)
assert layer.base.weight.grad is None and not engine.base.weight.requires_grad

# %%
before = engine(x).detach()
engine.merge()  # labkit's merge adds the update into the base weight
merged_diff = (engine(x) - before).abs().max().item()
engine.unmerge()  # and takes it out again, to go on training
print(f"merged vs unmerged: {merged_diff:.1e}; plain merge vs labkit merge: "
      f"{(merge(copy.deepcopy(layer)).weight - engine.base.weight - engine.delta_weight()).abs().max():.1e}")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: merging changes no output (float rounding only), unmerging restores the base weight
assert merged_diff < 1e-4
assert torch.allclose(engine(x), before, atol=1e-5) and not engine.merged

# %% [markdown]
# ## 2. Which layers, how many parameters
# `lora.add_lora(model, rank, alpha, targets)` replaces every Linear whose name ends with one of `targets`
# (matched on whole name parts, as PEFT does: `"v"` names `attn.v` but not `attn.qkv`) by a `LoRALinear`,
# freezes the rest of the model, and keeps a labkit model's head trainable: a new task's classifier has to
# learn from scratch. `RunConfig(lora_rank=..., lora_targets=..., lora_alpha=...)` does the same inside
# `fit`. `tiny_vit` computes q, k and v with one Linear, `qkv` (as timm's ViT does); `"all-linear"` adds the
# attention output and the MLP's two layers. A LoRA layer trains `rank x (in + out)` numbers:

# %%
cfg = lab.workload(P)  # labkit's pretrained tiny_vit on the profile's data, fine-tuned in full
model = lora.add_lora(labkit.models.build(cfg.model, 10, pretrained=False)[0], rank=8, alpha=16, targets=["qkv"])
print(list(lora.lora_layers(model)))
print(lab.target_table(cfg, ranks=(1, 8, 64)).round(4).to_string(index=False))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each qkv adapter is rank x (128 + 384); the head (LayerNorm and Linear) trains too
table = lab.target_table(cfg, ranks=(1, 8, 64)).set_index(["targets", "rank"])
assert table.loc[("qkv", 8), "adapters"] == 4 * lora.adapter_numel(128, 384, 8) == 16_384
assert table.loc[("qkv", 8), "trainable"] == 16_384 + 1_546
assert (table.share < 0.5).all()

# %% [markdown]
# The paper's own count: RoBERTa-base (12 layers, hidden 768) with rank 8 on the query and value projections
# trains 294,912 parameters (Hu et al. 2021, table 2: "0.3M"). Built here from its config with random
# weights on PyTorch's `meta` device (no download, no memory), adapted by `add_lora` and by PEFT:

# %%
count = lab.paper_count()
published = labkit.load_reference("08_lora-*")
print(f"labkit: {count['trainable']:,} trainable in {count['adapted']} layers; PEFT: {count['peft_trainable']:,}; "
      f"paper: {count['paper']:,} ({count['trainable'] / count['total']:.2%} of {count['total']:,})")
published[["setup", "trainable_params", "source"]].style.hide(axis="index")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the paper's figure, by labkit and by PEFT
assert count["trainable"] == count["peft_trainable"] == 294_912 and count["adapted"] == 24
assert published.trainable_params.iloc[0] == 294_912

# %% [markdown]
# ## 3. Against PEFT
# PEFT's `get_peft_model` wraps any `nn.Module` by `target_modules`. Given the same layers (and the head in
# `modules_to_save`), the same A and B copied across, and `B` set to random values as after training, the
# two should agree on the trainable count, the outputs and the gradients:

# %%
side_by_side = lab.peft_comparison(cfg, rank=8)
side_by_side

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the same trainable parameters, outputs and adapter gradients as PEFT
assert (side_by_side.labkit_trainable == side_by_side.peft_trainable).all()
assert (side_by_side.max_output_diff < 1e-4).all()
assert (side_by_side.max_grad_diff <= 1e-4 * side_by_side.max_grad.clip(lower=1)).all()

# %% [markdown]
# PEFT counts more parameters *in all* than labkit (`print_trainable_parameters`): `modules_to_save` keeps
# the original head beside its trained copy, so that the adapter can be switched off. The trainable ones
# are the same.
#
# ## 4. Rank and targets
# Each run fine-tunes the same pretrained `tiny_vit` for the same steps: in full, head-only, and with LoRA at
# each rank on `qkv` and on every Linear layer (LoRA and head-only at a larger learning rate, as the paper
# does: a few small matrices that start from zero want a larger step).
#
# **Predict first.** What share of `tiny_vit`'s parameters will LoRA at rank 8 on `qkv` train, and will its
# step take more or less time than full fine-tuning's?

# %%
guess_share = None  # YOUR GUESS: trainable share at rank 8 on qkv, e.g. 0.05
guess_step_ratio = None  # YOUR GUESS: LoRA's step time / full fine-tuning's, e.g. 0.7

# %%
frame = lab.rank_sweep(cfg)  # full, head only, LoRA per rank on qkv and all-linear (cached)
print(lab.sweep_finding(frame))
r8 = frame.set_index("setup").loc["LoRA qkv r8"]
full = frame.set_index("setup").loc["full fine-tune"]
print(guesses.versus(guess_share, r8.trainable_share, "trainable share, rank 8 on qkv"))
print(guesses.versus(guess_step_ratio, r8.step_time_s / full.step_time_s, "step time, LoRA r8 / full"))
lab.sweep_table(frame)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every run finished; trainable parameters grow with the rank; LoRA's optimizer state is smaller
assert frame.error.isna().all() and frame.accuracy.between(0, 1).all()
lora_rows = frame[frame.method == "LoRA"]
assert all(g.sort_values("rank").num_trainable_params.is_monotonic_increasing for _, g in lora_rows.groupby("targets"))
assert (lora_rows.mem_optimizer_state_bytes < full.mem_optimizer_state_bytes).all()
assert r8.trainable_share < 0.05 and frame.step_time_s.gt(0).all()

# %%
axes = plots.lines(lab.sweep_chart_frame(frame), x="rank", hue="targets", logx=True,  # full, head only: flat
                   ys=["num_trainable_params", "mem_optimizer_state_bytes", "mem_activations_bytes", "step_time_s",
                       "accuracy", "peak_memory_bytes"], logy=["num_trainable_params", "mem_optimizer_state_bytes"])

# %% [markdown]
# What the numbers say (the printed lines above are this run's):
#
# - **Parameters and optimizer state** grow linearly with the rank and shrink in proportion: AdamW keeps two
#   float32 numbers per trainable parameter, so the state follows the trainable count exactly.
# - **Activations** shrink far less than the parameters, and can grow. A frozen Linear keeps no input for its
#   own weight gradient, but a LoRA layer keeps its input and `A x` for the adapters', and every layer above the
#   first adapter still passes gradients back. On `qkv` LoRA usually keeps somewhat less than full fine-tuning,
#   on `all-linear` about as much or more. Head-only keeps almost nothing: nothing below the head needs a gradient.
# - **Step time** saves the frozen weights' gradient matmuls (half of the backward pass's, a third of a step's) and pays for
#   the thin adapter matmuls, which are slow for their FLOPs on small matrices. On `qkv` it is usually a
#   saving; on `all-linear` with a tiny model it can cost time. On a large model, where the big matmuls
#   dominate, LoRA's step is faster.
# - **Accuracy** comes close to full fine-tuning's from small ranks on, and can pass it (fewer numbers to move,
#   at a larger learning rate): the change a fine-tune needs is low-rank, which is the paper's finding.
#   Head-only changes no feature and usually ends behind both; over very few steps all of them may sit
#   within the test split's noise, which the printed line gives.
#
# ## 5. A transformers model with PEFT
# The same code path on a Hugging Face model: `AutoModelForImageClassification.from_pretrained(source)`, then
# `peft.get_peft_model` with LoRA on the query and value projections and the classifier in
# `modules_to_save`. At `full` with the network the source is ViT-base from the hub (86 M parameters, images
# upsampled to 224). Elsewhere it is a transformers ViT built from a small config, given labkit's pretrained
# `tiny_vit` weights (the same blocks; transformers' ViT adds a class token and classifies from it), saved by
# `save_pretrained` and loaded by the same `from_pretrained` call.

# %%
hf = lab.transformer_finetune(cfg, rank=8)  # PEFT LoRA on query, value; the classifier trained in full
print(lab.transformer_finding(hf))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: PEFT and labkit's add_lora train the same parameters of the transformers model; the loss is finite
assert hf["peft_trainable"] == hf["labkit_trainable"] > 0
assert math.isfinite(hf["first_loss"]) and math.isfinite(hf["last_loss"]) and 0 <= hf["accuracy"] <= 1

# %% [markdown]
# The layer names differ between model families and library versions (`query`/`value` in transformers 4's
# ViT and BERT, `q_proj`/`v_proj` in transformers 5's ViT and in LLaMA-style models); `lab.attention_targets`
# reads them from the model. Print `[n for n, m in model.named_modules() if isinstance(m, nn.Linear)]` to
# choose targets for your own.
#
# ## 6. QLoRA: a 4-bit base
# QLoRA stores the frozen base in 4-bit NormalFloat (bitsandbytes' `Linear4bit`, notebook 06) and trains
# bf16 adapters over it: each forward dequantizes a layer's weights block by block for its matmul. Here LoRA
# on every Linear layer, rank 8, over a bf16 base and over an NF4 base, both in bf16 autocast, for half the sweep's steps (memory and
# step time settle within a few). A third run
# keeps bitsandbytes' layers exactly as shipped: they return their *input's* dtype, and after a LayerNorm
# under autocast that is float32, where a bf16 model (what QLoRA loads) would pass bf16 on.
#
# **Predict first.** By what factor will the peak training memory fall with the 4-bit base?

# %%
guess_qlora_peak = None  # YOUR GUESS: peak memory with NF4 base / with bf16 base, e.g. 0.5

# %%
qlora = lab.qlora_comparison(cfg, rank=8)  # LoRA on a bf16 base, an NF4 base (QLoRA), NF4 as shipped
print(lab.qlora_finding(qlora))
if qlora.error.isna().all():
    peaks = qlora.set_index("setup").peak_memory_bytes
    print(guesses.versus(guess_qlora_peak, peaks.iloc[1] / peaks.iloc[0], "peak NF4 / peak bf16"))
lab.qlora_table(qlora)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: where NF4 runs, its frozen weights take about a quarter of bf16's (4 bits plus block scales)
rows = qlora.set_index("setup")
if qlora.error.isna().all():
    share = rows.base_weight_bytes.iloc[1] / rows.base_weight_bytes.iloc[0]
    assert 0.25 <= share < 0.32 and (rows.num_trainable_params.iloc[0] == rows.num_trainable_params.iloc[1])
else:
    assert isinstance(rows.error.iloc[1], str) and len(rows.error.iloc[1]) > 20

# %% [markdown]
# The 4-bit weights take about a quarter of the bf16 ones: half a byte per weight plus one scale per block of
# 64, itself stored in 8 bits (double quantization). Whether the *peak* falls depends on what the peak is made
# of: in a 7-billion-parameter model the frozen weights are most of it (about 14 GB in bf16 against 3.6 GB in
# NF4) and QLoRA fits it on one 16 GB GPU; in this tiny model the activations are, so the saving is a small
# share of the peak. The third line shows a dtype, not a bit width, deciding memory: float32 activations
# after every 4-bit layer can cost more than the 4 bits saved. On a CPU bitsandbytes runs a PyTorch fallback,
# so its step time says little.
#
# ## 7. Merged inference
# Unmerged, every adapted layer adds two thin matmuls to each forward. `lora.merge_and_unload(model)` merges
# each update into its weight and puts the plain Linear back: the same layers as the base model, so the same
# latency, and the same outputs as the unmerged model up to float rounding.

# %%
merged = lab.merge_comparison(cfg, rank=8)  # the fine-tuned qkv rank-8 model from the sweep (cached)
print(lab.merge_finding(merged))
lab.merge_table(merged)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: merging changes the outputs by float rounding only and removes every LoRA layer
assert merged.max_output_diff.iloc[2] < 1e-3 and merged.lora_layers.iloc[2] == 0 < merged.lora_layers.iloc[1]
assert merged.latency_s.gt(0).all() and len(merged) == 4

# %% [markdown]
# Keep the adapters unmerged when one base serves several tasks (swap a few hundred kB per task) or when you
# will train again; merge for a single deployed model. A 4-bit base cannot be merged in place (the update is
# not 4-bit): dequantize it first, or serve unmerged.
#
# ## 8. Your turn: the panel
# Choose the rank, the targets and alpha, and press **Run**. Each run adds a point: trainable parameters,
# peak memory and accuracy against the rank, one line per target set. Try rank 1 and rank 64 on `qkv`,
# then alpha 4 and 64 at rank 8: which changes accuracy more?

# %%
panel = ExperimentPanel(
    run=lab.panel_run, base=lab.panel_config(cfg),
    controls={"lora_rank": (1, 64, 1), "lora_targets": list(lab.TARGETS), "lora_alpha": [4.0, 8.0, 16.0, 32.0, 64.0]},
    show=views.Trend("lora_rank", ("num_trainable_params", "peak_memory_bytes", "accuracy"), hue="targets"),
    title="LoRA")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | the model does not learn at all | the head is frozen too (a new task's classifier starts random) | train the head: `modules_to_save` in PEFT; labkit's `add_lora` keeps a labkit model's head trainable |
# | LoRA learns much slower than full fine-tuning | full fine-tuning's learning rate | a larger one (1e-4 to 3e-3); the paper's RoBERTa runs used about 20x full fine-tuning's |
# | `target_modules` matches nothing / `ValueError: Target modules ... not found` | the layer names differ (`query` vs `q_proj`, a fused `qkv`) | list the Linear names; labkit's error prints them |
# | memory barely falls | activations dominate (long sequences, big batches), not weights and optimizer state | gradient checkpointing (notebook 03), a smaller micro-batch |
# | merged outputs differ from unmerged | merged twice, or merged into a quantized or fp16 base | merge once, into a float32 or bf16 copy |
# | QLoRA uses more memory than LoRA on a bf16 base | the 4-bit layers return float32 (their input's dtype), so every activation after them is float32 | load the model in bf16 (`torch_dtype=torch.bfloat16`) so that bf16 flows between layers |
# | results change with the rank at a fixed learning rate | no `alpha / rank` scaling, or `alpha` set proportional to the rank | fix `alpha`, change the rank |

# %% [markdown]
# ## Going further
# - **DoRA** (Liu et al. 2024) splits each weight into a magnitude and a direction and adapts the direction
#   with LoRA (`LoraConfig(use_dora=True)`).
# - **LoRA+** gives `B` a larger learning rate than `A`; **rsLoRA** scales by `alpha / sqrt(rank)`, which keeps
#   high ranks stable (`use_rslora=True`).
# - **Several adapters on one base**: PEFT's `load_adapter` / `set_adapter` switch tasks without reloading the
#   model; serving stacks (vLLM, TGI) batch requests for different adapters together.
# - **QLoRA's other two parts**: double quantization (the block scales quantized too) and paged optimizers
#   (`paged_adamw8bit`, notebook 03) for memory spikes.

# %% [markdown]
# ## Summary
# - LoRA: `y = W x + b + (alpha / r) B A x`, `W` frozen, `A` Kaiming, `B` zeros; `r (in + out)` numbers per layer.
# - `add_lora(model, rank, alpha, targets)` or `RunConfig(lora_rank=...)`; PEFT gives the same parameters,
#   outputs and gradients; RoBERTa-base rank 8 on q, v: 294,912.
# - Trainable parameters and optimizer state shrink with LoRA; activations do not, and can grow.
# - Accuracy close to full fine-tuning from small ranks; head-only is further behind.
# - QLoRA's NF4 base stores the frozen weights in a quarter of bf16's bytes: it pays where weights dominate memory.
# - Merge for inference: the base model's layers and latency, the same outputs.

# %% [markdown]
# ## Further reading
# - Hu et al. 2021, *LoRA: Low-Rank Adaptation of Large Language Models*: https://arxiv.org/abs/2106.09685
# - Dettmers et al. 2023, *QLoRA: Efficient Finetuning of Quantized LLMs*: https://arxiv.org/abs/2305.14314
# - PEFT, LoRA guide: https://huggingface.co/docs/peft/developer_guides/lora
# - Aghajanyan et al. 2020, *Intrinsic Dimensionality Explains the Effectiveness of Language Model
#   Fine-Tuning*: https://arxiv.org/abs/2012.13255
# - Biderman et al. 2024, *LoRA Learns Less and Forgets Less*: https://arxiv.org/abs/2405.09673

# %% [markdown]
# ## Exercises
# The first asks for code: LoRA's forward pass from the weight, the bias, A and B. The checker compares
# your output with labkit's `LoRALinear` on several shapes and ranks.

# %%
print(exercises.question("08.lora_forward"))


# %%
def lora_forward(x, weight, bias, lora_A, lora_B, alpha):
    """Return the LoRA layer's output for input x (..., in); weight is (out, in), lora_A (rank, in), lora_B (out, rank)."""
    raise NotImplementedError  # YOUR CODE


exercises.check("08.lora_forward", lora_forward)

# %% [markdown]
# The next one uses **your own** sweep: the trainable parameters at two ranks on `qkv`. After answering:
# which part of the count does not grow with the rank, and why?

# %%
mine = lab.own_count_numbers(frame)
print(exercises.question("08.own_count", mine))

# %%
answer = None  # YOUR CODE: trainable parameters at the new rank
exercises.check("08.own_count", answer, mine)

# %%
print(exercises.question("08.adam_state"))

# %%
answer = None  # YOUR CODE: MB
exercises.check("08.adam_state", answer)

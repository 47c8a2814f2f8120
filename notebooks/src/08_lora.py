# %% [markdown]
# # LoRA and QLoRA: fine-tune a few small matrices instead of the model
#
# A full fine-tune changes every weight and keeps, per weight, a gradient and two AdamW states. LoRA (Hu et al.
# 2021) freezes the pretrained weights and learns each layer's change as the product of two thin matrices,
# `B @ A`, of small rank, so one base model serves many tasks. QLoRA (Dettmers et al. 2023) also stores the
# frozen base in 4-bit NormalFloat.
#
# **You will learn**
# 1. the LoRA layer in plain PyTorch: frozen `W`, `A` (Kaiming) and `B` (zeros), the `alpha / rank` scale,
#    merging; and what goes wrong in a commonly copied blog version;
# 2. `add_lora` by layer names, checked against PEFT and against the paper's 294,912 for RoBERTa-base;
# 3. rank 1 to 64 on the attention projection and on every Linear layer against full fine-tuning and head-only;
# 4. QLoRA's 4-bit NF4 base against a 16-bit base; merged against unmerged inference.
#
# **What you need:** notebook 05 (freezing) helps; notebook 06 introduced NF4. A CPU runs every section, but
# there QLoRA's step time (section 5) is only noise (bitsandbytes' CPU path is a fallback) and the sweep's
# step-time differences (section 4) often sit inside the runs' own spread; a GPU shows both.

# %%
import math

import torch
from torch import nn

import labkit
from labkit import display, guesses, plots, views
from labkit.labs import lora as lab  # this notebook's experiments and findings
from labkit.labs.lora import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import lora
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
print(lab.library_versions())
labkit.env_report()

# %% [markdown]
# ## 1. The mechanism
# A LoRA layer as it circulates in blog posts and forum answers:

# %%
print(lab.blog_snippet())  # the source of lab.BlogLoRALayer

# %% [markdown]
# Four things are wrong with it, each measured by the next cell:
# 1. **No base weight.** `self.weight` is never defined: the layer must wrap the pretrained `nn.Linear`, frozen.
# 2. **A and B transposed** against `nn.Linear`'s (out, in): merging `W + A @ B` fails on a non-square layer
#    and, worse, silently adds the transpose on a square one.
# 3. **No `alpha / rank` scale:** the update's size changes with the rank, so every rank needs its own
#    learning rate.
# 4. **`A` from `randn`:** sqrt(3 x in_features) times larger than `nn.Linear`'s initial weights (20x for 128
#    inputs), so each change of `B` moves the output as much more: a learning rate far too high.

# %%
display.table(lab.blog_snippet_problems(), ["problem", "what_happens"])

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the blog layer fails as described, and its square-layer merge is silently wrong
problems = lab.blog_snippet_problems().what_happens
assert "AttributeError" in problems.iloc[0] and "RuntimeError" in problems.iloc[1] and "off by" in problems.iloc[1]
assert "0.25x" in problems.iloc[2]


# %% [markdown]
# The layer the paper describes wraps the pretrained `nn.Linear` (weight `W`, out x in) and adds an update of
# rank `r`:
#
# $$y = W x + b + \frac{\alpha}{r}\, B\,A\,\mathrm{dropout}(x),
# \qquad A \in \mathbb{R}^{r \times in},\; B \in \mathbb{R}^{out \times r}$$
#
# `A` starts Kaiming-uniform and `B` at zeros, so the layer starts equal to the pretrained one; `alpha / r`
# keeps the update's size about the same across ranks. In plain PyTorch:

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
# (whole name parts, as PEFT matches them: `"v"` names `attn.v`, not `attn.qkv`) by a `LoRALinear`, freezes the
# rest, and keeps a labkit model's head trainable (a new classifier learns from scratch);
# `RunConfig(lora_rank=..., lora_targets=...)` does the same inside `fit`. `tiny_vit` computes q, k and v with
# one Linear, `qkv`; `"all-linear"` adds the attention output and the MLP. Each adapted layer trains
# `rank x (in + out)` numbers:

# %%
cfg = lab.workload(P)  # labkit's pretrained tiny_vit on the profile's data, fine-tuned in full
model = lora.add_lora(labkit.models.build(cfg.model, 10, pretrained=False)[0], rank=8, alpha=16, targets=["qkv"])
print(list(lora.lora_layers(model)))
counts = lab.target_table(cfg, ranks=(1, 8, 64))
display.table(counts, ["targets", "rank", "layers", "adapter_params", "trainable_params", "trainable_share"])

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each qkv adapter is rank x (128 + 384); the head (LayerNorm and Linear) trains too
by = counts.set_index(["targets", "rank"])
assert by.loc[("qkv", 8), "adapter_params"] == 4 * lora.adapter_numel(128, 384, 8) == 16_384
assert by.loc[("qkv", 8), "trainable_params"] == 16_384 + 1_546
assert (by.trainable_share < 0.5).all()

# %% [markdown]
# The paper's own count: RoBERTa-base (12 layers, hidden 768) with rank 8 on the query and value projections
# trains 294,912 parameters (Hu et al. 2021, table 2: "0.3M"). Here it is built from its config with random
# weights on PyTorch's `meta` device (no download, no memory) and adapted by `add_lora` and by PEFT:

# %%
count = lab.paper_count()
published = labkit.load_reference("08_lora-trainable-published-hu2021")
print(f"labkit: {count['trainable']:,} trainable in {count['adapted']} layers; PEFT: {count['peft_trainable']:,}; "
      f"paper: {count['paper']:,} ({count['trainable'] / count['total']:.2%} of {count['total']:,})")
display.table(published, ["setup", "trainable_params", "source"])

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the paper's figure, by labkit and by PEFT
assert count["trainable"] == count["peft_trainable"] == 294_912 and count["adapted"] == 24
assert published.trainable_params.iloc[0] == 294_912

# %% [markdown]
# ## 3. Against PEFT
# PEFT's `get_peft_model` wraps any `nn.Module` by `target_modules`. Given the same layers (head in
# `modules_to_save`) and the same A and B, with `B` random as after training, the two should agree on trainable
# count, outputs and gradients:

# %%
side_by_side = lab.peft_comparison(cfg, rank=8)
display.table(side_by_side, ["targets", "layers", "labkit_trainable_params", "peft_trainable_params",
                             "max_output_diff", "max_grad_diff"])

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the same trainable parameters, outputs and adapter gradients as PEFT
assert (side_by_side.labkit_trainable_params == side_by_side.peft_trainable_params).all()
assert (side_by_side.max_output_diff < 1e-4).all()
assert (side_by_side.max_grad_diff <= 1e-4 * side_by_side.max_grad.clip(lower=1)).all()

# %% [markdown]
# PEFT counts more parameters *in all*: `modules_to_save` keeps the original head beside its trained copy, so
# the adapter can be switched off. The trainable ones are the same.
#
# ## 4. Rank and targets
# Each run fine-tunes the same pretrained `tiny_vit` for the same steps: in full, head-only, and with LoRA at
# each rank on `qkv` and on every Linear layer (LoRA and head-only at a larger learning rate, as in the paper:
# small matrices starting from zero want a larger step).
#
# **Predict first.** What share of `tiny_vit`'s parameters will LoRA at rank 8 on `qkv` train, and will its
# step take more or less time than full fine-tuning's?

# %%
guess_share = None  # YOUR GUESS: trainable share at rank 8 on qkv, e.g. 0.05
guess_step_ratio = None  # YOUR GUESS: LoRA's step time / full fine-tuning's, e.g. 0.7

# %%
frame = lab.rank_sweep(cfg)  # full, head only, LoRA per rank on qkv and all-linear (cached)
print(lab.sweep_finding(frame))
r8, full = frame.set_index("setup").loc["LoRA qkv r8"], frame.set_index("setup").loc["full fine-tune"]
print(guesses.versus(guess_share, r8.trainable_share, "trainable share, rank 8 on qkv"))
spreads = [(r.step_time_p10_s, r.step_time_p90_s) for r in (r8, full)]  # each run's 10th-90th percentile
print(guesses.versus(guess_step_ratio, r8.step_time_s / full.step_time_s, "step time, LoRA r8 / full",
                     band=labkit.measure.ratio_band(*spreads)))
display.table(frame, ["setup", "num_trainable_params", "mem_optimizer_state_bytes", "mem_activations_bytes",
                      "peak_memory_bytes", "step_time_s", "accuracy"])

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
# How to read it:
#
# - **Parameters and optimizer state** grow linearly with the rank (AdamW: two float32 numbers per trainable
#   parameter).
# - **Activations** shrink far less, and can grow: a frozen Linear keeps no input for its weight gradient, but a
#   LoRA layer keeps its input and `A x` for the adapters', and every layer above the first adapter still passes
#   gradients back. On `qkv` LoRA usually keeps less than full fine-tuning, on `all-linear` as much or
#   more; head-only keeps almost nothing.
# - **Step time** saves the frozen weights' gradient matmuls (a third of a step) and pays for the thin adapter
#   matmuls, slow for their FLOPs. The printed line calls LoRA faster or slower only where the runs' 10th-90th
#   percentile step times do not overlap. On a tiny model `all-linear` can cost time; on a large one LoRA's step
#   is faster.
# - **Accuracy** comes close to full fine-tuning's from small ranks on, and can pass it: the change a fine-tune
#   needs is low-rank, the paper's finding. Head-only changes no feature and usually ends behind. Over few steps
#   all may sit within the test split's noise, which the printed line gives.
#
# ## 5. QLoRA: a 4-bit base
# QLoRA trains bf16 adapters over a frozen 4-bit NormalFloat base (bitsandbytes' `Linear4bit`, notebook 06).
# Here: LoRA on every Linear, rank 8, over a 16-bit and an NF4 base in 16-bit autocast (bf16; fp16 on a T4, whose
# bf16 is emulated), for a third of the sweep's steps.
# A third run keeps bitsandbytes' layers as shipped: they return their *input's* dtype, float32 after a
# LayerNorm under autocast, where a bf16 model (what QLoRA loads) passes bf16 on.
#
# **Predict first.** By what factor will the peak training memory fall with the 4-bit base?

# %%
guess_qlora_peak = None  # YOUR GUESS: peak memory with NF4 base / with 16-bit base, e.g. 0.5

# %%
qlora = lab.qlora_comparison(cfg, rank=8)  # LoRA on a 16-bit base, an NF4 base (QLoRA), NF4 as shipped
print(lab.qlora_finding(qlora))
if qlora.error.isna().all():
    peaks = qlora.set_index("setup").peak_memory_bytes
    print(guesses.versus(guess_qlora_peak, peaks.iloc[1] / peaks.iloc[0], "peak NF4 / peak 16-bit"))
display.table(qlora, ["setup", "base_weight_bytes", "mem_activations_bytes", "peak_memory_bytes", "step_time_s",
                      "accuracy"])

# %% jupyter={"source_hidden": true} tags=["check"]
# check: where NF4 runs, its frozen weights take about a quarter of bf16's (4 bits plus block scales)
rows = qlora.set_index("setup")
if qlora.error.isna().all():
    share = rows.base_weight_bytes.iloc[1] / rows.base_weight_bytes.iloc[0]
    assert 0.25 <= share < 0.32 and (rows.num_trainable_params.iloc[0] == rows.num_trainable_params.iloc[1])
else:
    assert isinstance(rows.error.iloc[1], str) and len(rows.error.iloc[1]) > 20

# %% [markdown]
# The 4-bit weights take about a quarter of bf16's: half a byte per weight plus an 8-bit scale per block of 64
# (double quantization), 4.127 bits a weight. Whether the *peak* falls depends on its make-up: in a
# 7-billion-parameter model the frozen weights are most of it (14 GB in bf16, 3.6 GB in NF4), so QLoRA fits it on
# one 16 GB GPU; in this tiny model the activations are, so the saving is small or none. The third run shows a
# dtype deciding memory: float32 activations after every 4-bit layer can cost more than the 4 bits saved.

# %% [markdown]
# Published figures for scale (LoRA and QLoRA on large models; measured elsewhere, not here):

# %%
display.table(labkit.results.published("08_lora-memory*"))

# %% [markdown]
# ## 6. Merged inference
# Unmerged, every adapted layer adds two thin matmuls to each forward. `lora.merge_and_unload(model)` merges each
# update into its weight and puts the plain Linear back: the base model's layers and latency, the unmerged
# model's outputs up to float rounding. The base is timed twice, interleaved with the others; the gap between
# its two timings is this machine's noise, which the printed line compares against.

# %%
merged = lab.merge_comparison(cfg, rank=8)  # the fine-tuned qkv rank-8 model from the sweep (cached)
print(lab.merge_finding(merged))
display.table(merged, ["setup", "latency_s", "vs_base", "max_output_diff", "lora_layers"])

# %% jupyter={"source_hidden": true} tags=["check"]
# check: merging changes the outputs by float rounding only and removes every LoRA layer
assert merged.max_output_diff.iloc[2] < 1e-3 and merged.lora_layers.iloc[2] == 0 < merged.lora_layers.iloc[1]
assert merged.latency_s.gt(0).all() and len(merged) == 4

# %% [markdown]
# Keep adapters unmerged when one base serves several tasks (a few hundred kB per task) or to train again; merge
# for a single deployed model. A 4-bit base cannot be merged in place: dequantize it first, or serve unmerged.
#
# ## 7. Your turn: the panel
# Choose rank, targets and alpha, and press **Run**; each run adds a point (trainable parameters, peak memory,
# accuracy against rank, one line per target set). Try rank 1 and 64 on `qkv`, then alpha 4 and 64 at rank 8:
# which changes accuracy more?

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
# | model does not learn | head frozen too | train the head (PEFT: `modules_to_save`) |
# | LoRA learns much slower than full | full fine-tuning's lr | a larger lr (1e-4 to 3e-3) |
# | `Target modules ... not found` | names differ (`query`, `q_proj`, fused `qkv`) | list the Linear names |
# | memory barely falls | activations dominate | checkpointing (notebook 03), a smaller micro-batch |
# | merged outputs differ from unmerged | merged twice, or into a quantized base | merge once, into a float copy |
# | QLoRA uses more memory than bf16 LoRA | 4-bit layers return float32 | load the model in bf16 |
# | results change with rank at fixed lr | no `alpha / rank` scale | fix `alpha`, change the rank |

# %% [markdown]
# ## Going further
# ### A transformers model with PEFT
# The same code path on a Hugging Face model: `AutoModelForImageClassification.from_pretrained(source)`, then
# `peft.get_peft_model` with LoRA on the query and value projections and the classifier in `modules_to_save`. At
# `full` with the network the source is ViT-base from the hub (86 M parameters, images upsampled to 224);
# elsewhere a transformers ViT built from a small config and given `tiny_vit`'s weights (transformers' ViT adds a
# class token), saved and loaded by the same `from_pretrained` call.

# %%
hf = lab.transformer_finetune(cfg, rank=8)  # PEFT LoRA on query, value; the classifier trained in full
print(lab.transformer_finding(hf))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: PEFT and labkit's add_lora train the same parameters of the transformers model; the loss is finite
assert hf["peft_trainable"] == hf["labkit_trainable"] > 0
assert math.isfinite(hf["first_loss"]) and math.isfinite(hf["last_loss"]) and 0 <= hf["accuracy"] <= 1

# %% [markdown]
# Layer names differ between model families and versions (`query`/`value` in transformers 4, `q_proj`/`v_proj`
# in transformers 5 and LLaMA-style models); `lab.attention_targets` reads them from the model.
#
# ### More
# - **DoRA** (Liu et al. 2024) adapts each weight's direction with LoRA and its magnitude apart
#   (`LoraConfig(use_dora=True)`); **rsLoRA** scales by `alpha / sqrt(rank)`, stable at high ranks.
# - **Several adapters on one base**: PEFT's `load_adapter` / `set_adapter` switch tasks without reloading.
# - **QLoRA's paged optimizers** (`paged_adamw8bit`, notebook 03) absorb memory spikes.

# %% [markdown]
# ## Summary
# - LoRA: `y = W x + b + (alpha / r) B A x`, `W` frozen, `A` Kaiming, `B` zeros; `r (in + out)` numbers a layer.
# - `add_lora` or `RunConfig(lora_rank=...)`: the same parameters, outputs and gradients as PEFT.
# - Trainable parameters and optimizer state shrink with LoRA; activations do not, and can grow.
# - QLoRA's NF4 base stores the frozen weights in a quarter of bf16's bytes: it pays where weights dominate.
# - Merge for inference: the base model's layers and latency, the same outputs.

# %% [markdown]
# ## Further reading
# - Hu et al. 2021, *LoRA: Low-Rank Adaptation of Large Language Models*: https://arxiv.org/abs/2106.09685
# - Dettmers et al. 2023, *QLoRA: Efficient Finetuning of Quantized LLMs*: https://arxiv.org/abs/2305.14314
# - PEFT, LoRA guide: https://huggingface.co/docs/peft/developer_guides/lora
# - Biderman et al. 2024, *LoRA Learns Less and Forgets Less*: https://arxiv.org/abs/2405.09673
# - Aghajanyan et al. 2020, *Intrinsic Dimensionality Explains the Effectiveness of Language Model Fine-Tuning*:
#   https://arxiv.org/abs/2012.13255

# %% [markdown]
# ## Exercises
# The first asks you to code LoRA's forward pass from the weight, bias, A and B; the checker compares it with
# labkit's `LoRALinear` on several shapes and ranks.

# %%
print(exercises.question("08.lora_forward"))


# %%
def lora_forward(x, weight, bias, lora_A, lora_B, alpha):
    """Return the LoRA layer's output for x (..., in); weight is (out, in), lora_A (rank, in), lora_B (out, rank)."""
    raise NotImplementedError  # YOUR CODE


exercises.check("08.lora_forward", lora_forward)

# %% [markdown]
# The next one uses **your own** sweep: the trainable parameters at two ranks on `qkv`. After answering: which
# part of the count does not grow with the rank, and why?

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

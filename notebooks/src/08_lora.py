# %% [markdown]
# # LoRA and QLoRA: fine-tune a language model through a few small matrices
#
# LoRA (Hu et al. 2021) freezes the pretrained weights and learns each layer's change as the product of two thin
# matrices, `B @ A`, of small rank; QLoRA (Dettmers et al. 2023) also stores the frozen base in 4-bit NormalFloat.
# Both were made for language models, and here a pretrained Llama-style decoder learns to sort digits
# (`digits_sort`, scored by exact match): labkit's 1M-parameter `tiny_llama` on a CPU, SmolLM2-135M at `full`.
#
# **You will learn**
# 1. the LoRA layer in plain PyTorch, and what goes wrong in a commonly copied blog version;
# 2. `add_lora` by layer names, checked against the paper's count and against PEFT, an adapter saved and merged;
# 3. rank 1 to 64 on the query and value projections and on every Linear layer, against full fine-tuning;
# 4. QLoRA's 4-bit base against a 16-bit base; which model fits your GPU; merged inference.
#
# **What you need:** notebooks 03 and 10 help; notebook 06 introduced NF4. A CPU runs every section, but there
# QLoRA's step time is only noise (bitsandbytes' CPU path is a fallback) and the sweep's step times often sit
# inside their own spread; a GPU shows both.

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
print(lab.blog_snippet())  # the source of labkit.labs.lora.layer.BlogLoRALayer

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
problems = lab.blog_snippet_problems()
problems

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the blog layer fails as described, and its square-layer merge is silently wrong
happens = problems.frame.what_happens
assert "AttributeError" in happens.iloc[0] and "RuntimeError" in happens.iloc[1] and "off by" in happens.iloc[1]
assert "0.25x" in happens.iloc[2]


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
# `lora.add_lora(model, rank, alpha, targets)` replaces every Linear whose name ends with one of `targets` (whole
# name parts, as PEFT matches them) by a `LoRALinear` and freezes everything else, the output layer too.
# `RunConfig(lora_rank=..., lora_targets=...)` does the same inside `fit`. The paper adapted the query and value
# projections (`q_proj`, `v_proj`); `"all-linear"` adds `k_proj`, `o_proj` and the MLP's three. Each adapted layer
# trains `rank x (in + out)` numbers:

# %%
cfg = lab.workload(P)  # the profile's pretrained language model on digits_sort, fine-tuned in full
model = lora.add_lora(lab.fresh_model(cfg), rank=8, alpha=16, targets=["q_proj", "v_proj"])
adapted = lora.lora_layers(model)
print(f"{cfg.model}: {len(adapted)} adapted layers, e.g. {list(adapted)[:2]}")
counts = lab.target_table(cfg, ranks=(1, 8, 64))
counts

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each adapter is rank x (in + out), and on a language model nothing but the adapters trains
by = counts.frame.set_index(["targets", "rank"])
per_layer = sum(lora.adapter_numel(layer.in_features, layer.out_features, 8) for layer in adapted.values())
assert by.loc[("q_proj,v_proj", 8), "adapter_params"] == per_layer == by.loc[("q_proj,v_proj", 8), "trainable_params"]
assert (by.adapter_params == by.trainable_params).all() and (by.trainable_share < 0.5).all()

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
# PEFT's `get_peft_model` wraps any `nn.Module` by `target_modules`. Given the same layers and the same A and B
# (`B` random, as after training), the two should agree on trainable count, logits and gradients:

# %%
side_by_side = lab.peft_comparison(cfg, rank=8)
side_by_side

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the same trainable parameters, outputs and adapter gradients as PEFT
agree = side_by_side.frame
assert (agree.labkit_trainable_params == agree.peft_trainable_params).all() and (agree.max_output_diff < 1e-4).all()
assert (agree.max_grad_diff <= 1e-4 * agree.max_grad.clip(lower=1)).all()

# %% [markdown]
# What a LoRA fine-tune ships is the adapter alone. PEFT's `save_pretrained` writes the A and B matrices and their
# `LoraConfig`; `PeftModel.from_pretrained` puts them on a fresh copy of the base, and `merge_and_unload` folds
# them into its weights:

# %%
saved = lab.peft_roundtrip(cfg, rank=8)  # rank 8 on q_proj, v_proj
saved

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the adapter is a small share of the model, reloads exactly and merges as labkit merges
adapter = saved.frame.iloc[0]
assert adapter.adapter_share < 0.1 and adapter.reload_diff < 1e-5 and adapter.merge_diff < 1e-4
assert adapter.lora_layers_after_merge == 0

# %% [markdown]
# ## 4. Rank and targets
# Each run fine-tunes the same pretrained model for the same steps: in full, with only the output layer and final
# norm ("head only"), and with LoRA at each rank on `q_proj,v_proj` and on every Linear layer (LoRA and head-only
# at a larger learning rate: small matrices starting from zero want a larger step). An output layer **tied** to the
# embeddings (SmolLM2) trains as a copy of its own in head only, as PEFT's `modules_to_save` does.
#
# **Predict first.** What share of the model's parameters will LoRA at rank 8 on `q_proj,v_proj` train, and
# will its step take more or less time than full fine-tuning's?

# %%
guess_share = None  # YOUR GUESS: trainable share at rank 8 on q_proj,v_proj, e.g. 0.05
guess_step_ratio = None  # YOUR GUESS: LoRA's step time / full fine-tuning's, e.g. 0.7

# %%
sweep = lab.rank_sweep(cfg)  # full, head only, LoRA per rank on q_proj,v_proj and all-linear (cached)
r8, full = sweep.row("LoRA q_proj,v_proj r8"), sweep.row("full fine-tune")
print(guesses.versus(guess_share, r8.trainable_share, "trainable share, rank 8 on q_proj,v_proj"))
step = sweep.step_against_full("LoRA q_proj,v_proj r8")  # band: what each run's 10th-90th percentile allows
print(guesses.versus(guess_step_ratio, step, "step time, LoRA r8 / full"))
sweep

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every run finished; trainable parameters grow with the rank; LoRA's optimizer state is smaller
frame = sweep.frame
assert frame.error.isna().all() and frame.exact_match.between(0, 1).all()
lora_rows = frame[frame.method == "LoRA"]
assert all(g.sort_values("rank").num_trainable_params.is_monotonic_increasing for _, g in lora_rows.groupby("targets"))
assert (lora_rows.mem_optimizer_state_bytes < full.mem_optimizer_state_bytes).all()
assert r8.trainable_share < 0.05 and frame.step_time_s.gt(0).all()

# %%
axes = plots.lines(sweep.chart_frame(), x="rank", hue="targets", logx=True,  # full, head only: flat
                   ys=["num_trainable_params", "mem_optimizer_state_bytes", "mem_activations_bytes", "step_time_s",
                       "exact_match", "peak_memory_bytes"], logy=["num_trainable_params", "mem_optimizer_state_bytes"])

# %% [markdown]
# How to read it:
#
# - **Parameters and optimizer state** grow linearly with the rank (AdamW: two float32 numbers a parameter).
# - **Activations** shrink less: a frozen Linear keeps no input, but a LoRA layer keeps its input and `A x`. On
#   `q_proj,v_proj` LoRA keeps less than full fine-tuning, on `all-linear` nearly as much; head-only almost none.
# - **Step time** saves the frozen weights' gradient matmuls and pays for the thin adapter matmuls (real only where
#   the 10th-90th percentiles do not overlap).
# - **Exact match**: sorting needs attention and MLP to change, so head-only usually learns nothing; LoRA on
#   every Linear layer comes close to full fine-tuning and on `q_proj,v_proj` lags, as the QLoRA paper found.
#   Over a few steps (the `ci` profile) every run may still score near zero, within the printed noise.
#
# ## 5. QLoRA: a 4-bit base
# QLoRA trains adapters over a frozen base in 4-bit NormalFloat with double quantization (bitsandbytes'
# `Linear4bit`), computing in bf16, or fp16 on a T4 with float32 adapters (a gradient scaler cannot unscale fp16
# ones). Here: LoRA on every Linear, rank 8, over a 16-bit and an NF4 base, on a model whose weights weigh more:
# `tiny_llama_10m` (random weights) at `quick`, Qwen2.5-1.5B at `full`. On CUDA both use paged 8-bit AdamW.
#
# **Predict first.** By what factor will the peak training memory fall with the 4-bit base?

# %%
guess_qlora_peak = None  # YOUR GUESS: peak memory with NF4 base / with 16-bit base, e.g. 0.5

# %%
qlora = lab.qlora_comparison(cfg, rank=8)  # LoRA on a 16-bit base and on an NF4 base (QLoRA)
if qlora.frame.error.isna().all():
    peaks = qlora.frame.peak_memory_bytes
    print(guesses.versus(guess_qlora_peak, peaks.iloc[1] / peaks.iloc[0], "peak NF4 / peak 16-bit"))
qlora

# %% jupyter={"source_hidden": true} tags=["check"]
# check: where NF4 runs, its 4-bit weights take 4.127 bits each (scales included) and the same adapters train
rows = qlora.frame.set_index("setup")
if rows.error.isna().all():
    assert abs(rows.bits_per_4bit_weight.iloc[1] - lab.NF4_BITS) < 0.01
    assert rows.base_weight_bytes.iloc[1] < rows.base_weight_bytes.iloc[0]
    assert rows.num_trainable_params.iloc[0] == rows.num_trainable_params.iloc[1]
else:  # a setup that could not run here (no 4-bit kernels) or failed says why
    assert all(len(e) > 20 for e in rows.error.dropna())

# %% [markdown]
# A 4-bit weight takes half a byte plus an 8-bit scale per block of 64 and a float32 scale per 256 blocks: 4.127
# bits. Whether the *peak* falls depends on its make-up: in a 7B model the frozen weights are most of it (14 GB in
# bf16, 3.6 GB in NF4); in a small model the activations are. On a CPU bitsandbytes takes only layers of 32k
# outputs and 64k inputs (`tiny_llama`'s 344-wide MLP stays 16-bit). A slower 4-bit step pays for unpacking.

# %% [markdown]
# Published figures for scale (LoRA and QLoRA on large models; measured elsewhere, not here):

# %%
display.table(labkit.results.published("08_lora-memory*"))

# %% [markdown]
# ## 6. What fits your GPU
# `labkit.capacity.lm_training_memory` adds up a fine-tune's memory by formula: weights, gradients, AdamW's state,
# each decoder layer's activations and the logits. First it is checked against peaks measured here (float32, rows
# of one width). **Predict first:** how many GiB does Qwen2.5-1.5B need with LoRA at 512 tokens x 4 rows?

# %%
guess_lora_gib = None  # YOUR GUESS: e.g. 12

# %%
check = lab.estimate_check(cfg)  # the formula against fit's measured peak (cached runs)
check

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the formula lands within the error it states
assert (check.frame.estimate_error.abs() <= lab.ESTIMATE_ERROR).all(), "the formula within its stated error"

# %% [markdown]
# The same formula for models of 0.1B to 7B parameters, at 512 tokens x 4 rows in fp16 autocast with per-layer
# checkpointing and rank-16 adapters on every Linear layer; `fits_your_gpu` reads this machine's GPU:

# %%
fits = lab.gpu_table(seq_len=512, micro_batch=4)
lora_15b = fits.frame.set_index(["model", "method"]).total_bytes["Qwen2.5-1.5B", "LoRA"] / 2**30
print(guesses.versus(guess_lora_gib, lora_15b, "Qwen2.5-1.5B with LoRA", " GiB"))
fits

# %% jupyter={"source_hidden": true} tags=["check"]
# check: for every model, full fine-tuning needs the most and QLoRA the least
assert fits.frame.groupby("model", sort=False).total_bytes.apply(lambda t: t.is_monotonic_decreasing).all()

# %% [markdown]
# Full fine-tuning pays 16 bytes a parameter before any activation, so a T4 stops near half a billion
# parameters; LoRA keeps a 16-bit base, and QLoRA's 4-bit base is how a 7B model fits. On a GPU, count more than
# the formula: CUDA's context and the allocator's caching are not in it.
#
# ## 7. Merged inference
# Unmerged, every adapted layer adds two thin matmuls to each forward. `lora.merge_and_unload(model)` merges each
# update into its weight and puts the plain Linear back: the base model's layers and latency, the unmerged
# model's outputs up to float rounding. One forward pass over test prompts is timed; the base is timed twice,
# interleaved, and the gap between its two timings is the noise the printed line compares against.

# %%
merged = lab.merge_comparison(cfg, rank=8)  # the fine-tuned rank-8 q_proj,v_proj model from the sweep (cached)
merged

# %% jupyter={"source_hidden": true} tags=["check"]
# check: merging changes the outputs by float rounding only and removes every LoRA layer
times = merged.frame
assert times.max_output_diff.iloc[2] < 1e-3 and times.lora_layers.iloc[2] == 0 < times.lora_layers.iloc[1]
assert times.latency_s.gt(0).all() and len(times) == 4

# %% [markdown]
# Keep adapters unmerged when one base serves several tasks or to train again; merge for a single deployed model.
# A 4-bit base cannot be merged in place: dequantize it first, or serve unmerged.
#
# ## 8. Your turn: the panel
# Choose rank, targets and alpha, and press **Run**; each run adds a point (trainable parameters, peak memory,
# exact match against rank, one line per target set). Try rank 1 and 64 on `q_proj,v_proj`, then alpha 4 and 64
# at rank 8: which changes the score more?

# %%
panel = ExperimentPanel(
    run=lab.panel_run, base=lab.panel_config(cfg),
    controls={"lora_rank": (1, 64, 1), "lora_targets": list(lab.TARGETS), "lora_alpha": [4.0, 8.0, 16.0, 32.0, 64.0]},
    show=views.Trend("lora_rank", ("num_trainable_params", "peak_memory_bytes", "exact_match"), hue="targets"),
    title="LoRA")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | model does not learn | head frozen too | train the head (PEFT: `modules_to_save`) |
# | LoRA learns much slower than full | full fine-tuning's lr | a larger lr (1e-4 to 3e-3) |
# | `Target modules ... not found` | names differ (`query`, `q_proj`, fused `qkv`) | list the Linear names |
# | "Attempting to unscale FP16 gradients" | fp16 weights trained under fp16 autocast | float32 adapters |
# | memory barely falls | activations dominate | checkpointing (notebook 03), a smaller micro-batch |
# | merged outputs differ from unmerged | merged twice, or into a quantized base | merge once, into a float copy |
# | QLoRA uses more memory than bf16 LoRA | 4-bit layers return float32 | load the model in bf16 |
# | results change with rank at fixed lr | no `alpha / rank` scale | fix `alpha`, change the rank |

# %% [markdown]
# ## Going further
# - **Your own model.** Any causal LM from the hub takes `add_lora` or PEFT the same way; `lora.linear_names(model)`
#   lists its layers (Llama, Qwen, Mistral: `q_proj` ... `down_proj`; GPT-2 a fused `c_attn`; BERT `query`).
# - **DoRA** (Liu et al. 2024, `LoraConfig(use_dora=True)`); **rsLoRA** scales by `alpha / sqrt(rank)`.
# - **Several adapters on one base**: PEFT's `load_adapter` / `set_adapter`.
# - **Paged optimizers** (`paged_adamw8bit`, notebook 03) move optimizer state to CPU memory on a spike.

# %% [markdown]
# ## Summary
# - LoRA: `y = W x + b + (alpha / r) B A x`, `W` frozen, `A` Kaiming, `B` zeros; `r (in + out)` numbers a layer.
# - `add_lora` or `RunConfig(lora_rank=...)` equals PEFT; a saved adapter is a small share of the model.
# - Parameters and optimizer state shrink with LoRA; activations less. All linear layers beat q and v alone.
# - QLoRA's NF4 base takes about a quarter of bf16's bytes: it pays where weights dominate (a 7B model on a T4).
# - Merge for inference: the base model's latency, the same outputs.

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
# The next one uses **your own** sweep: the trainable parameters at two ranks on `q_proj,v_proj`. After
# answering: why does the count grow in proportion to the rank here, where a vision model's would not?

# %%
mine = sweep.own_count_numbers()
print(exercises.question("08.own_count", mine))

# %%
answer = None  # YOUR CODE: trainable parameters at the new rank
exercises.check("08.own_count", answer, mine)

# %%
print(exercises.question("08.adam_state"))

# %%
answer = None  # YOUR CODE: MB
exercises.check("08.adam_state", answer)

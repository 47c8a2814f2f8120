# %% [markdown]
# # Language models: what makes their fine-tuning fast and small
#
# Most fine-tunes people bring to a free GPU are language models, and language models spend their time and memory
# in places a vision model does not: tokens, padding, the attention over a sequence, logits as wide as the
# vocabulary, and the cache that generation keeps. This notebook measures each on small Llama-style models
# (RMSNorm, RoPE, SwiGLU) built from transformers' `LlamaConfig`. Speed and memory do not depend on the weights, so
# most runs start from random ones.
#
# **You will learn**
# 1. tokens against characters, and a batch counted in tokens;
# 2. tokens/s and FLOPs per token (6 N plus attention), checked against PyTorch's FLOP counter, and what MFU needs;
# 3. how sequence length drives memory, and what SDPA saves over eager attention;
# 4. padding against packing on real text, and the pitfall that lets packed documents see each other;
# 5. gradient accumulation that is exact for token losses (and the bug that is not);
# 6. the logits' memory and chunked cross-entropy;
# 7. per-layer checkpointing, fused AdamW and `torch.compile` on a language model;
# 8. the KV cache at inference, and what grouped-query attention saves;
# 9. a speed ladder that stacks them, one rung at a time;
# 10. what fits a T4: full fine-tuning, LoRA, QLoRA.
#
# **What you need:** notebooks 00 (the four numbers), 01 (mixed precision) and 03 (checkpointing). A CPU is fine:
# tokens, FLOPs and memory are counted exactly. Times on a CPU are this machine's: compile, fused kernels and SDPA
# pay off most on a GPU, and each finding calls a time difference real only outside the spread it measured.

# %%
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import labkit
from labkit import display, guesses, text, views
from labkit.labs import language as lab  # this notebook's experiments and findings
from labkit.labs.language import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import chunked_loss, token_loss
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
labkit.env_report()

# %% [markdown]
# ## 1. Tokens
# A model reads token ids, not characters. The digit tasks use one token per character; real text goes through
# a byte-level BPE (here trained by labkit on the Python documentation that every Python install carries).
# Fewer tokens per paragraph means fewer positions to compute, so the tokenizer sets the cost of every step.

# %%
counts = lab.token_counts()
counts

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the BPE needs fewer tokens than characters; padding counts as tokens
by, batch = counts.frame.set_index("tokenization"), counts.batch
assert by.loc["pydoc_bpe", "median_tokens"] < by.loc["characters", "median_tokens"], "BPE needs fewer tokens"
assert batch["real_tokens"] < batch["tokens"] == batch["rows"] * batch["width"]

# %% [markdown]
# A batch's size in a language model is **rows x sequence length** tokens, and padding counts as tokens the model
# computes. Learning-rate and batch-size advice for language models is given in tokens per step for that reason.
#
# ## 2. Tokens/s and FLOPs per token
# A training step costs about **6 N** FLOPs per token for N weights in matrix multiplies (2 forward, 4 backward),
# plus attention, which grows with the sequence length L: $12 \times \text{layers} \times \text{hidden} \times L$
# per token (Kaplan et al. 2020). MFU, the model FLOP utilisation of the PaLM paper, divides the achieved model
# FLOP/s by the device's datasheet peak. **Predict first:** what share of the FLOPs is attention at L = 64 here?

# %%
guess_attention_share = None  # YOUR GUESS: e.g. 0.3

# %%
flops = lab.flops_check()
print(guesses.versus(guess_attention_share, flops.row.attention_share, "attention's share of the FLOPs"))
flops

# %%
display.table(labkit.results.published("10_language_models-mfu*"))  # MFU as PaLM defined it (not measured here)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: 6 N + attention equals the FLOP counter's count
assert abs(flops.row.formula_over_counted - 1) < 0.05, "6N + attention matches the FLOP counter"

# %% [markdown]
# The counter runs the step and counts every matrix multiply, so the formula is checked, not assumed. It has no
# formula for the CPU's fused SDPA kernel; labkit adds that term on a CPU (this check uses eager attention). A CPU
# has no datasheet peak, so MFU stays empty here; on a GPU every language-model run reports it.
#
# ## 3. Sequence length, memory and attention
# Eager attention writes out the probabilities $\mathrm{softmax}(QK^T)$: rows x heads x $L^2$ values per layer,
# kept for the backward pass. PyTorch's `scaled_dot_product_attention` (SDPA) computes the same result without
# storing them. **Predict first:** doubling L, by what factor do eager's extra activations grow?

# %%
guess_growth = None  # YOUR GUESS: e.g. 2

# %%
attention = lab.attention_memory()
print(guesses.versus(guess_growth, 2 ** attention.growth_exponent(), "growth of eager's extra memory per 2x L"))
attention

# %% jupyter={"source_hidden": true} tags=["check"]
# check: eager's extra memory grows about as L^2
assert (attention.extra_bytes > 0).all() and 1.6 < attention.growth_exponent() < 2.4, "quadratic in L"

# %% [markdown]
# The extra memory grows with $L^2$. It can stay below the probabilities' count: memory peaks during the backward
# pass, and the layers already back-propagated have freed theirs by then. At a few thousand tokens the $L^2$ term
# dominates a step's memory: SDPA is the first switch to turn on, and transformers uses it by default
# (`attn_implementation="sdpa"`); its GPU kernels keep no $L \times L$ matrix (which one runs: Going further).
#
# ## 4. Padding against packing
# Text comes in uneven lengths. **Padding** makes a batch rectangular with pad tokens the model still computes;
# **packing** puts whole documents end to end in a row. Packed documents must not attend to each other: position
# ids restart at each document, and transformers then masks across them.

# %%
packing = lab.packing_runs()
packing

# %%
display.table(labkit.results.published("10_language_models-packing*"))  # on A100s, published (not measured here)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: packing pads least
pk = packing.set_index("packing")
assert pk.pad_fraction["pack"] < pk.pad_fraction["pad"] <= pk.pad_fraction["pad_max"], "packing pads least"

# %% [markdown]
# Real tokens/s is what trains the model; tokens/s counts the padding too. The **pitfall**: in training mode a
# transformers model still builds a KV cache unless told not to, and with a cache it cannot tell the packed
# documents apart. The check below packs four paragraphs in one row and compares the logits with each paragraph
# run alone:

# %%
cross = lab.cross_document_check()
cross

# %% jupyter={"source_hidden": true} tags=["check"]
# check: without a cache the packed documents stay apart; with one they do not
assert cross.row.max_logit_diff_cache_off < 1e-4 < cross.row.max_logit_diff_cache_on, "use_cache=False in training"

# %% [markdown]
# labkit passes `use_cache=False` with packed rows; in your own loop, do the same.
#
# ## 5. Gradient accumulation for token losses
# A language model's loss is a mean over label tokens, and micro-batches hold different numbers of them. Dividing
# each micro-batch's *mean* by `grad_accum` weights a token in a short micro-batch more than one in a long one.
# **Predict first:** do 4 micro-batches of 2 rows give the gradient of one batch of 8? Guess how far off, relative
# to the batch's gradient, the old rule lands (0: exactly equal).

# %%
guess_old_error = None  # YOUR GUESS: e.g. 0.01

# %% [markdown]
# The fix is two lines: sum the token losses, and divide by the label tokens of the **whole** step (transformers'
# Trainer passes this count as `num_items_in_batch` since late 2024):

# %%
def accumulate(model, micro_batches):
    total = sum(micro.counts().label_tokens for micro in micro_batches)  # the whole step's label tokens
    for micro in micro_batches:
        logits = model(**token_loss.forward_inputs(micro)).logits
        loss_sum = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), micro.labels[:, 1:].flatten(),
                                   ignore_index=-100, reduction="sum")  # position t predicts token t + 1
        (loss_sum / total).backward()


# %%
rules = lab.accumulation_rules(accumulate=accumulate)
print(guesses.versus(guess_old_error, rules.error("old"), "the old rule's relative gradient error"))
rules

# %%
display.table(labkit.results.published("10_language_models-accumulation*"))  # the 2024 fix in transformers

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the old rule is off; labkit's and yours equal the large batch
assert rules.error("old") > 0.01 and rules.error("labkit") < 1e-5 and rules.error("yours") < 1e-5

# %% [markdown]
# Your `accumulate` is the engine's rule (`labkit.techniques.token_loss`), checked against it above.
#
# ## 6. Logits and chunked cross-entropy
# The logits are rows x length x vocabulary values, upcast to float32 for the loss, and their gradient is as
# large. The table computes them for 4 x 512 tokens and a few vocabularies (Llama 2's has 32,000 tokens, Llama 3's
# 128,256): compare them with the weights of the model that produces them.

# %%
lab.logits_sizes()

# %% [markdown]
# Chunked cross-entropy computes the output layer and the loss a slice of the sequence at a time, each slice under a
# checkpoint so its logits are recomputed in the backward pass instead of kept. **Predict first:** with 8 chunks,
# what fraction of one cross-entropy's peak remains?

# %%
guess_chunk_peak = None  # YOUR GUESS: e.g. 0.5


def slice_loss(h, y, weight):  # one slice's logits exist only inside this call
    logits = F.linear(h, weight).float()
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")


def chunked_loss_sum(hidden, head, labels, chunks):
    hidden, targets = hidden[:, :-1], labels[:, 1:]  # position t predicts token t + 1
    total = 0
    for h, y in zip(hidden.chunk(chunks, dim=1), targets.chunk(chunks, dim=1), strict=True):
        total = total + torch.utils.checkpoint.checkpoint(slice_loss, h, y, head.weight, use_reentrant=False)
    return total


# %%
peaks = lab.chunked_loss_peaks(loss_fn=chunked_loss_sum)
print(guesses.versus(guess_chunk_peak, peaks.peak_ratio.iloc[-1], "peak with 8 chunks / one cross-entropy"))
peaks

# %% jupyter={"source_hidden": true} tags=["check"]
# check: chunks give the same loss and gradients with less memory; yours equals labkit's
assert (peaks.loss_diff < 1e-5).all() and (peaks.grad_diff < 1e-4).all(), "same loss and gradients"
assert peaks.peak_ratio.iloc[-1] < 0.6, "chunks keep a fraction of the logits"
h, hd = torch.randn(2, 9, 8, requires_grad=True), torch.nn.Linear(8, 20, bias=False)
y = torch.randint(0, 20, (2, 9))
assert torch.allclose(chunked_loss_sum(h, hd, y, 4), chunked_loss.chunked_loss_sum(h, hd, y, 4), rtol=1e-5)

# %% [markdown]
# The price is one more output-layer matmul per slice in the backward pass, which shows as time on a CPU. Liger
# Kernel's fused linear cross-entropy does the same in one GPU kernel. In labkit: `RunConfig(loss_chunks=8)`.
#
# ## 7. Checkpointing, fused AdamW and compile
# Three switches: per-decoder-layer checkpointing (`RunConfig(checkpointing=True)`, transformers'
# `activation_checkpointing_enable`, named `gradient_checkpointing_enable` before version 5), AdamW's kernels
# (`optimizer_impl`: a Python for-loop, `foreach` multi-tensor kernels, or one `fused` kernel), and
# `torch.compile` of each decoder layer (`compile=True`; the first step compiles, and labkit reports that time
# apart from the step time).

# %%
ckpt = lab.checkpointing_runs()
ckpt

# %%
kernels = lab.optimizer_kernels()
kernels

# %%
compiled = lab.compile_runs()  # the ladder's "+fused AdamW" rung (section 9) eager, then compiled
compiled

# %% jupyter={"source_hidden": true} tags=["check"]
# check: checkpointing keeps fewer activations; every AdamW kernel ran
on, off = ckpt.frame.set_index("run").activation_bytes[["checkpointing=on", "checkpointing=off"]]
assert on < 0.8 * off, "checkpointing keeps fewer activations"
assert set(kernels.impl) == set(labkit.choices.OPTIMIZER_IMPLS) and (kernels.step_time_s > 0).all()

# %% [markdown]
# A first compile takes tens of seconds; Inductor caches the kernels on disk, so the same shapes compile again in
# seconds (the line above says which). Compiling pays back over many steps, mostly on a GPU (fused
# operations save memory traffic); on a CPU the gain is often inside the noise.
#
# ## 8. The KV cache at inference
# Generating token t+1 needs the keys and values of every earlier token. The **KV cache** keeps them, so each new
# token costs one position's work instead of the whole prefix's: 2 (K and V) x layers x KV heads x head size
# values per token. Grouped-query attention (GQA) shares each K/V head among several query heads.

# %%
generation = lab.generation_speed()
generation

# %%
gqa = lab.gqa_cache_sizes()
gqa

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the cache changes no token and holds what the formula says
g = generation.frame.set_index("use_cache")
assert bool(g.same_tokens.all()) and g.cache_bytes[True] == g.formula_cache_bytes[True] > 0
assert (gqa.bytes_per_token == gqa.measured_bytes_per_token).all()

# %% [markdown]
# Without a cache each new token reruns the whole prefix, so the gap widens with the length generated. The same
# formula for two published configurations (32 layers, 32 query heads of 128 values, fp16; Llama 2 7B keeps 32 KV
# heads, Llama 3 8B 8):

# %%
for name, kv_heads in (("Llama 2 7B", 32), ("Llama 3 8B", 8)):
    config = SimpleNamespace(num_hidden_layers=32, num_key_value_heads=kv_heads, head_dim=128)
    print(f"{name}: {lab.cache_bytes_per_token(config, bytes_per_value=2) / 2**20:.3g} MiB per token")

# %% [markdown]
# At thousands of tokens per sequence that is gigabytes per sequence: that is why long contexts use GQA.
#
# ## 9. The speed ladder
# One configuration, one change per rung: precision (`auto`: bf16 where native, fp16 on a T4, fp32 on a CPU
# without bf16), SDPA, packing, fused AdamW, compile, then checkpointing and chunked loss spent on a batch twice
# as large. **Predict first:** how many times the baseline's real tokens/s will the top rung reach here?

# %%
guess_top_speedup = None  # YOUR GUESS: e.g. 3

# %%
ladder = lab.speed_ladder()  # lab.speed_config(batch_size=8, seq_len=64); its two compile rungs ran in section 7
top = ladder.real_tokens_per_s.iloc[-1] / ladder.real_tokens_per_s.iloc[0]
print(guesses.versus(guess_top_speedup, top, "top rung's real tokens/s / the baseline's", "x"))
ladder

# %% jupyter={"source_hidden": true} tags=["check"]
# check: every rung ran
assert ladder.frame.error.isna().all() and (ladder.frame.real_tokens_per_s > 0).all()

# %% [markdown]
# Published figures for scale, from fused Triton kernels and from `torch.compile` on GPUs (not measured here):

# %%
display.table(labkit.results.published("10_language_models-fused*", "09_recipe-compile*"))

# %% [markdown]
# On a GPU the early rungs (precision, SDPA, packing) usually matter most; on a CPU without native bf16 the
# precision rung changes nothing, and compile and fused kernels matter less. Your turn: choose the settings and
# press **Run**; each run adds bars next to the earlier ones.

# %%
panel = ExperimentPanel(
    run=labkit.results.cached_fit,
    controls={"packing": list(text.PACKINGS), "attn_implementation": list(labkit.choices.ATTN_IMPLEMENTATIONS),
              "optimizer_impl": list(labkit.choices.OPTIMIZER_IMPLS), "loss_chunks": [None, 2, 4, 8],
              "checkpointing": [False, True]},
    base=lab.speed_config(batch_size=8, seq_len=64),
    show=views.History(("step_time_s", "memory_breakdown", "tokens_per_s")), title="Language-model speed")
panel

# %% [markdown]
# ## 10. What fits a T4
# The same counts by formula for real models (checked against labkit's measured peaks): weights, gradients, AdamW's
# state, activations, logits. LoRA trains adapters on a frozen 16-bit base; QLoRA stores it in 4 bits.
# **Predict first:** how many GiB does a 7B model need with QLoRA?

# %%
guess_qlora_7b_gib = None  # YOUR GUESS: e.g. 10

# %%
fits = lab.t4_fits()  # 512 tokens x 4 rows, fp16, per-layer checkpointing, rank-16 adapters on every linear layer
qlora_7b = fits.set_index(["model", "method"]).total_bytes["Mistral-7B", "QLoRA"] / 2**30
print(guesses.versus(guess_qlora_7b_gib, qlora_7b, "a 7B model's QLoRA memory", " GiB"))
fits

# %% jupyter={"source_hidden": true} tags=["check"]
# check: each method needs less than the one before it
by_model = fits.frame.groupby("model", sort=False).total_bytes
assert by_model.apply(lambda t: t.is_monotonic_decreasing).all(), "full > LoRA > QLoRA"

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | out of memory only at long sequences | eager attention's $L^2$, or the logits | SDPA, chunked loss, checkpointing |
# | loss moves when only `grad_accum` changes | micro-batch mean loss / `grad_accum` | sum / the step's tokens |
# | packed training worse than padded | documents attend to each other | restart position ids, `use_cache=False` |
# | most of a batch is padding | padding every row to the maximum length | pad to the batch's longest, or pack |
# | compile makes the run slower | compile time counted, new shapes recompile | fixed shapes, long runs |
#
# `labkit.troubleshoot.explain(error, cfg)` reads an out-of-memory error against the run's own numbers. What it
# says for this notebook's run at 256 tokens with eager attention:

# %%
oom = labkit.troubleshoot.explain(torch.OutOfMemoryError("CUDA out of memory"),
                                  lab.speed_config(seq_len=256, attn_implementation="eager"))
print(oom)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the doctor names the run's shape and the switches that shrink it
assert oom.problem and "256 tokens" in oom.cause and "attn_implementation='sdpa'" in oom.remedy

# %% [markdown]
# ## Going further
# - **Longer sequences.** `lab.attention_memory(seq_lens=(64, 128, 256))` goes up to the model's 256 positions;
#   the $L^2$ term takes a growing share of each step.
# - **SDPA's GPU kernels**: FlashAttention on sm_80+ GPUs for a batch without a mask; the memory-efficient kernel
#   on a T4 (sm_75) and for padded or packed batches. Neither keeps the $L^2$ matrix.
# - **LoRA and QLoRA** on this model are notebook 08's subject.

# %% [markdown]
# ## Summary
# - Count in tokens: rows x length, and real tokens apart from padding.
# - A step costs about 6 N FLOPs per token plus attention; MFU compares that with the datasheet peak.
# - Eager attention keeps $L^2$ probabilities; SDPA does not.
# - Pack real text, restart position ids, and train with `use_cache=False`.
# - Accumulate token losses as sums over the whole step's label tokens.
# - Logits are rows x length x vocabulary in float32: chunk the loss when they dominate.
# - The KV cache makes generation linear in the tokens generated; GQA shrinks it.

# %% [markdown]
# ## Further reading
# - Kaplan et al. 2020, *Scaling Laws for Neural Language Models* (6 N FLOPs per token):
#   https://arxiv.org/abs/2001.08361
# - Chowdhery et al. 2022, *PaLM* (appendix B: model FLOP utilisation): https://arxiv.org/abs/2204.02311
# - Dao et al. 2022, *FlashAttention*: https://arxiv.org/abs/2205.14135
# - Hugging Face, *Fixing Gradient Accumulation* (2024): https://huggingface.co/blog/gradient_accumulation
# - Ainslie et al. 2023, *GQA*: https://arxiv.org/abs/2305.13245
# - Hsu et al. 2024, *Liger Kernel* (fused linear cross-entropy): https://arxiv.org/abs/2410.10989

# %% [markdown]
# ## Exercises
# The first asks for code: gradient accumulation that equals one large batch. The checker compares your gradients
# with one step on all the rows.

# %%
print(exercises.question("10.accumulate"))


# %%
def my_accumulate(model, micro_batches):
    """Backward through each micro-batch; the summed gradients must equal one step on all their rows."""
    raise NotImplementedError  # YOUR CODE


exercises.check("10.accumulate", my_accumulate)

# %% [markdown]
# The next one uses **your own** numbers from section 4.

# %%
pad_max = packing.frame.set_index("packing").loc["pad_max"]
mine = {"pad_max_share": pad_max.pad_fraction, "pad_max_tokens_per_s": pad_max.tokens_per_s}
print(exercises.question("10.own_pad_share", mine))

# %%
answer = None  # YOUR CODE: real tokens/s
exercises.check("10.own_pad_share", answer, mine)

# %%
print(exercises.question("10.logits_gib"))

# %%
answer = None  # YOUR CODE: GiB
exercises.check("10.logits_gib", answer)

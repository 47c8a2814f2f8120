# %% [markdown]
# # Your fine-tune, from data to launch
#
# Notebooks 00-10 measured each technique on labkit's models. This one takes **yours**: a hub id or a folder with a
# `config.json`, and your data file, then answers the questions to ask before paying for a GPU. Is the loss on the
# tokens you meant? Which of full fine-tuning, LoRA and QLoRA fits your GPU, at which length and batch? How far can
# the prediction be trusted? Which techniques pay off on your model? Which settings, as YAML or as TRL and PEFT
# arguments? At `ci` and `quick` it runs offline on a model built from Qwen2.5-0.5B's config at CPU widths and on
# data it writes itself, with a fault planted for the audit to find; at `full` it takes Qwen2.5-0.5B and 1,000 chats
# of the Capybara dataset from the hub.
#
# **You will learn**
# 1. to audit your data through your tokenizer: lengths, truncation, padding, the share of tokens trained, EOS;
# 2. to compute what is trained from the labels yourself, and to find a planted fault;
# 3. to plan full, LoRA and QLoRA from a config alone, for a T4 or any GPU, before downloading weights;
# 4. to measure a few steps, longest batch first, and read the prediction's error;
# 5. to climb the speed ladder on your model, a rung counted only outside the noise;
# 6. to turn it into a recommended run (labkit YAML, TRL `SFTConfig`, PEFT `LoraConfig`) and train it.
#
# **What you need:** notebooks 03 (memory), 08 (LoRA, QLoRA) and 10 (language models). A CPU is fine: the audit,
# the plan and the memory counts are exact there; times are this machine's, and a T4's differ.

# %%
import pprint

import pandas as pd

import labkit
from labkit import guesses, plots
from labkit.labs import your_finetune as lab  # this notebook's model, data and workload
from labkit.labs.your_finetune import exercises  # this notebook's exercises: question, check, solution
from labkit.text import IGNORE_INDEX
from labkit.widgets import FinetuneForm

P = labkit.profile()  # read once; nothing below branches on it
W = lab.workload(P)  # your model, data and ladder rungs for this profile: replace W.model and W.data with yours
labkit.env_report()

# %% [markdown]
# ## 1. Your model and data
# `labkit.Finetune` takes what TRL and PEFT users already have: a model id (`Qwen/Qwen2.5-0.5B`) or a folder holding
# its `config.json`, a data file (`.jsonl`, `.json`, `.csv`, `.parquet`) or `hf:ORG/NAME`, and the GPU you will
# train on (`t4`, `kaggle-2xt4`, `this`, or a size such as `24GiB`). Nothing runs until you ask. The data's shape
# comes from its columns: `text`, `prompt` + `completion` (the loss on the completion), `messages` (the loss on the
# assistant's turns), Alpaca, ShareGPT.

# %%
print(f"model: {W.model}\ndata:  {W.data}\nthe other shapes written here: {list(W.shapes)}")
mine = labkit.Finetune(W.model, data=W.data, gpu=W.gpu, batch_size=8)
arch = mine.shape  # what the plan reads from config.json
print(f"{arch.num_hidden_layers} layers of width {arch.hidden_size}, {arch.num_attention_heads} heads "
      f"({arch.num_key_value_heads} for K/V), vocabulary {arch.vocab_size}: {arch.num_parameters() / 1e6:.3g}M "
      "parameters")

# %% [markdown]
# ## 2. The audit: what is trained?
# A fine-tune can fail silently: the loss falls while no useful token is trained, or the model never learns to
# stop. The audit reads your data through your tokenizer before any GPU time is spent. **Predict first:** what share
# of the tokens carries a loss here (the rest is prompt, template and user turns)?

# %%
guess_supervised = None  # YOUR GUESS: e.g. 0.5

# %%
audit = mine.audit()
print(audit.example)  # one example decoded, the trained tokens between [[ and ]]
audit

# %% [markdown]
# The mechanism is the labels: a token whose label is -100 (`IGNORE_INDEX`) carries no loss. Counting them by
# hand, over each example as a run at `seq_len` keeps it:

# %%
kept = [labels[:mine.seq_len] for _, labels in mine.encoded.examples]  # each example's labels, cut at seq_len
trained = sum(sum(label != IGNORE_INDEX for label in labels) for labels in kept)
supervised = trained / sum(len(labels) for labels in kept)
print(guesses.versus(guess_supervised, supervised, "the share of tokens trained"))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the share counted by hand is the audit's; the example marks trained tokens
assert f"{supervised:.1%}" == audit.frame.set_index("check").loc["supervised", "value"], "same share as the audit"
assert "[[" in audit.example and 0 < supervised < 1

# %% [markdown]
# The other shapes, and a file with a **planted fault**: prompt/completion pairs whose prompts are longer than the
# `seq_len` a learner first chose (`lab.SEQ_LEN`). Find it before reading on:

# %%
audits = {shape: labkit.Finetune(W.model, data=path, gpu=W.gpu, seq_len=lab.SEQ_LEN).audit(packing=False)
          for shape, path in W.shapes.items()}
for shape, result in audits.items():
    print(f"{shape}:\n{result.finding()}\n")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the planted fault is found, and only there
assert {"truncated", "supervised"} <= set(audits["seeded fault"].faults), "the planted fault is found"
assert not audits["prompt/completion"].faults and not audits["messages"].faults

# %% [markdown]
# Cut at `seq_len` from the right, a long prompt leaves no completion token: every example would be dropped, and
# with a collator that keeps them the loss is computed on nothing. Where a chat template has no
# `{% generation %}` marks, TRL's `assistant_only_loss=True` trains nothing either; labkit finds the assistant turns
# itself and the audit warns (the `chat template` row). The `EOS trained` row guards the model that never stops:
# a collator that masks the pad id masks EOS too where pad equals EOS.
#
# ## 3. The plan: what fits?
# The plan predicts each method's peak memory by category (weights, adapters, gradients, AdamW's state,
# activations, logits, and 10 % for the CUDA allocator on a GPU) at the data's p90, p99 and longest lengths, from
# `config.json` alone. **Predict first:** on a T4, how many GiB does a 7B model (Qwen2.5-7B) need at best?

# %%
guess_7b_gib = None  # YOUR GUESS: e.g. 10

# %%
plan = mine.plan()
big = labkit.Finetune("Qwen/Qwen2.5-7B", data=W.data, gpu="t4", batch_size=8).plan()  # its shipped config alone
print(guesses.versus(guess_7b_gib, big.frame.knob_total_bytes.min() / 2**30, "the 7B's smallest plan", " GiB"))
print(big.finding())
plan

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the 7B's full fine-tune never fits a T4, its QLoRA does; every plan row of yours was predicted
by = big.frame.groupby("method").fits.agg(set)
assert by["full"] == {"no"} and "no" not in by["QLoRA"] and (plan.frame.total_bytes > 0).all()

# %% [markdown]
# Where a row does not fit, the plan tries per-layer checkpointing, then 8-bit AdamW, then the chunked loss, then a
# smaller micro-batch with accumulation, and names the first that makes it fit. Epoch times assume 35 % of the
# GPU's datasheet FLOP/s: the measurement below gives yours.
#
# ## 4. Measure: predicted against measured
# `measure()` trains a few steps of each method with every row padded to your **longest** example, so an
# out-of-memory shows at step 1, not after 100 steps. The stated accuracy of the prediction: within **+-10 %** of the
# measured peak and never more than 5 % under, from 24 measured rows (README, "Your fine-tune"). On a GPU the
# allocator adds its own rounding, which the plan's 10 % covers. **Predict first:** how far off will the worst
# method be (0.05: 5 %)?

# %%
guess_error = None  # YOUR GUESS: e.g. 0.05

# %%
measured = mine.measure(methods=("full", "lora", "qlora"))
ran = measured.frame.dropna(subset=["peak_memory_bytes"])
print(guesses.versus(guess_error, ran.error.abs().max(), "the largest |predicted / measured - 1|"))
both = pd.concat([ran.assign(peak="predicted", peak_memory_bytes=ran.predicted_bytes), ran.assign(peak="measured")])
plots.bar(both, "method", "peak_memory_bytes", hue="peak")
measured

# %% jupyter={"source_hidden": true} tags=["check"]
# check: full and LoRA ran; each prediction is within a band that holds on a GPU's allocator too
assert {"full", "LoRA"} <= set(ran.method) and (ran.error.abs() < 0.35).all(), ran[["method", "error"]]

# %% [markdown]
# A prediction a few percent over is the formula's margin for what it cannot see; one further off is a reason to
# read the measured categories (`measured.frame`). A QLoRA row that did not run says why: NF4 needs bitsandbytes'
# kernels for this device.
#
# ## 5. The ladder on your model
# Notebook 10 climbed a speed ladder on its own model; here the rungs of `labkit.finetune.ladder.RUNGS` run on
# yours, each one change over the rung below, its time per real token counted only outside the noise it measured.
# Packing is a rung only where the audit found no leak between packed documents; `W.rungs` is this profile's choice
# (compile's first build alone takes a CPU about a minute), and `mine.ladder()` climbs them all. **Predict first:**
# how many rungs will be faster than the one below, outside the noise?

# %%
guess_faster_rungs = None  # YOUR GUESS: e.g. 2

# %%
ladder = mine.ladder(rungs=W.rungs)
faster = int(ladder.frame.real.eq(True).sum())  # rungs faster than the one below, outside the noise
print(guesses.versus(guess_faster_rungs, faster, "rungs faster outside the noise"))
ladder

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the baseline and every full rung ran
assert ladder.frame[ladder.frame.method == "full"].error.isna().all(), ladder.frame[["rung", "error"]]

# %% [markdown]
# On a CPU without native bf16 the precision rung changes nothing, and SDPA or compile may be slower on a model this
# small; on a T4 the early rungs usually pay most. The `published` column quotes the figures others measured, on
# their GPUs.
#
# ## 6. The recommendation, and a run
# The recommendation takes the plan's row at your p99 (one example in a hundred cut) and the first method that fits
# there, with the knobs it needed, and writes it for labkit and for TRL, PEFT and bitsandbytes:

# %%
rec = mine.recommend()
print(rec.yaml())
for name, kwargs in {"SFTConfig": rec.sft, "LoraConfig": rec.lora, "BitsAndBytesConfig": rec.bnb}.items():
    print(f"{name}(**{pprint.pformat(kwargs, width=80)})")
rec

# %%
run = mine.train(out_dir=W.folder / "trained", max_steps=W.train_steps)  # the recommendation, trained here
print(f"{run.steps} steps, loss {run.losses[0]:.3g} -> {run.losses[-1]:.3g}")
print("saved:", *sorted(p.name for p in (W.folder / "trained").iterdir()))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the recommended run trained and saved its weights or adapter
assert run.ok and run.steps > 0 and any((W.folder / "trained").iterdir())

# %% [markdown]
# On a CPU, `train` runs the recommendation in this machine's precision; on the target GPU it runs as written. With
# TRL, pass `rec.sft` to `SFTConfig`, `rec.lora` to `LoraConfig` and `rec.bnb` to `BitsAndBytesConfig`.
#
# ## 7. Your form
# Type your model id or folder, your data and your GPU. Moving `seq_len`, `batch_size` or `method` replans at once
# (no weights); **Run (measure)** trains a few steps of the chosen methods here and charts them beside the plan's
# prediction.

# %%
form = FinetuneForm(W.model, W.data, gpu=W.gpu, seq_len=rec.config.get("seq_len", lab.SEQ_LEN), batch_size=8)
form

# %% jupyter={"source_hidden": true} tags=["check"]
# check: a slider replans, the button measures
form.controls["seq_len"].value = 192
assert type(form.last_result).__name__ == "Plan" and form.last_error is None
form.controls["method"].value = "LoRA"
form.measure()
assert type(form.last_result).__name__ == "Measurement" and form.last_error is None

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | loss falls, the model learns nothing | every label masked (prompts cut, no marks) | the audit's `supervised` row |
# | the fine-tuned model never stops | EOS masked because pad equals EOS | EOS kept in the labels (`EOS trained`) |
# | packed training worse than padded | documents attend to each other | the `packing leak` row; restart position ids |
# | out of memory after 100+ steps | one long example meets the logits or attention | longest batch first; p99 seq_len |
#
# The same from a shell, for a script or CI: `labkit audit MODEL --data my.jsonl` (exit 1 on a fault), `labkit plan
# MODEL --data my.jsonl --gpu t4`, `labkit measure ...`, `labkit recommend ... --export trl`.

# %% [markdown]
# ## Going further
# - **Kaggle's two T4s:** `gpu="kaggle-2xt4"` plans each GPU holding a whole copy under DDP (notebook 07) and halves
#   the epoch time.
# - **The loss's place:** `loss_on="all"` trains the prompt too; `data_columns={"prompt": "question", "completion":
#   "answer"}` maps other column names.
# - **The whole ladder:** `mine.ladder()` runs every rung, compile included.

# %% [markdown]
# ## Summary
# - Audit first: lengths, truncation, padding, the share trained, EOS, the template; read the `[[ ]]` example.
# - Plan from the config: which method fits, at which length and batch, with which knob.
# - Measure the longest batch first; trust the prediction to its stated error.
# - Keep a technique only where it beats the rung below outside the noise, on your model.
# - Launch the recommendation: labkit YAML, or TRL and PEFT arguments.

# %% [markdown]
# ## Further reading
# - Hu et al. 2021, *LoRA*: https://arxiv.org/abs/2106.09685
# - Dettmers et al. 2023, *QLoRA*: https://arxiv.org/abs/2305.14314
# - Dettmers et al. 2022, *8-bit Optimizers via Block-wise Quantization*: https://arxiv.org/abs/2110.02861
# - TRL, *SFT Trainer* (data shapes, `completion_only_loss`, `assistant_only_loss`, packing):
#   https://huggingface.co/docs/trl/sft_trainer
# - Hugging Face, *Chat templates* (generation marks): https://huggingface.co/docs/transformers/chat_templating

# %% [markdown]
# ## Exercises
# The first asks for code: the audit's padding share. The checker compares yours with the audit's.

# %%
print(exercises.question("11.pad_share"))


# %%
def my_pad_share(lengths, batch_size):
    """The share of padding when these rows, in this order, are batched and padded to each batch's longest."""
    raise NotImplementedError  # YOUR CODE


exercises.check("11.pad_share", my_pad_share)

# %% [markdown]
# The next one uses **your own** numbers from section 4.

# %%
full = measured.frame.set_index("method").loc["full"]
mine = {"tokens_per_s": full.tokens_per_s, "real_tokens_per_s": full.real_tokens_per_s}
print(exercises.question("11.own_padding", mine))

# %%
answer = None  # YOUR CODE: a share between 0 and 1
exercises.check("11.own_padding", answer, mine)

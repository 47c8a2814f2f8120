# %% [markdown]
# # Distributed data parallel: one model, several processes
#
# Data parallelism trains one model on several devices: every process holds a copy, takes its share of each
# batch, and the processes average their gradients before each optimizer step, so all take the same step.
# PyTorch's `DistributedDataParallel` (DDP) runs one process per device, started by `torchrun`. Here you
# launch real multi-process jobs from the notebook.
#
# **You will learn**
# 1. why `DataParallel` is slower than DDP;
# 2. DDP in plain PyTorch, checked weight for weight against labkit's engine; launching torchrun from a
#    notebook;
# 3. scaling: efficiency T1 / (N x TN), all-reduce time, gradient buckets, `no_sync` under accumulation;
# 4. what ends a job when a rank dies or hangs;
# 5. FSDP2's `fully_shard` for a model too big to copy;
# 6. a language model on two processes (Kaggle's 2 x T4), and the token-count trap.
#
# **What you need:** notebooks 00 and 02. A CPU is fine: jobs run as CPU processes over gloo (their timings show
# little but noise). On two or more GPUs the same cells use one GPU per process over NCCL; with one GPU (Colab)
# the jobs run as CPU processes.

# %%
import torch

import labkit
from labkit import display, guesses, plots, views
from labkit import launcher  # torchrun jobs from the notebook: launch, run_script
from labkit.labs import distributed as lab  # this notebook's experiments, each a result: table and finding
from labkit.labs.distributed import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import distributed
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
cfg = lab.workload(P)  # tiny_vit (LayerNorm, no BatchNorm) on the offline data; the profile's workload at full
print(f"{cfg.model}, global batch {cfg.batch_size}, {cfg.max_steps} steps; this machine runs up to "
      f"{launcher.max_processes(labkit.env.resolve_device(cfg.device).type)} processes per job")
labkit.env_report()

# %% [markdown]
# ## 1. DataParallel or DistributedDataParallel
# `torch.nn.DataParallel(model)` is one line and one process. Every step it copies the model from GPU 0 to every
# GPU, runs the copies in Python threads and gathers the outputs on GPU 0, which works more and holds more memory
# than the others. DDP runs **one process per GPU**: each keeps its copy for the whole run, and the processes only
# exchange gradients, overlapped with the backward pass. PyTorch's documentation recommends DDP even on one
# machine. With two or more GPUs the next cell measures both; elsewhere it says why not:

# %%
dp = lab.dp_vs_ddp(cfg)
dp  # the finding alone without two GPUs

# %% [markdown]
# ## 2. The mechanism in plain PyTorch
# A DDP job is N copies of one script, started together. Each copy is a **rank** (0 to N-1) and reads its rank and
# the world size from `torchrun`'s variables. The whole mechanism: join the process group, wrap the model, give
# each rank its share of every epoch, and train as usual; DDP averages the gradients inside `loss.backward()`.

# %%
# %%writefile ddp_plain.py
import os
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler
from labkit.data import make_loader
from labkit.labs.distributed.plain import plain_exit, plain_setup, plain_summary, plain_write

# %%
# %%writefile -a ddp_plain.py
local_rank = int(os.environ["LOCAL_RANK"])  # this process's index on its machine, set by torchrun
gpu = torch.cuda.is_available()  # one GPU per process (--nproc_per_node = GPUs), else CPU processes
device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)  # before the process group: NCCL binds each rank to its GPU
dist.init_process_group("nccl" if gpu else "gloo")  # joins the other ranks (rank and world size from torchrun)
cfg, split, model, to_input = plain_setup(sys.argv[1], device)  # config, data, model as labkit's fit builds them
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
sampler = DistributedSampler(range(len(split)), seed=cfg.seed, drop_last=True)  # this rank's share
loader = make_loader(split, cfg.batch_size // dist.get_world_size(), shuffle=False, sampler=sampler, drop_last=True)

# %%
# %%writefile -a ddp_plain.py
optimizer, losses = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay), []
for step in range(cfg.max_steps):
    if step % len(loader) == 0:  # a new epoch: a new order, the same on every rank
        sampler.set_epoch(step // len(loader))
        batches = iter(loader)
    images, labels = next(batches)
    loss = F.cross_entropy(model(to_input(images)), labels.to(device))
    loss.backward()  # DDP all-reduces (averages) the gradients during the backward pass
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.detach())

# %%
# %%writefile -a ddp_plain.py
summary = plain_summary(losses, model)  # every rank takes part: losses averaged over the ranks, weight digests
if dist.get_rank() == 0:  # only rank 0 saves
    plain_write(summary, sys.argv[2])
dist.destroy_process_group()
plain_exit()

# %% [markdown]
# `DistributedSampler` draws one permutation per epoch, the same on every rank (same seed), and gives rank r the
# positions r, r + N, r + 2N, ...: the shares never overlap. Without `set_epoch`, every epoch would repeat the
# first one's order. Since every rank starts from rank 0's weights and applies the same averaged gradient, the
# copies stay identical without resending weights.
#
# `launcher.run_script` starts `torchrun --standalone --nproc_per_node=2 ddp_plain.py CONFIG OUT`; `launcher.launch`
# runs labkit's engine on the same small run:

# %%
small = lab.mechanism_config()  # 8 steps of tiny_vit on the CPU: the same on every machine
mine = launcher.run_script("ddp_plain.py", small, nproc=2)
engine = launcher.launch(small, nproc=2)
print("your losses:  ", " ".join(f"{v:.4f}" for v in mine["losses"]))
print("labkit's:     ", " ".join(f"{v:.4f}" for v in engine.losses))
print(f"weights: yours {mine['weights_sha256'][0][:16]}..., labkit's {engine.distributed['weights_sha256'][0][:16]}...")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: your DDP script trains exactly what labkit's engine trains: same losses, same weights on every rank
assert torch.allclose(torch.tensor(mine["losses"]), torch.tensor(engine.losses), rtol=1e-4, atol=1e-5)
assert len(set(mine["weights_sha256"])) == 1 and len(set(engine.distributed["weights_sha256"])) == 1
assert engine.distributed["world_size"] == 2 and engine.distributed["backend"] == "gloo"

# %% [markdown]
# **Why a script?** Each rank is a fresh process that cannot import a function defined only in the kernel, and
# forking the kernel breaks once it has touched CUDA: `launch` starts torchrun on the module `labkit.worker`.
#
# ## 3. Two processes train what one does
# Inside a process group, `labkit.train.Trainer` wraps the model in DDP and takes each rank's batches from a
# `DistributedSampler`; `cfg.batch_size` stays the **global** batch. So one process and two should train the
# same model:

# %%
eq = lab.equivalence(cfg, nproc=2)
eq

# %%
fig, axes = plots.grid(2)
plots.loss_curve({"1 process": eq.one, "2 processes": eq.many}, ax=axes[0])
plots.line(eq.curves, x="step", y="loss_difference", ax=axes[1]);  # the curves on the left overlap

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the same training on 1 and 2 processes, identical weights on both ranks
assert eq.identical_weights and eq.early_difference < 1e-3  # GPUs drift a little after many steps
accuracies = [labkit.measure.Measured.accuracy(r.accuracy, P.test_size) for r in (eq.one, eq.many)]
assert labkit.measure.compare(*accuracies).real is False  # both measured, apart by no more than the test noise

# %% [markdown]
# The gap on the right is rounding: the all-reduce adds the ranks' gradients in another order. **BatchNorm**
# would widen it: each rank normalises by its own statistics (labkit uses `SyncBatchNorm` on GPUs).
#
# ## 4. Scaling
# With N processes each rank computes B/N samples per step, plus the all-reduce. **Speed-up** is the
# throughput against one process's; **efficiency** is T1 / (N x TN), T the time of one step of the global
# batch: 100 % means N processes did it N times faster.
#
# **Predict first:** how many times the throughput of one process will two processes reach here?

# %%
guess_speedup = None  # YOUR GUESS: throughput of 2 processes / 1 process, e.g. 1.8

# %%
scale = lab.scaling(cfg)  # 1, 2, 4, ... processes, up to this machine's cores or GPUs
scale

# %%
print(guesses.versus(guess_speedup, scale.speedup.iloc[1], "speed-up, 2 processes / 1", "x"))
plots.bars(scale.frame, x="world_size", ys=["throughput", "efficiency", "comm_share"]);

# %% jupyter={"source_hidden": true} tags=["check"]
# check: one row per world size, each measured; the efficiency is the formula's
assert list(scale.world_size) == sorted(scale.world_size) and scale.world_size.iloc[0] == 1
assert (scale.step_time_s > 0).all() and scale.identical_weights.all()
last = scale.iloc[-1]
assert abs(last.efficiency - scale.step_time_s.iloc[0] / (last.world_size * last.step_time_s)) < 1e-9

# %% [markdown]
# The finding calls a change real only where the step times' p10-p90 spreads do not overlap. On GPUs each process
# brings its own device: a gain, limited by the all-reduce, the slowest rank and the optimizer step every rank
# runs in full. CPU processes bring **no new hardware**: they share the session's threads (`threads_per_rank`
# each), so often **no gain**, unless the session left cores idle (CI sets one thread). `launch_time_s` is every
# job's fixed price: torchrun, imports, joining the group.
#
# **Where the time goes.** `comm_share` is the all-reduces' time in one profiled step; since DDP overlaps them
# with the backward pass, it bounds what they add. DDP groups the gradients into **buckets** of `bucket_cap_mb`
# (25 MB by default) and all-reduces each as soon as it is ready. Smaller buckets start sending earlier but pay
# each collective's fixed cost more often:

# %%
buckets = lab.bucket_sweep(cfg, sizes=(0.25, 25))
buckets

# %% [markdown]
# A single all-reduce at 25 MB means the gradients fit in one bucket, sent only when the backward pass is over; a
# large model makes dozens.
#
# **Gradient accumulation under DDP.** Each `backward()` would all-reduce, although only the last
# micro-batch's sum is needed; `model.no_sync()` skips it on the others
# (`labkit.techniques.accumulation.sync_context`, used by the engine since notebook 02). With BatchNorm (ResNet-18 at
# `full`) a micro-batch, like an FSDP rank, normalises over its own samples: its losses differ beyond rounding.

# %%
accumulated = lab.accumulation(cfg, grad_accum=2, nproc=2)
accumulated

# %% jupyter={"source_hidden": true} tags=["check"]
# check: no_sync left one round of all-reduces per optimizer step, and the training is the same (without BatchNorm)
plain, micro = accumulated.iloc[0], accumulated.iloc[1]
assert micro.grad_accum == 2 and micro.allreduces_per_step == plain.allreduces_per_step
batchnorm = lab.uses_batch_statistics(cfg)  # BatchNorm: a micro-batch normalises over its own samples
assert batchnorm or max(abs(a - b) for a, b in zip(micro.losses[:10], plain.losses[:10], strict=True)) < 1e-3

# %% [markdown]
# ## 5. When a rank dies
# A collective waits until **every** rank has joined it. If a rank dies, the others wait in their next all-reduce,
# and the job hangs, GPUs idle, unless something ends the wait. **torchrun** watches its processes: when one exits
# with an error, it stops the others. The **process-group timeout** (`init_process_group(timeout=...)`; torch's
# default 30 min for gloo, 10 for NCCL; labkit's 60 s) makes a collective that waited too long raise.
#
# **Predict first:** how many seconds after its start will the job end when rank 1 raises an error after
# step 3?

# %%
guess_fault_s = None  # YOUR GUESS: seconds until the job ends, e.g. 60

# %%
died = lab.fault_demo(cfg, fail_rank=1, fail_step=3, how="raise")
print(guesses.versus(guess_fault_s, died.elapsed_s, "seconds until the job ended", "s"))
died

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the job ended quickly with a non-zero exit, naming the rank that failed
assert died.error.rank == 1 and died.error.exit_code != 0 and died.elapsed_s < 60
assert "rank 1 failed after step 3" in str(died.error)

# %% [markdown]
# Rank 1's error reached torchrun, which stopped the other ranks; the seconds are mostly the processes' start-up.
# A rank that **hangs** (a deadlock, a stuck data loader, another branch of an `if`) does not exit, so torchrun
# sees nothing; only the timeout ends it. Here with a 3-second timeout:

# %%
stuck = lab.fault_demo(cfg, fail_rank=1, fail_step=3, how="hang", timeout_s=3)
stuck

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the timeout ended the hang, and the silent rank is the one named
assert stuck.error.rank == 1 and "stopped taking part" in str(stuck.error) and stuck.elapsed_s < 60

# %% [markdown]
# labkit names the rank that reported nothing; in your own jobs, look for the log that stops earliest.
#
# ## 6. When a copy per GPU no longer fits: FSDP
# DDP keeps the whole model, gradients and optimizer state on every GPU: with AdamW, 16 bytes per parameter
# (notebook 03). Fully Sharded Data Parallel keeps 1/N of each per GPU, gathers a block's weights just before it
# runs, and reduce-scatters the gradients so each rank updates its shard. 1.5 billion parameters in fp32 against a
# 16 GB T4:

# %%
lab.fsdp_sizing(num_params=1.5e9, gpu_bytes=16e9)

# %% [markdown]
# FSDP2's `fully_shard` runs on gloo too, so the same job can be sharded here (`launcher.launch(..., strategy="fsdp")`:
# `fully_shard` on each block, then on the model, before the optimizer is built):

# %%
sharded = lab.fsdp_comparison(cfg, nproc=2)
sharded

# %% jupyter={"source_hidden": true} tags=["check"]
# check: FSDP holds about half the parameters and optimizer state per rank and trains the same model (no BatchNorm)
ddp_row, fsdp_row = sharded.iloc[0], sharded.iloc[1]
assert fsdp_row.parameter_bytes < 0.6 * ddp_row.parameter_bytes
assert fsdp_row.optimizer_state_bytes < 0.6 * ddp_row.optimizer_state_bytes
assert batchnorm or max(abs(a - b) for a, b in zip(ddp_row.losses[:10], fsdp_row.losses[:10], strict=True)) < 1e-3

# %% [markdown]
# The activations are not sharded (gradient checkpointing helps there). FSDP pays in communication: the weights
# travel every step; on GPUs that overlaps with compute when the blocks are large enough.

# %% [markdown]
# Published figures for scale (data parallel scaling and ZeRO's sharding; measured elsewhere, not here):

# %%
display.table(labkit.results.published("07_distributed-*"))

# %% [markdown]
# ## 7. A language model on two processes
# Kaggle's GPU is two T4s. A language model runs under DDP and FSDP2 (a shard unit per decoder layer) with one
# trap: its loss is a mean over **label tokens**, and ranks hold different numbers. If each rank divides by
# its own count, a token on the rank with fewer weighs more: notebook 10's accumulation bug, across GPUs. labkit
# all-reduces the counts first (`distributed.loss_divisor`):
#
# ```python
# count = torch.full((), float(label_tokens), device=device)
# dist.all_reduce(count)                                       # the job's label tokens
# loss = token_loss_sum(logits, labels) / (count / world_size)  # DDP averages: the global token mean
# ```
#
# **Predict first:** 2 ranks x 4 rows against 1 process x 8 rows, the same batches: how far apart will the
# weights end (largest difference: 0 identical, 1e-6 rounding, 1e-2 another training)?

# %%
guess_gap = None  # YOUR GUESS: largest weight difference, DDP against one process, e.g. 1e-6

# %%
lm_cfg = lab.language_workload(P)  # a random tiny_llama here; SmolLM2-135M on 2 GPUs at full
lm = lab.language_jobs(lm_cfg, nproc=2)  # 1 process; DDP, FSDP2 and DDP with each rank's own mean on 2
print(guesses.versus(guess_gap, lm.row("DDP").weight_gap, "largest weight difference, DDP / 1 process"))
lm

# %% jupyter={"source_hidden": true} tags=["check"]
# check: DDP and FSDP2 train the one-process weights; each rank's own mean does not, on ranks of uneven tokens
ddp_gap, fsdp_gap, own_gap = (lm.row(job).weight_gap for job in ("DDP", "FSDP2", "DDP, each rank's own mean"))
assert max(ddp_gap, fsdp_gap) < (1e-4 if lm_cfg.device == "cpu" else 1e-2) and own_gap > 10 * max(ddp_gap, fsdp_gap)
assert len(set(lm.ranks.label_tokens)) > 1  # the ranks held different numbers of label tokens

# %% [markdown]
# Per rank, DDP holds the whole model, gradients and AdamW state, plus its buckets (a second copy of the gradients);
# FSDP2 half of each. Activations are not sharded, and each rank's follow its own rows, so ranks peak differently:

# %%
display.table(lm.ranks, ["job", "process_rank", "label_tokens", "tokens_per_s", "parameter_bytes",
                         "optimizer_state_bytes", "peak_memory_bytes"])

# %%
rank_memory = {f"{job} rank {r['rank']}": r for job in ("DDP", "FSDP2") for r in lm.jobs[job].distributed["ranks"]}
plots.memory_breakdown(rank_memory);

# %% jupyter={"source_hidden": true} tags=["check"]
# check: FSDP2 holds half the parameter and optimizer-state bytes of DDP on each rank
per_rank = lm.ranks.groupby("job")[["parameter_bytes", "optimizer_state_bytes"]].max()
assert (per_rank.loc["FSDP2"] < 0.6 * per_rank.loc["DDP"]).all()

# %% [markdown]
# ## 8. Your turn: the panel
# Choose processes, bucket size, accumulation and steps, and press **Run**: each job adds bars for its throughput
# and all-reduces per step, after torchrun's start-up.

# %%
panel = ExperimentPanel(
    run=lab.panel_run, base=cfg,
    controls={"grad_accum": [1, 2, 4], "max_steps": (P.max_steps // 2, 2 * P.max_steps, P.max_steps // 2)},
    options={"nproc": list(range(1, launcher.max_processes(labkit.env.resolve_device(cfg.device).type) + 1)),
             "bucket_cap_mb": [0.25, 1.0, 25.0]},
    show=views.Bars("setup", ("throughput", "allreduces_per_step")), estimate=lab.panel_estimate,
    title="Distributed data parallel")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | the job hangs, GPUs idle | a rank died, never joined, or skipped a collective | a timeout; same collectives |
# | "Address already in use" | an earlier job holds the port | `--standalone`, or another `--master_port` |
# | every epoch the same order | `set_epoch` never called | `sampler.set_epoch(epoch)` |
# | ranks' weights drift apart | different seeds at build; an unused parameter | same build; `find_unused_parameters` |
# | accuracy differs from one GPU | per-rank BatchNorm; per-rank batch kept | `SyncBatchNorm`; global batch |
# | logs repeat N times, checkpoints overwrite | every rank writes | only rank 0 writes |
# | NCCL hangs on Kaggle's 2 x T4 | no peer-to-peer path | `NCCL_P2P_DISABLE=1` (`launch` sets it) |
# | an LM's loss differs from one GPU's | each rank divides by its own tokens | all-reduce the token count |

# %% [markdown]
# ## Going further
# - **Several machines.** The same script runs on every machine; torchrun's rendezvous gathers them. Each
#   runs the command with the number of machines, a `--rdzv_endpoint` all can reach and its own `--node_rank`:

# %%
for rank, command in enumerate(launcher.multi_node_commands(nproc=4, nnodes=2, endpoint="10.0.0.1:29500")):
    print(f"# on machine {rank} (its --node_rank):\n{command}\n")

# %% [markdown]
# - **ZeRO** (DeepSpeed) shards the optimizer state, then gradients, then parameters: FSDP is stage 3;
#   `torch.distributed.optim.ZeroRedundancyOptimizer` is stage 1 for DDP.
# - **Tensor and pipeline parallelism** split one layer or the layer stack over GPUs
#   (`torch.distributed.tensor.parallel`, `torch.distributed.pipelining`).
# - **`accelerate`** wraps the same torchrun machinery; its `notebook_launcher` forks, so no cell may touch
#   CUDA before it runs.

# %% [markdown]
# ## Summary
# - DDP: one process per device, gradients all-reduced during `backward()`; prefer it to DataParallel.
# - `init_process_group`, `DistributedDataParallel(model)`, `DistributedSampler` with `set_epoch`, only rank 0
#   writes; launched by `torchrun`, not from a notebook function.
# - At the same global batch, N processes train what one does, up to rounding.
# - Efficiency T1 / (N x TN) is limited by communication and the slowest rank; `no_sync` skips all but the
#   last micro-batch's all-reduce.
# - A dead rank ends the job through torchrun; a stuck one only through the process-group timeout: set one.
# - Beyond one GPU's memory: FSDP.
# - A language model divides its summed loss by the job's label tokens, all-reduced, never by each rank's own.

# %% [markdown]
# ## Further reading
# - Li et al. 2020, *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*:
#   https://arxiv.org/abs/2006.15704
# - PyTorch, *Getting Started with Distributed Data Parallel*:
#   https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html
# - PyTorch, *torchrun (Elastic Launch)*: https://docs.pytorch.org/docs/stable/elastic/run.html
# - PyTorch, *DistributedDataParallel* notes (why not DataParallel): https://docs.pytorch.org/docs/stable/notes/ddp.html
# - PyTorch, *Getting Started with FSDP2*: https://docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html
# - Rajbhandari et al. 2020, *ZeRO*: https://arxiv.org/abs/1910.02054

# %% [markdown]
# ## Exercises
# The first asks for code: a rank's share of an epoch, as `DistributedSampler` gives it, checked against
# torch's sampler for several world sizes, ranks and epochs.

# %%
print(exercises.question("07.shard"))


# %%
def my_shard(num_samples, world_size, rank, seed, epoch):
    """The sample indices `rank` trains on in `epoch` (shuffle=True, drop_last=True)."""
    raise NotImplementedError  # YOUR CODE


exercises.check("07.shard", my_shard)

# %% [markdown]
# The next one uses **your own** scaling table from section 4. After answering: what would the efficiency
# have been if each process had had the whole machine's cores?

# %%
mine = {"world_size": int(scale.world_size.iloc[-1]), "t1_ms": round(1e3 * scale.step_time_s.iloc[0], 1),
        "tn_ms": round(1e3 * scale.step_time_s.iloc[-1], 1)}
print(exercises.question("07.own_efficiency", mine))

# %%
answer = None  # YOUR CODE: a fraction, 0..1
exercises.check("07.own_efficiency", answer, mine)

# %%
print(exercises.question("07.ring_bytes"))

# %%
answer = None  # YOUR CODE: GB per GPU per step
exercises.check("07.ring_bytes", answer)

# %% [markdown]
# # Distributed data parallel: one model, several processes
#
# Data parallelism trains one model on several devices at once: every process holds a copy of the
# model, takes its own share of each batch, and the processes average their gradients before each
# optimizer step, so they all take the same step. PyTorch's `DistributedDataParallel` (DDP) does this
# with one process per device, started by `torchrun`. This notebook writes the few lines DDP needs,
# launches real multi-process jobs from the notebook (two CPU processes here; one per GPU on Kaggle's
# 2 x T4), checks that they train exactly what one process trains, measures how throughput scales and
# what communication costs, makes a rank die mid-run to see how a job ends instead of hanging, and
# shards the model with FSDP when a copy per device no longer fits.
#
# **You will learn**
# 1. why `DataParallel` (one process, a main GPU that gathers everything) is slower than DDP (one
#    process per GPU), and the seed's figure for it;
# 2. the mechanism in plain PyTorch: the process group, the DDP wrapper, `DistributedSampler` with
#    `set_epoch`, the gradient all-reduce, only rank 0 writes; checked equal, weight for weight, to labkit's
#    engine;
# 3. how to launch a torchrun job from a notebook (and why not a function defined in the notebook);
# 4. scaling: throughput against the number of processes, efficiency T1 / (N x TN), the share of a step
#    spent in all-reduces, gradient buckets, and `no_sync` during gradient accumulation;
# 5. what happens when a rank dies or hangs: process-group timeouts and torchrun's failure propagation;
# 6. beyond one machine: the multi-node command, and FSDP2's `fully_shard` for models too big to copy.
#
# **What you need:** notebooks 00 and 02 (the four numbers; gradient accumulation). A CPU is fine: every
# job here runs as two CPU processes over the gloo backend, which is how the mechanism, the equality of
# the training and the faults are shown. Speed-ups need real devices: on a CPU the processes share the
# same cores, so section 4 shows little or no gain there; on two or more GPUs (Kaggle's 2 x T4) the same
# cells launch one process per GPU over NCCL and section 1 measures DataParallel too.

# %%
import torch

import labkit
from labkit import guesses, plots, views
from labkit.labs import distributed as lab  # this notebook's experiments and findings
from labkit.labs.distributed import exercises  # this notebook's exercises: question, check, solution
from labkit.techniques import distributed
from labkit.widgets import ExperimentPanel

P = labkit.profile()  # read once; nothing below branches on it
cfg = lab.workload(P)  # tiny_vit (LayerNorm, no BatchNorm) on the offline data; the profile's workload at full
print(f"{cfg.model}, global batch {cfg.batch_size}, {cfg.max_steps} steps; this machine runs up to "
      f"{lab.max_processes(labkit.env.resolve_device(cfg.device).type)} processes per job")
labkit.env_report()

# %% [markdown]
# ## 1. DataParallel or DistributedDataParallel
# `torch.nn.DataParallel(model)` is one line and one process. Every step it copies the model from GPU 0
# to every GPU, splits the batch, runs the copies in Python threads, gathers every output back on
# GPU 0, computes the loss there and reduces the gradients onto GPU 0's copy. So GPU 0 does more work
# and holds more memory than the others, the model is copied every step, and the threads contend for
# Python's global interpreter lock. `DistributedDataParallel` runs **one process per GPU**: each holds
# its own copy for the whole run, computes its own loss, and the processes only exchange gradients, in
# buckets, overlapped with the backward pass. The seed of this lab measured the difference on 4 x V100:
#
# | run | DataParallel | DDP |
# | --- | --- | --- |
# | the seed's fine-tune, 4 x V100 (its own figure, not measured here) | 8 h | 1.5 h |
#
# PyTorch's documentation recommends DDP even on one machine. Where this notebook runs on two or more
# GPUs, the next cell measures both at the same global batch; elsewhere it says why it cannot:

# %%
dp = lab.dp_vs_ddp(cfg)
print(dp.finding())
dp.frame

# %% [markdown]
# ## 2. The mechanism in plain PyTorch
# A DDP job is N copies of one script, started together. Each copy is a **rank** (0 to N-1) and learns
# its rank and the world size from environment variables that `torchrun` sets. The script below is the
# whole mechanism: join the process group, wrap the model, give each rank its share of every epoch, and
# train as usual: DDP averages the gradients over the ranks inside `loss.backward()`. labkit's
# `plain_setup` only builds the config, data and model exactly as its engine does, so that the two can
# be compared. The first cell writes the set-up; the second adds the loop:

# %%
# %%writefile ddp_plain.py
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler
from labkit.data import make_loader
from labkit.labs.distributed import plain_finish, plain_setup

dist.init_process_group("gloo")  # joins the other ranks; rank and world size come from torchrun's variables
cfg, split, model, to_input = plain_setup(sys.argv[1])  # config, data and model, as labkit's fit builds them
model = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights to every rank
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
    loss = F.cross_entropy(model(to_input(images)), labels)
    loss.backward()  # DDP all-reduces (averages) the gradients during the backward pass
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.detach())
plain_finish(losses, model, sys.argv[2])  # averages the losses over the ranks; only rank 0 writes; exits

# %% [markdown]
# Two details carry the whole method. `DistributedSampler` draws one permutation per epoch, the same on
# every rank (same seed), and gives rank r the positions r, r + N, r + 2N, ...: the ranks' shares never
# overlap, and together the ranks' batches of B/N are the permutation's consecutive batches of B.
# Without `set_epoch`, every epoch would repeat the first one's order. And since every rank starts from
# rank 0's weights and applies the same averaged gradient, the copies stay identical without ever
# sending weights again.
#
# Now run your script with torchrun on two processes, and labkit's engine (`labkit.fit` inside labkit's
# own worker, section 3) on the same small run. `lab.run_script` starts
# `torchrun --standalone --nproc_per_node=2 ddp_plain.py CONFIG OUT` and reads what rank 0 wrote:

# %%
small = lab.mechanism_config()  # 8 steps of tiny_vit on the CPU: the same on every machine
mine = lab.run_script("ddp_plain.py", small, nproc=2)
engine = lab.launch(small, nproc=2)
print("your losses:  ", " ".join(f"{v:.4f}" for v in mine["losses"]))
print("labkit's:     ", " ".join(f"{v:.4f}" for v in engine.losses))
print(f"weights: yours {mine['weights_sha256'][0][:16]}..., labkit's {engine.distributed['weights_sha256'][0][:16]}...")

# %% jupyter={"source_hidden": true} tags=["check"]
# check: your DDP script trains exactly what labkit's engine trains: same losses, same weights on every rank
assert torch.allclose(torch.tensor(mine["losses"]), torch.tensor(engine.losses), rtol=1e-4, atol=1e-5)
assert len(set(mine["weights_sha256"])) == 1 and len(set(engine.distributed["weights_sha256"])) == 1
assert engine.distributed["world_size"] == 2 and engine.distributed["backend"] == "gloo"

# %% [markdown]
# On a CPU the two give bit-identical weights (the same operations in the same order); on GPUs, where
# some kernels are not deterministic, the losses agree to about 1e-5 instead.
#
# **Why a script, and not a function in the notebook?** Each rank is a separate process. A function
# defined in a notebook lives only in the kernel: a new process cannot import it, and pickling it by
# reference fails. Forking the kernel instead (what `accelerate.notebook_launcher` does) copies the
# kernel's whole state, which breaks as soon as the kernel has touched CUDA, and is why notebook
# launchers ask that no cell uses the GPU before they run. labkit's `launch` starts torchrun on an
# importable module (`labkit.worker`) in fresh processes, streams rank 0's output back into the cell
# and returns the result, so the kernel's own CUDA state does not matter.
#
# ## 3. Two processes train what one does
# labkit's engine takes the same path: inside a process group, `labkit.train.Trainer` wraps the model in
# DDP, takes each rank's batches from a `DistributedSampler`, and combines the loss, the FLOPs and the
# accuracy over the ranks; `cfg.batch_size` stays the **global** batch. `lab.launch(cfg, nproc=N)` runs
# `fit(cfg)` that way on labkit's worker. With the same global batch, one process and two should train
# the same model:

# %%
eq = lab.equivalence(cfg, nproc=2)
print(eq.finding())
fig, axes = plots.grid(2)
plots.loss_curve({"1 process": eq.one, "2 processes": eq.many}, ax=axes[0])
plots.line(eq.frame, x="step", y="loss_difference", ax=axes[1]);  # the curves on the left overlap

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the same training on 1 and 2 processes, identical weights on both ranks
assert eq.identical_weights and eq.early_difference < 1e-3  # GPUs drift a little after many steps
assert abs(eq.one.accuracy - eq.many.accuracy) <= labkit.measure.accuracy_noise(eq.one.accuracy, P.test_size)

# %% [markdown]
# The two loss curves lie on top of each other (on GPUs, nearly); the right-hand chart shows how far
# apart they are. The
# remaining difference is rounding: the all-reduce adds the two ranks' gradients, which rounds
# differently from one process summing the whole batch. Two things would make it larger. **BatchNorm**
# normalises each rank's share by its own statistics: labkit converts it to `SyncBatchNorm` on GPUs
# (statistics over the global batch) and says so where it cannot (the CPU), which is one reason this
# notebook uses a transformer. And **the learning rate**: keeping the global batch keeps the training;
# keeping the per-rank batch instead makes the global batch N times larger, which needs the scaled
# learning rate and warm-up of notebook 02.
#
# ## 4. Scaling
# With N processes each step computes B/N samples per rank instead of B, plus the all-reduce. **Speed-up**
# is the throughput against one process's; **efficiency** is T1 / (N x TN), where T is the time of one
# step of the global batch: 100 % means N processes did it N times faster.
#
# **Predict first:** on this machine, how many times the throughput of one process will two processes
# reach?

# %%
guess_speedup = None  # YOUR GUESS: throughput of 2 processes / 1 process, e.g. 1.8

# %%
scale = lab.scaling(cfg)  # 1, 2, 4, ... processes, up to this machine's cores or GPUs
print(lab.scaling_finding(scale))
print(guesses.versus(guess_speedup, scale.speedup.iloc[1], "speed-up, 2 processes / 1", "x"))
plots.bars(scale, x="world_size", ys=["throughput", "efficiency", "comm_share"]);

# %%
scale[["world_size", "threads_per_rank", "step_time_s", "throughput", "speedup", "efficiency", "comm_share",
       "launch_time_s"]].round(3)

# %% jupyter={"source_hidden": true} tags=["check"]
# check: one row per world size, each measured; the efficiency is the formula's
assert list(scale.world_size) == sorted(scale.world_size) and scale.world_size.iloc[0] == 1
assert (scale.step_time_s > 0).all() and scale.identical_weights.all()
last = scale.iloc[-1]
assert abs(last.efficiency - scale.step_time_s.iloc[0] / (last.world_size * last.step_time_s)) < 1e-9

# %% [markdown]
# How to read it. On GPUs each process brings its own device, so the compute per step falls by N and
# what limits the speed-up is communication (the all-reduce of every gradient each step), waiting for
# the slowest rank, and the work that does not shrink with the batch (the optimizer step runs in full on
# every rank). On a CPU the processes bring **no new hardware**: one process already used every core
# through its threads, and N processes share those cores with one thread each, so the speed-up is about
# whether N single-threaded processes use the cores better than one multi-threaded process does. The
# printed finding says which happened. `launch_time_s` is the price of every job: starting torchrun,
# importing torch in each process and joining the group take seconds, which is why jobs should be long.
#
# **Where the time goes.** `comm_share` is the time the gradient all-reduces took during one profiled
# step (`torch.profiler`: gloo's `gloo:all_reduce` events on a CPU, NCCL's kernels on GPUs), as a share of
# that step. DDP overlaps them with the backward pass, so the share is an upper bound on what they add.
# They run in **buckets**: DDP groups the gradients into buckets of `bucket_cap_mb` (25 MB by default)
# and all-reduces each as soon as its gradients are ready. Smaller buckets start sending earlier, but
# each collective has a fixed cost:

# %%
buckets = lab.bucket_sweep(cfg, sizes=(0.25, 25))
print(lab.bucket_finding(buckets))
buckets[["bucket_cap_mb", "allreduces_per_step", "allreduce_bytes_per_step", "step_time_s", "comm_share"]].round(3)

# %% [markdown]
# Where the table shows a single all-reduce at 25 MB, the model's gradients fit in one default bucket
# (`allreduce_bytes_per_step` is their size), so the whole all-reduce starts only when the backward pass
# is over, while small buckets overlap with it. A ResNet-18's gradients (11.2 million parameters x 4 bytes,
# about 45 MB) already make two buckets at the default; a large model makes dozens.
#
# **Gradient accumulation under DDP.** Notebook 02 accumulated gradients over micro-batches. Under DDP
# each `backward()` would all-reduce, although only the last micro-batch's sum is needed; `model.no_sync()`
# skips it on the others (`labkit.techniques.accumulation.sync_context`, which the engine has used since
# notebook 02 and which now does real work):

# %%
accumulated = lab.launch(cfg.replace(grad_accum=2), nproc=2)
print(lab.accumulation_finding(eq.many, accumulated))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: no_sync left one round of all-reduces per optimizer step, and the training is the same
per_step = accumulated.distributed["ranks"][0]["allreduces_per_step"]
assert per_step == eq.many.distributed["ranks"][0]["allreduces_per_step"]
assert max(abs(a - b) for a, b in zip(accumulated.losses[:10], eq.many.losses[:10], strict=True)) < 1e-3

# %% [markdown]
# **Kaggle's 2 x T4.** The two T4s of a Kaggle machine have no working peer-to-peer path, and NCCL jobs
# that try it hang or fail. `NCCL_P2P_DISABLE=1` sends the traffic through host memory instead;
# `lab.launch` sets it for multi-GPU jobs on T4s unless you set it yourself, and records it in
# `result.distributed["nccl_environment"]`.
#
# ## 5. When a rank dies
# A collective (an all-reduce, a broadcast) waits until **every** rank has joined it. If a rank dies, the
# others wait in their next all-reduce; if nothing ends the wait, the job hangs with its GPUs idle: the
# seed's "distributed training hangs" row. Two mechanisms end it. **torchrun** watches its processes: when
# one exits with an error, it stops the others and exits with a non-zero code. And the **process-group
# timeout** (`init_process_group(timeout=...)`; torch's defaults are 30 minutes for gloo and 10 for NCCL,
# labkit's is 60 s) makes a collective that waited too long raise, which covers a rank that is alive but
# stuck. `launch(..., fail_rank=1, fail_step=3)` makes rank 1 fail after step 3.
#
# **Predict first:** how many seconds after its start will the job end when rank 1 raises an error
# after step 3?

# %%
guess_fault_s = None  # YOUR GUESS: seconds until the job ends, e.g. 60

# %%
died = lab.fault_demo(cfg, fail_rank=1, fail_step=3, how="raise")
print(died.finding())
print(guesses.versus(guess_fault_s, died.elapsed_s, "seconds until the job ended", "s"))

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the job ended quickly with a non-zero exit, naming the rank that failed
assert died.error.rank == 1 and died.error.exit_code != 0 and died.elapsed_s < 60
assert "rank 1 failed after step 3" in str(died.error)

# %% [markdown]
# The job ended in seconds: rank 1's error reached torchrun, which stopped the other ranks (over gloo,
# rank 0 may notice first: it sees rank 1's connection close while it waits in the next all-reduce). The
# seconds are mostly the start-up of the processes. A rank that **hangs** (a deadlock, a stuck data loader, a
# rank that took another branch of an `if`) does not exit, so torchrun sees nothing; only the
# process-group timeout ends it. Here with a 3-second timeout:

# %%
stuck = lab.fault_demo(cfg, fail_rank=1, fail_step=3, how="hang", timeout_s=3)
print(stuck.finding())

# %% jupyter={"source_hidden": true} tags=["check"]
# check: the timeout ended the hang, and the silent rank is the one named
assert stuck.error.rank == 1 and "stopped taking part" in str(stuck.error) and stuck.elapsed_s < 60

# %% [markdown]
# The error a timeout raises comes from the rank that waited (rank 0 here), not from the one that
# stopped; labkit names the rank that reported nothing. In your own jobs, look for the rank whose log
# stops earliest. With torch's default timeouts the same hang would have held the job for 30 minutes
# (gloo) or 10 (NCCL).
#
# ## 6. Beyond one machine
# **Several machines.** The same script runs on every machine; torchrun's rendezvous gathers them. Each
# machine runs the same command with the number of machines, a `--rdzv_endpoint` that every machine can
# reach (one of them, `host:port`) and, for a fixed set of machines, its own `--node_rank`:

# %%
for rank, command in enumerate(lab.multi_node_commands(nproc=4, nnodes=2, endpoint="10.0.0.1:29500")):
    print(f"# on machine {rank} (its --node_rank):\n{command}\n")

# %% [markdown]
# **When a copy per GPU no longer fits: FSDP.** DDP keeps the whole model, its gradients and its
# optimizer state on every GPU: with AdamW that is 16 bytes per parameter before any activation
# (notebook 03's `labkit.training_memory`). Fully Sharded Data Parallel keeps 1/N of each on each GPU,
# gathers a block's weights just before its forward and backward and frees them after, and
# reduce-scatters the gradients so that each rank updates only its shard. For a 1.5-billion-parameter
# model trained in fp32 with AdamW, against a 16 GB T4:

# %%
lab.fsdp_sizing(num_params=1.5e9, gpu_bytes=16e9)

# %% [markdown]
# FSDP2's `torch.distributed.fsdp.fully_shard` runs on gloo too, so the same small job can be sharded
# here: `fully_shard` on each block, then on the model, before the optimizer is built (`lab.launch(...,
# strategy="fsdp")`, `labkit.techniques.distributed.shard`). What each rank holds, and what it costs:

# %%
sharded = lab.fsdp_comparison(cfg, nproc=2)
print(lab.fsdp_finding(sharded))
sharded[["strategy", "parameter_bytes", "optimizer_state_bytes", "peak_memory_bytes", "step_time_s", "comm_share"]]

# %% jupyter={"source_hidden": true} tags=["check"]
# check: FSDP holds about half the parameters and optimizer state per rank and trains the same model
ddp_row, fsdp_row = sharded.iloc[0], sharded.iloc[1]
assert fsdp_row.parameter_bytes < 0.6 * ddp_row.parameter_bytes
assert fsdp_row.optimizer_state_bytes < 0.6 * ddp_row.optimizer_state_bytes
assert max(abs(a - b) for a, b in zip(ddp_row.losses[:10], fsdp_row.losses[:10], strict=True)) < 1e-3

# %% [markdown]
# The activations are not sharded: each rank still computes its own share of the batch through the
# whole model, so they are what remains per GPU (gradient checkpointing, notebook 03, helps there).
# FSDP pays with more communication: the weights travel every step (an all-gather per block, forward and
# backward), which on GPUs overlaps with compute when the blocks are large enough.
#
# ## 7. Your turn: the panel
# Choose the number of processes, the gradient bucket size, the accumulation steps and the number of
# steps, and press **Run**. Each job adds bars for its throughput and its all-reduces per step, next to the
# jobs before it. Every job starts torchrun afresh, so expect the start-up seconds on top of the steps.

# %%
panel = ExperimentPanel(
    run=lab.panel_run, base=cfg,
    controls={"grad_accum": [1, 2, 4], "max_steps": (P.max_steps // 2, 2 * P.max_steps, P.max_steps // 2)},
    options={"nproc": list(range(1, lab.max_processes(labkit.env.resolve_device(cfg.device).type) + 1)),
             "bucket_cap_mb": [0.25, 1.0, 25.0]},
    show=views.Bars("setup", ("throughput", "allreduces_per_step")), estimate=lab.panel_estimate,
    title="Distributed data parallel")
panel

# %% [markdown]
# ## Pitfalls
# | symptom | likely cause | remedy |
# | --- | --- | --- |
# | the job hangs, GPUs at 0 % | a rank died or never joined; a rank took another branch and skipped a collective | a process-group timeout; run under torchrun; every rank must call every collective in the same order |
# | "Address already in use" | an earlier job still holds the port | `--standalone` (a free port), or another `--master_port` |
# | every epoch the same order | `set_epoch` never called | `sampler.set_epoch(epoch)` before each epoch |
# | ranks' weights drift apart | different seeds at build time; a parameter unused in the forward | build the model the same way on every rank; `find_unused_parameters=True` only where needed |
# | accuracy differs from one GPU | per-rank BatchNorm statistics; per-rank batch kept, so a larger global batch | `SyncBatchNorm`; keep the global batch, or scale the lr with warm-up |
# | checkpoints overwrite each other, logs repeat N times | every rank writes | only rank 0 writes and prints |
# | NCCL hangs on Kaggle's 2 x T4 | no peer-to-peer path between the GPUs | `NCCL_P2P_DISABLE=1` |
# | no speed-up on a CPU | the processes share the same cores | DDP pays across devices; on one CPU use threads |
# | a rank "dies" with SIGABRT after it finished ("terminate called without an active exception") | gloo's threads at Python's shutdown (a torch issue) | `destroy_process_group()` at the end; leave with `os._exit(0)` after writing (labkit's worker does) |

# %% [markdown]
# ## Going further
# - **ZeRO** (DeepSpeed) stages 1 to 3 shard the optimizer state, then gradients, then parameters: FSDP is
#   stage 3 in PyTorch. `torch.distributed.optim.ZeroRedundancyOptimizer` is stage 1 for DDP.
# - **Communication hooks**: DDP can compress gradients before the all-reduce (`fp16_compress_hook`,
#   PowerSGD); labkit's `counting_allreduce_hook` is a hook that only counts.
# - **Tensor and pipeline parallelism** split one layer or the layer stack over GPUs when even a shard
#   of the data-parallel copy is too much; `torch.distributed.tensor.parallel` and `torch.distributed.pipelining`.
# - **Elastic training**: `torchrun --nnodes=1:4 --max-restarts=3` restarts a failed job and lets machines
#   come and go; a job then has to resume from its last checkpoint.
# - **`accelerate`** (`accelerate launch`, `notebook_launcher`) wraps the same torchrun machinery; in a
#   notebook, `notebook_launcher` forks, so no cell may touch CUDA before it runs.

# %% [markdown]
# ## Summary
# - DDP runs one process per device; each holds a copy of the model and all-reduces (averages) the
#   gradients during `backward()`, so every copy takes the same step. DataParallel (one process, threads,
#   a main GPU) is slower; prefer DDP even on one machine.
# - The mechanism is a few lines: `init_process_group`, `DistributedDataParallel(model)`,
#   `DistributedSampler` with `set_epoch`, only rank 0 writes. Started with `torchrun`, never from a
#   function defined in a notebook.
# - At the same global batch, N processes train what one does (up to rounding, and except per-rank
#   BatchNorm statistics); efficiency is T1 / (N x TN), limited by communication and the slowest rank.
# - `no_sync` skips the all-reduce on all but the last micro-batch of an accumulated step.
# - A dead rank ends the job through torchrun; a stuck one only through the process-group timeout: set one.
# - Beyond one machine: the same command with a rendezvous endpoint; beyond one GPU's memory: FSDP.

# %% [markdown]
# ## Further reading
# - Li et al. 2020, *PyTorch Distributed: Experiences on Accelerating Data Parallel Training* (DDP's
#   buckets and overlap; near-linear scaling up to 256 GPUs): https://arxiv.org/abs/2006.15704
# - PyTorch, *Getting Started with Distributed Data Parallel*:
#   https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html
# - PyTorch, *torchrun (Elastic Launch)*: https://docs.pytorch.org/docs/stable/elastic/run.html
# - PyTorch, *DistributedDataParallel* notes (why not DataParallel):
#   https://docs.pytorch.org/docs/stable/notes/ddp.html
# - PyTorch, *Getting Started with Fully Sharded Data Parallel (FSDP2)*:
#   https://docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html
# - Rajbhandari et al. 2020, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*:
#   https://arxiv.org/abs/1910.02054

# %% [markdown]
# ## Exercises
# The first asks for code: the share of an epoch that a rank trains on, as `DistributedSampler` gives it.
# The checker compares your indices with torch's sampler for several world sizes, ranks and epochs.

# %%
print(exercises.question("07.shard"))


# %%
def my_shard(num_samples, world_size, rank, seed, epoch):
    """The sample indices `rank` trains on in `epoch` (shuffle=True, drop_last=True)."""
    raise NotImplementedError  # YOUR CODE


exercises.check("07.shard", my_shard)

# %% [markdown]
# The next one uses **your own** scaling table from section 4. After answering: what would the efficiency
# have been if the two processes had each had the whole machine's cores?

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

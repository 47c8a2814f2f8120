"""Distributed data parallel, the mechanism: one process per device, gradients averaged between them.

What each process of a `torchrun` job does, in order:

1. `init`: join the process group from torchrun's environment (``RANK``, ``WORLD_SIZE``,
   ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``), on gloo (CPU) or nccl (CUDA GPUs), with a timeout so
   that a collective waiting on a rank that died or never came gives up instead of hanging.
2. `wrap`: the model in ``DistributedDataParallel``, which broadcasts rank 0's weights at start and
   all-reduces (averages) the gradients in buckets during the backward pass.
3. `sampler`: a ``DistributedSampler`` gives each rank its own share of every epoch's shuffled order;
   call ``set_epoch`` at each epoch, or every epoch repeats the first one's order.
4. Only rank 0 prints and writes (`is_main`); metrics computed per rank are combined with
   `all_reduce_sum` / `all_reduce_mean`.
5. `loss_divisor`: a language model's ranks hold different numbers of label tokens, so each rank divides its
   SUMMED token loss by the job's count over N (an all-reduce of the counts), and DDP's average of the gradients
   is then the global batch's token mean, as one process computes it::

       count = torch.full((), float(label_tokens), device=device)
       dist.all_reduce(count)                                  # the job's label tokens
       (token_loss_sum(logits, labels) / (count / dist.get_world_size())).backward()

   Each rank dividing by its OWN count (``token_mean="rank"``) weights a token of a rank with few of them more.

`labkit.train.Trainer` applies all of this when it runs inside a process group, so `labkit.fit` runs
unchanged under torchrun; `labkit.launcher` starts torchrun on `labkit.worker`.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from ..errors import ConfigError, UnsupportedError

BACKENDS = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 60.0  # torch's own defaults are 30 minutes (gloo) and 10 minutes (nccl)
DEFAULT_BUCKET_CAP_MB = 25.0  # DistributedDataParallel's default
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Context:
    """Where this process stands in its job: its rank among ``world_size``, its device and backend."""

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device


def launched_by_torchrun(environ=None) -> bool:
    """Whether this process was started by torchrun (its rank variables are set)."""
    environ = os.environ if environ is None else environ
    return all(name in environ for name in TORCHRUN_VARIABLES)


def default_backend(device_type: str) -> str:
    """nccl for CUDA GPUs, gloo for CPUs."""
    return "nccl" if device_type == "cuda" else "gloo"


def check_backend(backend: str, device_type: str) -> str:
    """``backend`` if it exists and runs on ``device_type``, else a `ConfigError` / `UnsupportedError`."""
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, f"one of {list(BACKENDS)} (gloo: CPUs, nccl: CUDA GPUs)")
    if backend == "nccl" and device_type != "cuda":
        raise UnsupportedError("backend", backend, "nccl runs on CUDA GPUs only and this run is on the CPU",
                               "backend='gloo'")
    if backend == "nccl" and not dist.is_nccl_available():
        raise UnsupportedError("backend", backend, "this torch build has no nccl", "backend='gloo'")
    if backend == "gloo" and not dist.is_gloo_available():
        raise UnsupportedError("backend", backend, "this torch build has no gloo", "backend='nccl' on GPUs")
    return backend


def init(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Context:
    """Join the process group torchrun set up; one call per process, before the model is built.

    Args:
        backend: ``gloo`` or ``nccl``; None picks nccl when CUDA is usable, else gloo.
        timeout_s: how long a collective waits for the other ranks before it raises.

    Example:
        >>> ctx = init()                         # inside a script started by torchrun
        >>> model = wrap(model.to(ctx.device), ctx.device)
    """
    if not launched_by_torchrun():
        missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
        raise ConfigError("environment", ", ".join(missing), "set by torchrun: start the script with "
                          "`torchrun --standalone --nproc_per_node=N script.py` (variables missing)")
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available() and (backend in (None, "nccl"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    backend = check_backend(backend or default_backend(device.type), device.type)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group: nccl binds each rank to its current device
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return Context(dist.get_rank(), local_rank, dist.get_world_size(), backend, device)


def active() -> bool:
    """Whether this process is in an initialised process group."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0, the one process that prints and writes (True outside a process group)."""
    return rank() == 0


def wrap(model: nn.Module, device: torch.device, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB) -> nn.Module:
    """``model`` (already on ``device``) in DistributedDataParallel: gradients averaged over the ranks.

    ``bucket_cap_mb`` sets the size of the gradient buckets DDP all-reduces as soon as each is full,
    overlapping communication with the rest of the backward pass.
    """
    ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb)


def bucket_bytes(model: nn.Module) -> int:
    """The bytes of DDP's gradient buckets: a second copy of every trainable gradient, which the all-reduce sends
    (``gradient_as_bucket_view=True`` would make the gradients views into them instead); 0 for another model."""
    if not isinstance(model, nn.parallel.DistributedDataParallel) or model.gradient_as_bucket_view:
        return 0
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


STRATEGIES = ("ddp", "fsdp")
TOKEN_MEANS = ("global", "rank")  # a language model's loss over the job's label tokens, or each rank's own


def loss_divisor(count: int, device: torch.device) -> torch.Tensor:
    """What a rank divides its summed loss by so that the ranks' averaged gradients are the global batch's mean:
    the job's ``count`` (summed over the ranks) over world_size, at least 1/world_size.

    ``torch.full`` fills on the device without a host-to-device copy, so a timed step does not wait for the GPU.
    """
    total = all_reduce_sum(torch.full((), float(count), device=device))
    return total.clamp_min(1.0) / world_size()


def check_shardable(model: nn.Module) -> None:
    """`UnsupportedError` for a model FSDP2 cannot shard: bitsandbytes' 4-bit weights (QLoRA)."""
    quantized = next((name for name, p in model.named_parameters() if type(p).__name__ == "Params4bit"), None)
    if quantized is not None:
        raise UnsupportedError("strategy", "fsdp", f"{quantized} is a bitsandbytes 4-bit weight (QLoRA): FSDP2 "
                               "turns every parameter into a plain DTensor shard, which a uint8 Params4bit cannot be "
                               "(only floating tensors take gradients), and even with a float quant_storage the "
                               "gathered weight comes back without its quantization state (accelerate #3983, "
                               "axolotl #2992)", "strategy='ddp' (each rank holds the whole "
                               "4-bit base), or LoRA on a 16-bit base under FSDP2")


def shard(model: nn.Module, blocks: list[nn.Module]) -> nn.Module:
    """FSDP2: each of ``blocks`` and then the whole model sharded over the ranks with ``fully_shard``.

    Each rank keeps 1/N of every parameter (a DTensor shard), its gradient and its optimizer state; a
    block's full weights are all-gathered just before its forward and backward and freed after, and
    gradients are reduce-scattered. Build the optimizer after sharding, over ``model.parameters()``.
    """
    # Imported here, not at the top: torch.distributed.fsdp takes 0.8 s to import, which every
    # `import labkit` would pay (this is torch's module, not a labkit layer).
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this rank holds of ``tensor``: its shard for a sharded (DTensor) parameter, else all of them."""
    to_local = getattr(tensor, "to_local", None)
    return to_local().numel() if to_local is not None else tensor.numel()


def sync_batchnorm(model: nn.Module, device: torch.device) -> tuple[nn.Module, str | None]:
    """BatchNorm statistics over the global batch (SyncBatchNorm) where torch supports it (CUDA).

    Returns the model and, where it stays per rank (the CPU), a note saying so.
    """
    # Training BatchNorm layers only: a frozen one (`labkit_frozen_batchnorm`, kept in eval mode) has no batch
    # statistics to share, and torch's convert_sync_batchnorm would turn it back into a training layer.
    plain = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
             and not getattr(m, "labkit_frozen_batchnorm", False)]
    if not plain:
        return model, None
    if device.type == "cuda":
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if any(child is m for m in plain):
                    setattr(parent, name, nn.SyncBatchNorm.convert_sync_batchnorm(child))
        if any(m is model for m in plain):
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return model, None
    return model, ("BatchNorm statistics are computed per rank on its share of the batch (SyncBatchNorm runs "
                   "on CUDA only), so losses differ a little from one process's")


def sampler(dataset_size: int, seed: int, shuffle: bool = True) -> DistributedSampler:
    """This rank's share of each epoch's order; call ``set_epoch(epoch)`` before each epoch.

    The ranks' shares interleave: rank r takes positions r, r + N, r + 2N, ... of the epoch's
    permutation, so the ranks' consecutive batches of B/N together are the permutation's consecutive B.
    """
    return DistributedSampler(range(dataset_size), num_replicas=world_size(), rank=rank(), shuffle=shuffle,
                              seed=seed, drop_last=True)


def shard_indices(size: int) -> range:
    """This rank's positions of a split for evaluation: every N-th from its rank (no padding, no repeats)."""
    return range(rank(), size, world_size())


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over the ranks (in place; unchanged outside a process group)."""
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over the ranks (in place)."""
    return all_reduce_sum(tensor).div_(world_size())


def all_gather(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` outside a process group."""
    if not active():
        return [obj]
    gathered = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def weights_sha256(model: nn.Module, part: str = "all") -> str:
    """A digest of the parameters and buffers (names and bytes): equal digests, identical weights.

    Args:
        model: the (unwrapped) model. part: ``all``, ``parameters`` (what training updates and DDP keeps equal) or
            ``buffers`` (BatchNorm's running statistics: each rank keeps its own without SyncBatchNorm).
    """
    if part not in ("all", "parameters", "buffers"):
        raise ValueError(f"part={part!r}: 'all', 'parameters' or 'buffers'")
    names = {"parameters": {n for n, _ in model.named_parameters()}, "buffers": {n for n, _ in model.named_buffers()}}
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if part != "all" and name not in names[part]:
            continue
        if hasattr(tensor, "full_tensor"):  # a sharded (FSDP) weight: gathered whole, on every rank
            tensor = tensor.full_tensor()
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


SAMPLED_VALUES = 64  # per parameter tensor, in `weights_sample`


def weights_sample(model: nn.Module, per_tensor: int = SAMPLED_VALUES) -> dict[str, list[float]]:
    """``per_tensor`` values of every parameter at an even stride, as floats: two runs' weights compared
    within a float tolerance (`weights_difference`) without saving them. A collective under FSDP2 (each sharded
    weight is gathered whole): call it on every rank."""
    sample = {}
    for name, tensor in model.named_parameters():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        flat = tensor.detach().float().cpu().reshape(-1)
        step = max(1, flat.numel() // per_tensor)
        sample[name] = flat[::step][:per_tensor].tolist()
    return sample


def weights_difference(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    """The largest absolute difference between two `weights_sample` s of the same model."""
    if a.keys() != b.keys():
        raise ValueError(f"different parameters: {sorted(a.keys() ^ b.keys())[:4]}")
    return max((abs(x - y) for name in a for x, y in zip(a[name], b[name], strict=True)), default=0.0)


class AllReduceCounter:
    """What `counting_allreduce_hook` sent: buckets all-reduced so far and their bytes.

    Example:
        >>> counter = AllReduceCounter(); ddp_model.register_comm_hook(counter, counting_allreduce_hook)
        >>> counter.calls
    """

    def __init__(self):
        self.calls = 0
        self.bytes = 0


def counting_allreduce_hook(counter: AllReduceCounter, bucket):
    """A DDP communication hook that averages a gradient bucket as DDP's default does, and counts it."""
    counter.calls += 1
    tensor = bucket.buffer()
    counter.bytes += tensor.numel() * tensor.element_size()
    tensor.div_(world_size())
    work = dist.all_reduce(tensor, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def cleanup() -> None:
    """Leave the process group (at the end of the worker, on every rank)."""
    if active():
        dist.destroy_process_group()

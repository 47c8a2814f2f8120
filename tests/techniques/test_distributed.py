"""labkit.techniques.distributed: the DDP mechanism in one process (a gloo group of one), checks."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from labkit.errors import ConfigError, UnsupportedError
from labkit.techniques import distributed


@pytest.fixture
def group(tmp_path):
    """A gloo process group of one rank, as torchrun would set up for nproc=1."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    distributed.cleanup()


def test_backend_checks_name_the_value_and_what_runs():
    assert distributed.default_backend("cpu") == "gloo" and distributed.default_backend("cuda") == "nccl"
    assert distributed.check_backend("gloo", "cpu") == "gloo"
    with pytest.raises(ConfigError, match=r"backend='mpi' is not allowed: one of \['gloo', 'nccl'\]"):
        distributed.check_backend("mpi", "cpu")
    with pytest.raises(UnsupportedError, match=r"backend='nccl' cannot run here: nccl runs on CUDA GPUs only.*gloo"):
        distributed.check_backend("nccl", "cpu")


def test_init_outside_torchrun_says_how_to_start(monkeypatch):
    for name in distributed.TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not distributed.launched_by_torchrun()
    with pytest.raises(ConfigError, match=r"environment='RANK, WORLD_SIZE, LOCAL_RANK'.*torchrun --standalone"):
        distributed.init()


def test_outside_a_group_everything_is_one_process():
    assert not distributed.active()
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    assert distributed.all_gather({"a": 1}) == [{"a": 1}]
    assert torch.equal(distributed.all_reduce_mean(torch.tensor([2.0, 4.0])), torch.tensor([2.0, 4.0]))
    assert list(distributed.shard_indices(5)) == [0, 1, 2, 3, 4]


def test_ddp_in_a_group_of_one_counts_its_bucket_all_reduces(group):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = distributed.wrap(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4)), torch.device("cpu"),
                           bucket_cap_mb=0.001)  # 1 kB buckets: the first Linear's gradients fill several
    ddp.module.load_state_dict(plain.state_dict())
    counter = distributed.AllReduceCounter()
    ddp.register_comm_hook(counter, distributed.counting_allreduce_hook)
    x = torch.randn(16, 8)
    plain(x).square().mean().backward()
    ddp(x).square().mean().backward()
    for a, b in zip(plain.parameters(), ddp.module.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad)  # averaging over one rank changes nothing
    grad_bytes = sum(p.numel() * 4 for p in plain.parameters())
    assert counter.bytes == grad_bytes
    counter.calls = 0
    ddp(x).sum().backward()  # DDP rebuilds its buckets after the first step, at bucket_cap_mb
    assert counter.calls > 1
    assert distributed.weights_sha256(ddp.module) == distributed.weights_sha256(plain)
    calls = counter.calls
    with ddp.no_sync():
        ddp(x).sum().backward()
    assert counter.calls == calls  # no_sync: no all-reduce at all


def test_sampler_interleaves_and_set_epoch_reshuffles(group):
    sampler = distributed.sampler(10, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    assert sorted(first) == list(range(10)) and list(sampler) != first
    ranks = [list(torch.utils.data.distributed.DistributedSampler(range(12), num_replicas=2, rank=r, seed=0))
             for r in (0, 1)]
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0)).tolist()
    batch = 3  # each rank's consecutive 3 are, together, the permutation's consecutive 6
    assert sorted(ranks[0][:batch] + ranks[1][:batch]) == sorted(order[:2 * batch])


def test_weights_digest_changes_with_any_value():
    bn = nn.BatchNorm1d(3)  # its num_batches_tracked is a 0-dim int64 buffer
    assert distributed.weights_sha256(bn) == distributed.weights_sha256(nn.BatchNorm1d(3))
    model = nn.Linear(3, 2)
    before = distributed.weights_sha256(model)
    with torch.no_grad():
        model.bias[0] += 1e-7
    assert distributed.weights_sha256(model) != before


def test_sync_batchnorm_only_on_cuda():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    same, warning = distributed.sync_batchnorm(model, torch.device("cpu"))
    assert same is model and "per rank" in warning
    linear = nn.Linear(2, 2)
    assert distributed.sync_batchnorm(linear, torch.device("cpu")) == (linear, None)

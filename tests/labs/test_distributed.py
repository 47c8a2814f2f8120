"""labkit.labs.distributed: notebook 07's experiments as results (table and finding) over cached torchrun jobs."""

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import labkit
from labkit import launcher
from labkit.labs import distributed as lab
from labkit.labs.distributed.beyond import Sharding
from labkit.labs.distributed.data_parallel import DataParallelComparison, data_parallel_fit
from labkit.labs.distributed.equivalence import Equivalence
from labkit.labs.distributed.scaling import Scaling
from labkit.ranks import jobs_frame
from labkit.techniques import distributed

pytestmark = pytest.mark.skipif(launcher.cpu_cores() < 2, reason="two CPU processes need two cores")


@pytest.fixture(scope="module")
def cfg():
    return labkit.RunConfig(model="tiny_vit", dataset="shapes10", batch_size=32, max_steps=6, train_size=256,
                            device="cpu")


@pytest.fixture(scope="module")
def eq(cfg):
    return lab.equivalence(cfg, nproc=2, progress=False)


def flat(text) -> str:
    return " ".join(str(text).split())


def test_one_process_and_two_train_the_same(eq):
    assert eq.identical_weights and eq.max_difference == float(eq.curves.loss_difference.max()) < 1e-3
    assert list(eq.frame.world_size) == [1, 2] and list(eq.frame.samples_per_rank) == [32, 16]
    text = flat(eq.finding())
    assert f"loss curves within {eq.max_difference:.1e} over 6 steps" in text and "identical parameters" in text
    shown = repr(eq)
    assert "processes (world size)" in shown and text in flat(shown)  # the table, then the finding
    assert "<table" in eq._repr_html_()


def test_scaling_words_its_outcome_from_the_step_times_spread(cfg, eq):
    frame = jobs_frame([eq.one, eq.many])
    frame["speedup"] = frame.throughput / frame.throughput[0]
    frame["efficiency"] = frame.step_time_s[0] / (frame.world_size * frame.step_time_s)
    assert f"efficiency {frame.efficiency[1]:.0%}" in flat(Scaling(frame).finding())
    # (median, p10, p90) of two processes against one process's 0.10 s (0.09 to 0.11): the verdict follows the spread
    for times, verdict in (((0.055, 0.05, 0.06), "near-linear"), ((0.08, 0.07, 0.085), "a real gain, less than linear"),
                           ((0.1, 0.08, 0.12), "no gain: within the noise"), ((0.2, 0.15, 0.25), "slower")):
        fake = frame.copy()
        fake.loc[0, ["step_time_s", "step_time_p10_s", "step_time_p90_s"]] = 0.10, 0.09, 0.11
        fake.loc[1, ["step_time_s", "step_time_p10_s", "step_time_p90_s"]] = times
        fake["efficiency"] = 0.10 / (fake.world_size * fake.step_time_s)
        assert verdict in flat(Scaling(fake).finding()), (times, verdict)
    scale = lab.scaling(cfg, sizes=(1, 2), progress=False)  # both jobs cached
    assert list(scale.world_size) == [1, 2] and scale.efficiency.iloc[0] == 1.0
    assert "efficiency" in repr(scale) and "2 processes:" in flat(scale.finding())


def test_buckets_and_accumulation(cfg, eq):
    buckets = lab.bucket_sweep(cfg, sizes=(0.25, 25), progress=False)
    assert buckets.allreduces_per_step.iloc[0] > buckets.allreduces_per_step.iloc[1]
    assert "0.25 MB buckets:" in flat(buckets.finding()) and "x (" in flat(buckets.finding())
    acc = lab.accumulation(cfg, grad_accum=2, nproc=2, progress=False)
    assert list(acc.grad_accum) == [1, 2] and acc.allreduces_per_step.nunique() == 1
    assert "no_sync skipped the early micro-batches" in flat(acc.finding())


def test_fsdp_holds_a_shard_per_rank_and_trains_the_same(cfg, eq):
    sharded = lab.fsdp_comparison(cfg, nproc=2, progress=False)
    ddp, fsdp = sharded.iloc[0], sharded.iloc[1]
    assert list(sharded.strategy) == ["ddp", "fsdp"] and ddp.parameter_bytes == 4 * eq.many.num_params
    assert 0.4 < fsdp.parameter_bytes / ddp.parameter_bytes < 0.6
    assert 0.4 < fsdp.optimizer_state_bytes / ddp.optimizer_state_bytes < 0.6
    assert torch.allclose(torch.tensor(fsdp.losses), torch.tensor(eq.many.losses), rtol=1e-4, atol=1e-5)
    assert "FSDP held 5" in flat(sharded.finding()) and "1/2 = 50%" in flat(sharded.finding())
    fake = sharded.frame.copy()
    fake.loc[:, ["step_time_s", "step_time_p10_s", "step_time_p90_s"]] = [[0.1, 0.09, 0.11], [0.2, 0.18, 0.22]]
    assert "its steps took 2.00x DDP's (slower)" in flat(Sharding(fake).finding())


def test_a_failed_rank_is_a_result(cfg):
    died = lab.fault_demo(cfg, fail_rank=1, fail_step=2, how="raise")
    assert died.error.rank == 1 and died.elapsed_s == died.frame.elapsed_s.iloc[0] < 60
    assert "The job named rank 1: rank 1 failed after step 2" in flat(died.finding())


def test_the_panel_run_is_a_labelled_row(cfg, eq):
    run = lab.panel_run(cfg, nproc=2)  # cached: the same job as eq.many
    assert run.to_row()["setup"] == "2p, 25MB, acc1" and run.to_row()["step_time_s"] == eq.many.step_time_s
    assert str(run).startswith("2p, 25MB, acc1: ") and "all-reduces a step" in str(run)
    assert lab.panel_estimate(cfg).startswith("Estimated time: about ")


def test_data_parallel_runs_here_and_the_comparison_needs_two_gpus(cfg):
    result = data_parallel_fit(cfg, progress=False)  # without GPUs DataParallel just calls the model
    assert result.accuracy is not None and result.steps == 6
    comparison = lab.dp_vs_ddp(cfg)
    assert comparison.frame is None and "needs at least 2 GPUs; this machine has 0" in flat(comparison.finding())
    assert comparison.table() is None and flat(repr(comparison)) == flat(comparison.finding())  # no empty table
    rows = [{"method": method, "gpus": 2, "step_time_s": step, "step_time_p10_s": step * 0.9,
             "step_time_p90_s": step * 1.1, "throughput": 64 / step, "peak_memory_bytes": memory, "accuracy": 0.5}
            for method, step, memory in (("DataParallel", 0.2, 3 * 2**30), ("DDP", 0.1, 2**30))]
    measured = flat(DataParallelComparison(pd.DataFrame(rows), gpus=2).finding())
    assert "DDP 2.00x DataParallel's throughput (faster)" in measured and "3 GiB with DataParallel" in measured


def test_commands_and_sizing():
    commands = launcher.multi_node_commands(nproc=4, nnodes=2, endpoint="h:1")
    assert len(commands) == 2 and "--node_rank=1" in commands[1] and "--rdzv_endpoint=h:1" in commands[0]
    assert all(len(line) <= 100 for command in commands for line in command.splitlines())
    sizing = lab.fsdp_sizing(num_params=1e9, gpu_bytes=16e9)
    assert sizing.per_gpu_bytes.iloc[0] == 16e9 and sizing.per_gpu_bytes.iloc[1] == 8e9
    assert sizing.fits.tolist() == [True, True, True, True, True] and "per GPU" in repr(sizing)


def test_one_gpu_runs_the_jobs_as_cpu_processes():
    with labkit.machine.described("t4"):  # one GPU: DDP needs a process per device, so CPU processes
        cfg = lab.workload(labkit.profile("ci"))
        assert (cfg.device, cfg.model, cfg.dataset) == ("cpu", "tiny_vit", "shapes10")
        assert "this machine has 1: nothing measured" in flat(lab.dp_vs_ddp(cfg.replace(device="auto")).finding())
    with labkit.machine.described("2xt4"):
        assert lab.workload(labkit.profile("ci")).device == "auto"  # two GPUs: one process on each
        assert launcher.max_processes("cuda") == 2
        lm = lab.language_workload(labkit.profile("full"))  # Kaggle at full: SmolLM2 on both T4s, in fp16 there
        assert (lm.model, lm.device, lm.precision, lm.evaluate) == ("smollm2_135m", "auto", "auto", False)
        assert lab.language_workload(labkit.profile("ci")).device == "cpu"
    with labkit.machine.described("t4"):
        assert lab.language_workload(labkit.profile("full")).model == "tiny_llama"  # one GPU: CPU processes


def test_parameters_and_buffers_are_compared_apart():
    ranks = [{"weights_sha256": f"w{r}", "parameters_sha256": "same", "buffers_sha256": f"bn{r}"} for r in (0, 1)]
    many = SimpleNamespace(distributed={"world_size": 2, "ranks": ranks, "weights_sha256": ["w0", "w1"]},
                           losses=[1.0, 0.9], accuracy=0.5)
    one = SimpleNamespace(config={"batch_size": 8}, losses=[1.0, 0.9], accuracy=0.5)
    eq = Equivalence(pd.DataFrame(), one=one, many=many)  # BatchNorm on CPU processes: no SyncBatchNorm on gloo
    assert eq.identical_weights and not eq.identical_buffers
    assert "identical parameters on every rank (BatchNorm's running statistics differ" in flat(eq.finding())
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    before = {part: distributed.weights_sha256(model, part) for part in ("parameters", "buffers")}
    model[1].running_mean += 1  # a rank's own statistics
    assert distributed.weights_sha256(model, "parameters") == before["parameters"]
    assert distributed.weights_sha256(model, "buffers") != before["buffers"]

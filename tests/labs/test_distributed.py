"""labkit.labs.distributed: torchrun jobs of 1 and 2 CPU processes over gloo, the same training, faults named."""

import json
import socket
import time

import pandas as pd
import pytest
import torch

import labkit
from labkit.errors import ConfigError, DistributedError, UnsupportedError
from labkit.labs import distributed as lab
from labkit.labs.distributed import failures
from labkit.techniques import distributed

pytestmark = pytest.mark.skipif(lab.cpu_cores() < 2, reason="two CPU processes need two cores")


@pytest.fixture(scope="module")
def cfg():
    return labkit.RunConfig(model="tiny_vit", dataset="shapes10", batch_size=32, max_steps=6, train_size=256,
                            device="cpu")


@pytest.fixture(scope="module")
def one(cfg):
    return lab.launch(cfg, nproc=1, progress=False)


@pytest.fixture(scope="module")
def two(cfg):
    return lab.launch(cfg, nproc=2, progress=False)


def test_two_processes_train_what_one_does(one, two):
    assert two.distributed["world_size"] == 2 and two.distributed["backend"] == "gloo"
    assert len(two.distributed["weights_sha256"]) == 2 and len(set(two.distributed["weights_sha256"])) == 1
    assert [r["samples_per_step"] for r in two.distributed["ranks"]] == [16, 16]
    assert one.distributed["world_size"] == 1 and one.distributed["ranks"][0]["samples_per_step"] == 32
    # the same global batches in the same order: the loss curves agree to float rounding
    assert torch.allclose(torch.tensor(one.losses), torch.tensor(two.losses), rtol=1e-4, atol=1e-5)
    assert one.accuracy == two.accuracy and one.steps == two.steps == 6
    assert two.distributed["threads_per_rank"] == lab.threads_per_rank("cpu", 2) == max(1, lab.thread_budget() // 2)
    assert "--nproc_per_node=2" in two.distributed["command"] and "labkit.worker" in two.distributed["command"]


def test_gradients_are_all_reduced_once_per_step_in_buckets(cfg, one, two):
    param_bytes = 4 * two.num_params
    assert two.distributed["allreduce_bytes_per_step"] == param_bytes
    small = lab.launch(cfg, nproc=2, bucket_cap_mb=0.25, progress=False)  # 9 buckets, the same bytes in all
    assert small.distributed["ranks"][0]["allreduces_per_step"] > two.distributed["ranks"][0]["allreduces_per_step"]
    assert small.distributed["allreduce_bytes_per_step"] == param_bytes
    assert two.distributed["ranks"][0]["allreduces_per_step"] >= 1
    comm = two.distributed["communication"]
    assert comm["allreduce_s"] > 0 and 0 < comm["share"] < 1
    assert one.throughput == pytest.approx(32 / one.step_time_s)


def test_accumulation_skips_the_sync_on_all_but_the_last_micro_batch(cfg, two):
    accum = lab.launch(cfg.replace(grad_accum=2), nproc=2, progress=False)
    per_step = [r["allreduces_per_step"] for r in accum.distributed["ranks"]]
    assert per_step == [r["allreduces_per_step"] for r in two.distributed["ranks"]]  # not twice as many
    assert torch.allclose(torch.tensor(accum.losses), torch.tensor(two.losses), rtol=1e-4, atol=1e-5)


def test_a_cached_job_comes_back_without_running(cfg, two):
    start = time.perf_counter()
    again = lab.launch(cfg, nproc=2, progress=False)
    assert time.perf_counter() - start < 2 and again.losses == two.losses


def test_a_rank_that_raises_ends_the_job_with_its_name(cfg):
    start = time.perf_counter()
    failed = r"rank 1 failed after step 2: InjectedFailure: rank 1 failed on purpose"
    with pytest.raises(DistributedError, match=failed) as info:
        lab.launch(cfg, nproc=2, fail_rank=1, fail_step=2, progress=False)
    assert info.value.rank == 1 and info.value.exit_code != 0 and time.perf_counter() - start < 60
    assert "[/" not in str(info.value)  # gloo's C++ source paths are left out
    start = time.perf_counter()  # the same failure again: from the cache, the same error and the job's own time
    with pytest.raises(DistributedError) as again:
        lab.launch(cfg, nproc=2, fail_rank=1, fail_step=2, progress=False)
    assert time.perf_counter() - start < 5 and str(again.value) == str(info.value)
    assert (again.value.rank, again.value.exit_code, again.value.elapsed_s) == \
        (info.value.rank, info.value.exit_code, info.value.elapsed_s)


# A rank that hangs: tests/test_doctor.py launches that job (the doctor's probe is `launch` with a short timeout) and
# checks launch's message there, so that CI starts its three processes once.


def test_a_rank_that_dies_is_named_within_the_timeout(cfg):
    start = time.perf_counter()
    with pytest.raises(DistributedError, match=r"rank 1 died with exit code 13 without raising an error") as info:
        lab.launch(cfg, nproc=2, fail_rank=1, fail_step=2, fail_how="exit", timeout_s=2, progress=False)
    assert info.value.rank == 1 and time.perf_counter() - start < 60


def test_bad_launches_name_the_value(cfg):
    cores = lab.cpu_cores()
    with pytest.raises(ConfigError, match=rf"nproc=0 is not allowed: an integer from 1 to {cores}"):
        lab.launch(cfg, nproc=0)
    with pytest.raises(ConfigError, match=rf"nproc={cores + 1} is not allowed: .*{cores} CPU core"):
        lab.launch(cfg, nproc=cores + 1)
    with pytest.raises(UnsupportedError, match="backend='nccl' cannot run here"):
        lab.launch(cfg, backend="nccl")
    with pytest.raises(ConfigError, match=r"backend='mpi'"):
        lab.launch(cfg, backend="mpi")
    with pytest.raises(ConfigError, match=r"fail_rank=2 is not allowed: None or a rank from 0 to 1"):
        lab.launch(cfg, fail_rank=2, fail_step=1)
    with pytest.raises(ConfigError, match=r"fail_step=None is not allowed: set together"):
        lab.launch(cfg, fail_rank=1)
    with pytest.raises(ConfigError, match=r"fail_step=7 is not allowed: a step the run reaches: 1 to 6"):
        lab.launch(cfg, fail_rank=1, fail_step=7)
    with pytest.raises(ConfigError, match=r"fail_how='crash'"):
        lab.launch(cfg, fail_rank=1, fail_step=1, fail_how="crash")
    with pytest.raises(ConfigError, match=r"batch_size=33 is not allowed: a multiple of nproc x grad_accum = 2 x 1"):
        lab.launch(cfg.replace(batch_size=33))
    with pytest.raises(ConfigError, match=r"bucket_cap_mb=0 is not allowed"):
        lab.launch(cfg, bucket_cap_mb=0)
    with pytest.raises(ConfigError, match=r"limit_s=0 is not allowed: None \(no limit beyond the timeout\)"):
        lab.launch(cfg, limit_s=0)
    with pytest.raises(ConfigError, match=r"script='nowhere.py' is not allowed: a Python file that exists"):
        lab.run_script("nowhere.py", cfg)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"port={port} is not allowed: a free TCP port"):
            lab.launch(cfg, port=port)


def test_failure_text_helpers():
    log = ["noise", "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
           "  exitcode  : 13 (pid: 12)"]
    assert failures.torchrun_root_rank(log) == (1, 13)
    assert failures.torchrun_root_rank(["no summary"]) == (None, None)
    assert failures.first_line("x: [/__w/pytorch/gloo/pair.cc:561] Connection closed\nmore") == "x: Connection closed"
    wrapped = "Got the following error when running the callback: RuntimeError: Timed out waiting 3000ms"
    assert failures.first_line(wrapped) == "Timed out waiting 3000ms"


def test_trainer_refuses_a_global_batch_the_ranks_cannot_share(monkeypatch, cfg):
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    refused = r"batch_size=32 is not allowed: a multiple of world_size x grad_accum = 3 x 1"
    with pytest.raises(ConfigError, match=refused):
        labkit.train.Trainer(cfg)


def test_fsdp_holds_a_shard_per_rank_and_trains_the_same(cfg, two):
    sharded = lab.launch(cfg, nproc=2, strategy="fsdp", progress=False)
    ddp_rank, fsdp_rank = two.distributed["ranks"][0], sharded.distributed["ranks"][0]
    assert sharded.distributed["strategy"] == "fsdp" and two.distributed["strategy"] == "ddp"
    assert 0.4 < fsdp_rank["parameter_bytes"] / ddp_rank["parameter_bytes"] < 0.6
    assert 0.4 < fsdp_rank["optimizer_state_bytes"] / ddp_rank["optimizer_state_bytes"] < 0.6
    assert ddp_rank["parameter_bytes"] == 4 * two.num_params
    assert torch.allclose(torch.tensor(sharded.losses), torch.tensor(two.losses), rtol=1e-4, atol=1e-5)
    frame = lab.fsdp_comparison(cfg, nproc=2, progress=False)  # both jobs cached now
    assert list(frame.strategy) == ["ddp", "fsdp"]
    assert "FSDP held 5" in flat(lab.fsdp_finding(frame)) and "1/2 = 50%" in flat(lab.fsdp_finding(frame))
    with pytest.raises(ConfigError, match=r"strategy='zero' is not allowed: one of \['ddp', 'fsdp'\]"):
        lab.launch(cfg, strategy="zero")


def flat(text) -> str:
    return " ".join(str(text).split())


def test_findings_come_from_the_numbers(one, two):
    eq = lab.Equivalence(one, two)
    assert eq.identical_weights and eq.max_difference == float(eq.frame.loss_difference.max())
    text = flat(eq.finding())
    assert f"loss curves within {eq.max_difference:.1e} over 6 steps" in text and "identical parameters" in text
    frame = lab.jobs_frame([one, two])
    frame["speedup"] = frame.throughput / frame.throughput[0]
    frame["efficiency"] = frame.step_time_s[0] / (frame.world_size * frame.step_time_s)
    assert f"efficiency {frame.efficiency[1]:.0%}" in flat(lab.scaling_finding(frame))
    # (median, p10, p90) of two processes against one process's 0.10 s (0.09 to 0.11): the verdict follows the spread
    for times, verdict in (((0.055, 0.05, 0.06), "near-linear"), ((0.08, 0.07, 0.085), "a real gain, less than linear"),
                           ((0.1, 0.08, 0.12), "no gain: the same within"), ((0.2, 0.15, 0.25), "slower")):
        fake = frame.copy()
        fake.loc[0, ["step_time_s", "step_time_p10_s", "step_time_p90_s"]] = 0.10, 0.09, 0.11
        fake.loc[1, ["step_time_s", "step_time_p10_s", "step_time_p90_s"]] = times
        fake["efficiency"] = 0.10 / (fake.world_size * fake.step_time_s)
        assert verdict in flat(lab.scaling_finding(fake)), (times, verdict)


def test_the_panel_run_is_a_labelled_row(cfg, two):
    run = lab.panel_run(cfg, nproc=2)  # cached: the same job as `two`
    assert run.to_row()["setup"] == "2p, 25MB, acc1" and run.to_row()["step_time_s"] == two.step_time_s
    assert str(run).startswith("2p, 25MB, acc1: ") and "all-reduces a step" in str(run)
    assert lab.panel_estimate(cfg).startswith("Estimated time: about ")


def test_data_parallel_runs_here_and_the_comparison_needs_two_gpus(cfg):
    result = lab.data_parallel_fit(cfg, progress=False)  # without GPUs DataParallel just calls the model
    assert result.accuracy is not None and result.steps == 6
    comparison = lab.dp_vs_ddp(cfg)
    assert comparison.frame is None and "needs at least 2 GPUs; this machine has 0" in flat(comparison.finding())
    assert comparison.table() is None  # nothing measured: no empty table
    rows = [{"method": method, "gpus": 2, "step_time_s": step, "step_time_p10_s": step * 0.9,
             "step_time_p90_s": step * 1.1, "throughput": 64 / step, "peak_memory_bytes": memory, "accuracy": 0.5}
            for method, step, memory in (("DataParallel", 0.2, 3 * 2**30), ("DDP", 0.1, 2**30))]
    measured = flat(lab.DataParallelComparison(2, pd.DataFrame(rows)).finding())
    assert "DDP 2.00x DataParallel's throughput (faster)" in measured and "3 GiB with DataParallel" in measured


def test_collective_time_counts_overlaps_once():
    from labkit.worker import covered_us

    assert covered_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert covered_us([]) == 0


def test_commands_and_sizing():
    commands = lab.multi_node_commands(nproc=4, nnodes=2, endpoint="h:1")
    assert len(commands) == 2 and "--node_rank=1" in commands[1] and "--rdzv_endpoint=h:1" in commands[0]
    assert all(len(line) <= 100 for command in commands for line in command.splitlines())
    sizing = lab.fsdp_sizing(num_params=1e9, gpu_bytes=16e9)
    assert sizing.per_gpu_bytes.iloc[0] == 16e9 and sizing.per_gpu_bytes.iloc[1] == 8e9
    assert sizing.fits.tolist() == [True, True, True, True, True]


def test_a_silent_death_is_named_even_when_the_survivor_reported_first(tmp_path):
    record = {"rank": 0, "step": 3, "type": "RuntimeError", "message": "Connection closed by peer", "time": 1.0}
    (tmp_path / "error-rank0.json").write_text(json.dumps(record))
    log = ["Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
           "  exitcode  : 13 (pid: 9)"]
    error = failures.failure(tmp_path, 2, 1, 8.0, log, hung=False)
    assert error.rank == 1 and str(error).startswith("rank 1 died with exit code 13 without raising an error")
    assert "rank 0 then stopped with RuntimeError: Connection closed by peer" in str(error)


def test_an_nccl_watchdog_timeout_names_the_rank_that_stopped(tmp_path):
    # What NCCL logs (ProcessGroupNCCL's watchdog aborts a rank whose collective timed out): no Python error record
    log = ["[rank0]:[E1201 10:00:00 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught "
           "collective operation timeout: WorkNCCL(SeqNum=40, OpType=ALLREDUCE) ran for 3000 milliseconds",
           "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
           "  exitcode  : -6 (pid: 9)"]
    error = failures.failure(tmp_path, 2, 1, 12.0, log, hung=False)
    assert error.rank == 1 and str(error).startswith("rank 1 stopped taking part: rank 0 waited for it")


def test_one_gpu_runs_the_jobs_as_cpu_processes():
    with labkit.machine.described("t4"):  # one GPU: DDP needs a process per device, so CPU processes
        cfg = lab.workload(labkit.profile("ci"))
        assert (cfg.device, cfg.model, cfg.dataset) == ("cpu", "tiny_vit", "shapes10")
        assert "this machine has 1: nothing measured" in flat(lab.dp_vs_ddp(cfg.replace(device="auto")).finding())
    with labkit.machine.described("2xt4"):
        assert lab.workload(labkit.profile("ci")).device == "auto"  # two GPUs: one process on each
        assert lab.max_processes("cuda") == 2


def test_ranks_share_the_threads_this_session_was_given(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # OMP_NUM_THREADS=1, as CI sets it
    assert lab.threads_per_rank("cpu", 1) == lab.threads_per_rank("cpu", 2) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1024)  # never more than the cores
    assert lab.threads_per_rank("cpu", 1) == lab.cpu_cores() and lab.threads_per_rank("cuda", 2) == 1


def test_a_progress_line_with_another_ranks_output_on_it_still_reads():
    from labkit.labs.distributed.jobs import _PROGRESS_LINE
    from labkit.worker import PROGRESS

    clean, merged = _PROGRESS_LINE.match(f"{PROGRESS}2 6"), _PROGRESS_LINE.match(f"{PROGRESS}2 6Traceback (most")
    assert clean.groups() == ("2", "6", "") and merged.groups() == ("2", "6", "Traceback (most")
    assert _PROGRESS_LINE.match("Traceback (most recent call last):") is None


def test_parameters_and_buffers_are_compared_apart():
    from types import SimpleNamespace

    from labkit.labs.distributed.equivalence import Equivalence

    ranks = [{"weights_sha256": f"w{r}", "parameters_sha256": "same", "buffers_sha256": f"bn{r}"} for r in (0, 1)]
    many = SimpleNamespace(distributed={"world_size": 2, "ranks": ranks, "weights_sha256": ["w0", "w1"]},
                           losses=[1.0, 0.9], accuracy=0.5)
    one = SimpleNamespace(config={"batch_size": 8}, losses=[1.0, 0.9], accuracy=0.5)
    eq = Equivalence(one, many)  # BatchNorm on CPU processes: no SyncBatchNorm on gloo
    assert eq.identical_weights and not eq.identical_buffers
    assert "identical parameters on every rank (BatchNorm's running statistics differ" in flat(eq.finding())
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    from labkit.techniques import distributed

    before = {part: distributed.weights_sha256(model, part) for part in ("parameters", "buffers")}
    model[1].running_mean += 1  # a rank's own statistics
    assert distributed.weights_sha256(model, "parameters") == before["parameters"]
    assert distributed.weights_sha256(model, "buffers") != before["buffers"]


def test_a_job_downloads_its_data_once_before_the_ranks_start(cfg, monkeypatch):
    order = []
    monkeypatch.setattr(lab.jobs.data, "download_once", lambda name: order.append(("download", name)))

    def run_job(*args, **kwargs):
        order.append(("ranks",))
        raise DistributedError("stopped here: the test needs only the order")

    monkeypatch.setattr(lab.jobs, "run_job", run_job)
    with pytest.raises(DistributedError, match="stopped here"):
        lab.launch(cfg.replace(dataset="cifar10", seed=7), nproc=2, progress=False)
    assert order == [("download", "cifar10"), ("ranks",)]

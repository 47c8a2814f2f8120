"""labkit.launcher: torchrun jobs of 1 and 2 CPU processes over gloo, cached, their failures named; its plumbing."""

import json
import socket
import time

import pytest
import torch

import labkit
from labkit import launcher
from labkit.errors import ConfigError, DistributedError, UnsupportedError
from labkit.techniques import distributed

two_cores = pytest.mark.skipif(launcher.cpu_cores() < 2, reason="two CPU processes need two cores")


@pytest.fixture(scope="module")
def cfg():
    return labkit.RunConfig(model="tiny_vit", dataset="shapes10", batch_size=32, max_steps=6, train_size=256,
                            device="cpu")


@pytest.fixture(scope="module")
def one(cfg):
    return launcher.launch(cfg, nproc=1, progress=False)


@pytest.fixture(scope="module")
def two(cfg):
    return launcher.launch(cfg, nproc=2, progress=False)


@two_cores
def test_two_processes_train_what_one_does(one, two):
    assert two.distributed["world_size"] == 2 and two.distributed["backend"] == "gloo"
    assert len(two.distributed["weights_sha256"]) == 2 and len(set(two.distributed["weights_sha256"])) == 1
    assert [r["samples_per_step"] for r in two.distributed["ranks"]] == [16, 16]
    assert one.distributed["world_size"] == 1 and one.distributed["ranks"][0]["samples_per_step"] == 32
    # the same global batches in the same order: the loss curves agree to float rounding
    assert torch.allclose(torch.tensor(one.losses), torch.tensor(two.losses), rtol=1e-4, atol=1e-5)
    assert one.accuracy == two.accuracy and one.steps == two.steps == 6
    assert two.distributed["threads_per_rank"] == launcher.threads_per_rank("cpu", 2) == \
        max(1, launcher.thread_budget() // 2)
    assert "--nproc_per_node=2" in two.distributed["command"] and "labkit.worker" in two.distributed["command"]


@two_cores
def test_gradients_are_all_reduced_once_per_step_in_buckets(cfg, one, two):
    param_bytes = 4 * two.num_params
    assert two.distributed["allreduce_bytes_per_step"] == param_bytes
    small = launcher.launch(cfg, nproc=2, bucket_cap_mb=0.25, progress=False)  # 9 buckets, the same bytes in all
    assert small.distributed["ranks"][0]["allreduces_per_step"] > two.distributed["ranks"][0]["allreduces_per_step"]
    assert small.distributed["allreduce_bytes_per_step"] == param_bytes
    assert two.distributed["ranks"][0]["allreduces_per_step"] >= 1
    comm = two.distributed["communication"]
    assert comm["allreduce_s"] > 0 and 0 < comm["share"] < 1
    assert one.throughput == pytest.approx(32 / one.step_time_s)


@two_cores
def test_accumulation_skips_the_sync_on_all_but_the_last_micro_batch(cfg, two):
    accum = launcher.launch(cfg.replace(grad_accum=2), nproc=2, progress=False)
    per_step = [r["allreduces_per_step"] for r in accum.distributed["ranks"]]
    assert per_step == [r["allreduces_per_step"] for r in two.distributed["ranks"]]  # not twice as many
    assert torch.allclose(torch.tensor(accum.losses), torch.tensor(two.losses), rtol=1e-4, atol=1e-5)


@two_cores
def test_a_cached_job_comes_back_without_running(cfg, two):
    start = time.perf_counter()
    again = launcher.launch(cfg, nproc=2, progress=False)
    assert time.perf_counter() - start < 2 and again.losses == two.losses
    assert launcher.last_job()["step_s"] == two.step_time_s


@two_cores
def test_a_rank_that_raises_ends_the_job_with_its_name(cfg):
    start = time.perf_counter()
    failed = r"rank 1 failed after step 2: InjectedFailure: rank 1 failed on purpose"
    with pytest.raises(DistributedError, match=failed) as info:
        launcher.launch(cfg, nproc=2, fail_rank=1, fail_step=2, progress=False)
    assert info.value.rank == 1 and info.value.exit_code != 0 and time.perf_counter() - start < 60
    assert "[/" not in str(info.value)  # gloo's C++ source paths are left out
    start = time.perf_counter()  # the same failure again: from the cache, the same error and the job's own time
    with pytest.raises(DistributedError) as again:
        launcher.launch(cfg, nproc=2, fail_rank=1, fail_step=2, progress=False)
    assert time.perf_counter() - start < 5 and str(again.value) == str(info.value)
    assert (again.value.rank, again.value.exit_code, again.value.elapsed_s) == \
        (info.value.rank, info.value.exit_code, info.value.elapsed_s)


# A rank that hangs: tests/test_doctor.py launches that job (the doctor's probe is `launch` with a short timeout) and
# checks launch's message there, so that CI starts its three processes once.


@two_cores
@pytest.mark.parametrize("model", ["tiny_vit", "tiny_llama"])  # a language model's ranks all-reduce every step
def test_a_rank_that_dies_is_named_within_the_timeout(cfg, model):
    job = cfg if model == "tiny_vit" else labkit.RunConfig(model=model, dataset="pydoc_text", batch_size=8, max_steps=6,
                                                           train_size=64, device="cpu", evaluate=False)
    start = time.perf_counter()
    with pytest.raises(DistributedError, match=r"rank 1 died with exit code 13 without raising an error") as info:
        launcher.launch(job, nproc=2, fail_rank=1, fail_step=2, fail_how="exit", timeout_s=2, progress=False)
    assert info.value.rank == 1 and time.perf_counter() - start < 60


@two_cores
def test_bad_launches_name_the_value(cfg):
    cores = launcher.cpu_cores()
    with pytest.raises(ConfigError, match=rf"nproc=0 is not allowed: an integer from 1 to {cores}"):
        launcher.launch(cfg, nproc=0)
    with pytest.raises(ConfigError, match=rf"nproc={cores + 1} is not allowed: .*{cores} CPU core"):
        launcher.launch(cfg, nproc=cores + 1)
    with pytest.raises(UnsupportedError, match="backend='nccl' cannot run here"):
        launcher.launch(cfg, backend="nccl")
    with pytest.raises(ConfigError, match=r"backend='mpi'"):
        launcher.launch(cfg, backend="mpi")
    with pytest.raises(ConfigError, match=r"fail_rank=2 is not allowed: None or a rank from 0 to 1"):
        launcher.launch(cfg, fail_rank=2, fail_step=1)
    with pytest.raises(ConfigError, match=r"fail_step=None is not allowed: set together"):
        launcher.launch(cfg, fail_rank=1)
    with pytest.raises(ConfigError, match=r"fail_step=7 is not allowed: a step the run reaches: 1 to 6"):
        launcher.launch(cfg, fail_rank=1, fail_step=7)
    with pytest.raises(ConfigError, match=r"fail_how='crash'"):
        launcher.launch(cfg, fail_rank=1, fail_step=1, fail_how="crash")
    with pytest.raises(ConfigError, match=r"batch_size=33 is not allowed: a multiple of nproc x grad_accum = 2 x 1"):
        launcher.launch(cfg.replace(batch_size=33))
    with pytest.raises(ConfigError, match=r"bucket_cap_mb=0 is not allowed"):
        launcher.launch(cfg, bucket_cap_mb=0)
    with pytest.raises(ConfigError, match=r"limit_s=0 is not allowed: None \(no limit beyond the timeout\)"):
        launcher.launch(cfg, limit_s=0)
    with pytest.raises(ConfigError, match=r"strategy='zero' is not allowed: one of \['ddp', 'fsdp'\]"):
        launcher.launch(cfg, strategy="zero")
    with pytest.raises(ConfigError, match=r"script='nowhere.py' is not allowed: a Python file that exists"):
        launcher.run_script("nowhere.py", cfg)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert launcher.port_in_use(port)
        with pytest.raises(ConfigError, match=rf"port={port} is not allowed: a free TCP port"):
            launcher.launch(cfg, port=port)


def test_failure_text_helpers():
    log = ["noise", "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
           "  exitcode  : 13 (pid: 12)"]
    assert launcher.torchrun_root_rank(log) == (1, 13)
    assert launcher.torchrun_root_rank(["no summary"]) == (None, None)
    assert launcher.first_line("x: [/__w/pytorch/gloo/pair.cc:561] Connection closed\nmore") == "x: Connection closed"
    wrapped = "Got the following error when running the callback: RuntimeError: Timed out waiting 3000ms"
    assert launcher.first_line(wrapped) == "Timed out waiting 3000ms"


def test_a_silent_death_is_named_even_when_the_survivor_reported_first(tmp_path):
    record = {"rank": 0, "step": 3, "type": "RuntimeError", "message": "Connection closed by peer", "time": 1.0}
    (tmp_path / "error-rank0.json").write_text(json.dumps(record))
    log = ["Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
           "  exitcode  : 13 (pid: 9)"]
    error = launcher.failure(tmp_path, 2, 1, 8.0, log, hung=False)
    assert error.rank == 1 and str(error).startswith("rank 1 died with exit code 13 without raising an error")
    assert "rank 0 then stopped with RuntimeError: Connection closed by peer" in str(error)


def test_a_silent_death_is_named_when_torchrun_saw_the_survivor_fail_first(tmp_path):
    # a language model's ranks all-reduce their token counts at every step's start, so the survivor can fail first
    record = {"rank": 0, "step": 2, "type": "RuntimeError", "message": "Read error: Connection reset by peer",
              "time": 1.0}
    (tmp_path / "error-rank0.json").write_text(json.dumps(record))
    survivor, dead = ["  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 8)"], \
        ["  rank      : 1 (local_rank: 1)", "  exitcode  : 13 (pid: 9)"]
    log = ["Failures:", "[1]:", *survivor, "Root Cause (first observed failure):", "[0]:", *dead]
    swapped = ["Failures:", "[1]:", *dead, "Root Cause (first observed failure):", "[0]:", *survivor]
    for lines in (log, swapped):
        error = launcher.failure(tmp_path, 2, 1, 8.0, lines, hung=False)
        assert error.rank == 1 and str(error).startswith("rank 1 died with exit code 13 without raising an error")
    stopped = [line.replace("13 (pid: 9)", "-15 (pid: 9)") for line in swapped]  # ended by torchrun: not the cause
    assert launcher.failure(tmp_path, 2, 1, 8.0, stopped, hung=False).rank == 0


def test_an_nccl_watchdog_timeout_names_the_rank_that_stopped(tmp_path):
    # What NCCL logs (ProcessGroupNCCL's watchdog aborts a rank whose collective timed out): no Python error record
    log = ["[rank0]:[E1201 10:00:00 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught "
           "collective operation timeout: WorkNCCL(SeqNum=40, OpType=ALLREDUCE) ran for 3000 milliseconds",
           "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
           "  exitcode  : -6 (pid: 9)"]
    error = launcher.failure(tmp_path, 2, 1, 12.0, log, hung=False)
    assert error.rank == 1 and str(error).startswith("rank 1 stopped taking part: rank 0 waited for it")


def test_a_timeout_names_the_silent_rank_and_a_hang_without_records_says_so(tmp_path):
    record = {"rank": 0, "step": 3, "type": "DistBackendError", "message": "Timed out waiting", "time": 1.0}
    hung = launcher.failure(tmp_path, 2, -9, 30.0, ["last line"], hung=True)
    assert hung.rank is None and str(hung).startswith("the job did not finish within 30 s")
    (tmp_path / "error-rank0.json").write_text(json.dumps(record))
    error = launcher.failure(tmp_path, 2, 1, 9.0, [], hung=False)
    assert error.rank == 1 and str(error).startswith("rank 1 stopped taking part after step 3: rank 0 waited")


def test_trainer_refuses_a_global_batch_the_ranks_cannot_share(monkeypatch, cfg):
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    refused = r"batch_size=32 is not allowed: a multiple of world_size x grad_accum = 3 x 1"
    with pytest.raises(ConfigError, match=refused):
        labkit.train.Trainer(cfg)


def test_ranks_share_the_threads_this_session_was_given(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # OMP_NUM_THREADS=1, as CI sets it
    assert launcher.threads_per_rank("cpu", 1) == launcher.threads_per_rank("cpu", 2) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1024)  # never more than the cores
    assert launcher.threads_per_rank("cpu", 1) == launcher.cpu_cores() and launcher.threads_per_rank("cuda", 2) == 1


def test_a_progress_line_with_another_ranks_output_on_it_still_reads():
    from labkit.worker import PROGRESS

    line = launcher._PROGRESS_LINE
    clean, merged = line.match(f"{PROGRESS}2 6"), line.match(f"{PROGRESS}2 6Traceback (most")
    assert clean.groups() == ("2", "6", "") and merged.groups() == ("2", "6", "Traceback (most")
    assert line.match("Traceback (most recent call last):") is None


def test_collective_time_counts_overlaps_once():
    from labkit.worker import covered_us

    assert covered_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert covered_us([]) == 0


@two_cores
def test_a_job_downloads_its_data_once_before_the_ranks_start(cfg, monkeypatch):
    order = []
    monkeypatch.setattr(launcher.data, "download_once", lambda name: order.append(("download", name)))

    def run_job(*args, **kwargs):
        order.append(("ranks",))
        raise DistributedError("stopped here: the test needs only the order")

    monkeypatch.setattr(launcher, "run_job", run_job)
    with pytest.raises(DistributedError, match="stopped here"):
        launcher.launch(cfg.replace(dataset="cifar10", seed=7), nproc=2, progress=False)
    assert order == [("download", "cifar10"), ("ranks",)]


def test_a_cached_record_that_no_longer_reads_is_removed(tmp_path):
    path = tmp_path / "job.json"
    assert launcher._read_cached(path, dict) is None
    path.write_text("{not json")
    assert launcher._read_cached(path, dict) is None and not path.exists()
    path.write_text('{"a": 1}')
    assert launcher._read_cached(path, lambda record: record["a"]) == 1


def test_torchrun_commands_one_machine_and_several():
    assert launcher.torchrun_command(["-m", "w"], 2) == [
        "python", "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2", "-m", "w"]
    assert "--master_port=29511" in launcher.torchrun_command(["t.py"], 1, port=29511)
    multi = launcher.shell(launcher.torchrun_command(["train.py"], 4, nnodes=2, node_rank=1,
                                                     rdzv_endpoint="10.0.0.1:29500"))
    assert multi == ("python -m torch.distributed.run --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 "
                     "--node_rank=1 --nproc_per_node=4 train.py")
    with pytest.raises(ConfigError, match="rdzv_endpoint=None is not allowed: host:port"):
        launcher.torchrun_command(["t.py"], 2, nnodes=2)


def test_nccl_environment_for_t4_pairs_only_when_unset():
    assert launcher.nccl_environment("Tesla T4", 2, {}) == {"NCCL_P2P_DISABLE": "1"}
    assert launcher.nccl_environment("Tesla T4", 2, {"NCCL_P2P_DISABLE": "0"}) == {}
    assert launcher.nccl_environment("Tesla T4", 1, {}) == {}
    assert launcher.nccl_environment("NVIDIA A100", 8, {}) == {}


def test_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert launcher.port_in_use(busy.getsockname()[1])

"""Notebook 07's launcher: one data-parallel `fit` over N processes, started with torchrun on labkit's worker.

`launch` runs ``torchrun --standalone --nproc_per_node=N -m labkit.worker ...``, streams rank 0's lines into the
notebook with a progress bar and returns a `RunResult` (cached like `labkit.results.cached_fit`). ``fail_rank`` and
``fail_step`` make a rank fail on purpose: the job then ends with a `DistributedError` naming that rank
(`labkit.labs.distributed.failures`) instead of hanging. `job_row` and `jobs_frame` turn jobs into table rows.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from ... import config, data, machine, models, results, train
from ...config import RunConfig
from ...env import Profile, env_report, profile, resolve_device
from ...errors import ConfigError, DistributedError
from ...messages import note
from ...result import RunResult
from ...techniques import distributed
from ...validate import is_int, is_number
from ...worker import LINE, PROGRESS
from . import failures

WORKER = ["-m", "labkit.worker"]
START_UP_S = 120.0  # allowed for torchrun, the imports and the rendezvous, on top of the training
FAIL_HOW = ("raise", "exit", "hang")
VIT = "tiny_vit"  # LayerNorm, no BatchNorm: one process and N give the same loss curve on a CPU too

# A progress line of rank 0 (``PROGRESS done total``); ranks share one pipe, so another rank's output can follow
# on the same line.
_PROGRESS_LINE = re.compile(re.escape(PROGRESS) + r"(\d+) (\d+)(.*)$")


def cpu_cores() -> int:
    """The CPU cores this process may use (the container's share, not the host's count)."""
    return machine.here().cpu_cores


def max_processes(device_type: str) -> int:
    """The most ranks one job may have here: one per GPU, or one per CPU core.

    Args:
        device_type: ``cpu`` or ``cuda``.
    """
    return machine.here().gpu_count if device_type == "cuda" else cpu_cores()


def workload(prof: Profile | None = None) -> RunConfig:
    """The notebook's fine-tune: ``tiny_vit`` on the small offline data, or the profile's workload at ``full``.

    ``tiny_vit`` has no BatchNorm, so one process and N compute the same thing on a CPU too. With a single GPU
    (Colab) the jobs run as CPU processes on the small workload: DDP takes one process per device. The same on a
    CPU at ``full``: a BatchNorm model's ranks would each normalise by their own samples there (no SyncBatchNorm
    over gloo), and one process and N would train different models.

    Args:
        prof: the profile (default: the active one).
    """
    prof = prof or profile()
    base = config.baseline(prof)
    if base.model == "small_cnn":
        base = base.replace(model=VIT)
    device = resolve_device(base.device).type
    if device == "cuda" and machine.here().gpu_count < 2:
        note("one GPU here, and DDP runs one process per device: this notebook's jobs run as CPU processes over "
             "gloo, on tiny_vit and the small offline data")
        return config.baseline(prof, **{**config.SMALL_WORKLOAD, "model": VIT}, device="cpu")
    if device == "cpu" and uses_batch_statistics(base):  # `full` on a CPU: no SyncBatchNorm over gloo
        note(f"CPU processes here, where BatchNorm's statistics stay per rank (SyncBatchNorm needs CUDA): this "
             f"notebook's jobs run tiny_vit instead of {base.model}, on the small offline data")
        return config.baseline(prof, **{**config.SMALL_WORKLOAD, "model": VIT})
    return base


def uses_batch_statistics(cfg: RunConfig) -> bool:
    """Whether ``cfg``'s model normalises by batch statistics (BatchNorm), so that two jobs of it may differ.

    A micro-batch of ``grad_accum`` and an FSDP rank (no SyncBatchNorm there) normalise over fewer samples than
    the whole batch: their losses differ from DDP's for that reason alone, not by rounding.

    Args:
        cfg: the run.
    """
    return models.has_batchnorm(models.build(cfg.model, 10, pretrained=False)[0])


def planned_steps(cfg: RunConfig) -> int:
    """The optimizer steps a job of ``cfg`` trains (the global batch sets the steps per epoch, as in one process).

    Args:
        cfg: the run.
    """
    return train.total_steps(cfg, (cfg.train_size or profile().train_size) // cfg.batch_size)


def thread_budget() -> int:
    """The CPU threads a job may use: this process's torch threads (``OMP_NUM_THREADS``), at most its cores.

    N ranks share what one process was given, so a session limited to one thread never runs two per rank.
    """
    return max(1, min(cpu_cores(), torch.get_num_threads()))


def threads_per_rank(device_type: str, nproc: int) -> int:
    """CPU threads each rank gets: the `thread_budget` shared out on a CPU; one on GPUs (torchrun's default).

    Args:
        device_type: ``cpu`` or ``cuda``. nproc: the job's processes.
    """
    return max(1, thread_budget() // nproc) if device_type == "cpu" else 1


def check_launch(cfg: RunConfig, nproc, fail_rank, fail_step, fail_how, backend, bucket_cap_mb, timeout_s,
                 port, strategy: str = "ddp") -> tuple[torch.device, str]:
    """The device and backend of a job with `launch`'s arguments, or `ConfigError` naming the first bad one.

    Args:
        cfg, nproc, fail_rank, fail_step, fail_how, backend, bucket_cap_mb, timeout_s, port, strategy: see `launch`.
    """
    if not isinstance(cfg, RunConfig):
        raise ConfigError("cfg", cfg, "a labkit.RunConfig")
    if strategy not in distributed.STRATEGIES:
        raise ConfigError("strategy", strategy, f"one of {list(distributed.STRATEGIES)} (ddp: every rank holds the "
                                                "whole model; fsdp: each holds 1/N of it)")
    device = resolve_device(cfg.device)
    most = max_processes(device.type)
    where = f"{most} GPU(s)" if device.type == "cuda" else f"{most} CPU core(s)"
    if not is_int(nproc) or nproc < 1 or nproc > most:
        raise ConfigError("nproc", nproc, f"an integer from 1 to {most}: one process per device, and this machine "
                                          f"has {where}")
    backend = distributed.check_backend(backend or distributed.default_backend(device.type), device.type)
    if cfg.batch_size % (nproc * cfg.grad_accum):
        raise ConfigError("batch_size", cfg.batch_size, f"a multiple of nproc x grad_accum = {nproc} x {cfg.grad_accum}"
                                                        " (the global batch is split evenly over the ranks)")
    if fail_rank is not None and (not is_int(fail_rank) or not 0 <= fail_rank < nproc):
        raise ConfigError("fail_rank", fail_rank, f"None or a rank from 0 to {nproc - 1}")
    if (fail_rank is None) != (fail_step is None):
        raise ConfigError("fail_step" if fail_rank is not None else "fail_rank", fail_step if fail_rank is not None
                          else fail_rank, "set together with the other one (which rank fails, after which step)")
    if fail_step is not None and (not is_int(fail_step) or fail_step < 1):
        raise ConfigError("fail_step", fail_step, "None or an optimizer step >= 1")
    if fail_step is not None:
        steps = planned_steps(cfg)
        if fail_step > steps:
            raise ConfigError("fail_step", fail_step, f"a step the run reaches: 1 to {steps}")
    if fail_how not in FAIL_HOW:
        raise ConfigError("fail_how", fail_how, f"one of {list(FAIL_HOW)} (raise an error, exit at once, hang)")
    if not is_number(bucket_cap_mb) or not bucket_cap_mb > 0:
        raise ConfigError("bucket_cap_mb", bucket_cap_mb, "a number of MB > 0 (DDP's default is 25)")
    if not is_number(timeout_s) or not timeout_s > 0:
        raise ConfigError("timeout_s", timeout_s, "a number of seconds > 0")
    if port is not None:
        if not is_int(port) or not 1024 <= port <= 65535:
            raise ConfigError("port", port, "None (torchrun picks a free port) or a TCP port from 1024 to 65535")
        if distributed.port_in_use(port):
            raise ConfigError("port", port, "a free TCP port: something on this machine already listens on it",
                              "Pass port=None and torchrun picks a free one")
    return device, backend


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def run_job(command: list[str], env: dict, out: Path, nproc: int, limit_s: float, progress: bool, desc: str,
            printed: list | None = None) -> float:
    """Run torchrun, print rank 0's lines (and add them to ``printed``), move a bar; return the wall time.

    Args:
        command: torchrun's command line. env: its environment. out: the job's folder (``result.json``).
        nproc: its processes. limit_s: stop it after this long. progress: show a bar. desc: the bar's label.
        printed: a list that collects rank 0's lines (None: not kept).

    Raises:
        DistributedError: a rank failed, or the job ran past ``limit_s`` (`failures.failure` names the rank).
    """
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)  # its own process group: stopping it stops every rank
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(process.stdout, lines), daemon=True).start()
    log: list[str] = []
    bar = None  # made at the first progress line: a plain script that reports none shows no bar
    show_bar = progress and os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true")
    hung = False
    try:
        while True:
            remaining = limit_s - (time.perf_counter() - start)
            if remaining <= 0:
                hung = True
                break
            try:
                line = lines.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if line is None:
                break
            progress_line = _PROGRESS_LINE.match(line)
            if progress_line:
                done, total = int(progress_line[1]), int(progress_line[2])
                if progress_line[3]:  # another rank's output (a traceback) landed on the same line of the pipe
                    log.append(progress_line[3])
                if bar is None:
                    bar = tqdm(total=total, desc=desc, leave=False, disable=not show_bar)
                bar.total = total
                bar.n = done
                bar.refresh()
            elif line.startswith(LINE):
                print(f"[rank 0] {line[len(LINE):]}", flush=True)
                if printed is not None:
                    printed.append(f"[rank 0] {line[len(LINE):]}")
            else:
                log.append(line)
    except BaseException:  # Ctrl-C in the notebook: stop every rank, not just torchrun
        _stop(process)
        raise
    finally:
        if bar is not None:
            bar.close()
    if hung:
        _stop(process)
    code = process.wait()
    elapsed = time.perf_counter() - start
    (out / "torchrun.log").write_text("\n".join(log))
    if hung or code != 0 or not (out / "result.json").exists():
        raise failures.failure(out, nproc, code, elapsed, log, hung)
    return elapsed


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def launch(cfg: RunConfig, nproc: int = 2, fail_rank: int | None = None, fail_step: int | None = None,
           fail_how: str = "raise", backend: str | None = None,
           bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB, timeout_s: float = distributed.DEFAULT_TIMEOUT_S,
           port: int | None = None, limit_s: float | None = None, strategy: str = "ddp", refresh: bool = False,
           progress: bool = True) -> RunResult:
    """Run ``fit(cfg)`` data parallel over ``nproc`` processes with torchrun; the job's `RunResult` (cached).

    Args:
        cfg: the run; ``cfg.batch_size`` is the global batch, ``batch_size / nproc`` per rank.
        nproc: processes (ranks), at most one per GPU or CPU core.
        fail_rank, fail_step, fail_how: rank ``fail_rank`` fails on purpose after step ``fail_step``: ``raise``,
            ``exit`` at once (as a crash would) or ``hang`` (alive, out of the collectives).
        backend: ``gloo`` or ``nccl`` (None: the device's).
        bucket_cap_mb: DDP's gradient bucket size.
        timeout_s: the process group's timeout: how long a collective waits for a missing rank.
        port: the rendezvous port (None: torchrun picks a free one).
        limit_s: stop the whole job after this many seconds (None: the timeout, start-up and 20 minutes).
        strategy: ``ddp`` (a whole copy per rank) or ``fsdp`` (FSDP2's ``fully_shard``: 1/N per rank).
        refresh: run again even when a cached result (or a cached failure on purpose) exists.
        progress: show the bar.
    """
    device, backend = check_launch(cfg, nproc, fail_rank, fail_step, fail_how, backend, bucket_cap_mb, timeout_s,
                                   port, strategy)
    if limit_s is not None and (not is_number(limit_s) or not limit_s > 0):
        raise ConfigError("limit_s", limit_s, "None (no limit beyond the timeout) or a number of seconds > 0")
    threads = threads_per_rank(device.type, nproc)
    failing = fail_rank is not None
    env = env_report(cfg.device)
    key = (f"{results.cache_key(cfg, env)}-launch-{strategy}-n{nproc}-{backend}-b{bucket_cap_mb:g}-t{threads}-"
           f"timeout{timeout_s:g}")
    path = results.results_dir() / f"{key}.json"
    failed_path = results.results_dir() / f"{key}-fail-r{fail_rank}-s{fail_step}-{fail_how}.json"
    if failing and not refresh and failed_path.exists():  # a failure on purpose is a result too: shown again
        try:
            record = json.loads(failed_path.read_text())
            error = DistributedError(record["message"], rank=record["rank"], exit_code=record["exit_code"],
                                     elapsed_s=record["elapsed_s"], log=record["log"])
        except (ValueError, KeyError, TypeError):
            failed_path.unlink()
        else:
            for line in record.get("printed", []):
                print(line, flush=True)
            raise error
    if not failing and not refresh and path.exists():
        try:
            cached = RunResult.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError):
            path.unlink()
        else:
            _remember(cached)
            return cached
    data.download_once(cfg.dataset)  # here, once: N ranks would each fetch the same archive into the same folder
    out = Path(tempfile.mkdtemp(prefix="labkit-launch-"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    script = [*WORKER, "--config", str(out / "config.json"), "--out", str(out), "--backend", backend,
              "--timeout-s", f"{timeout_s:g}", "--bucket-cap-mb", f"{bucket_cap_mb:g}", "--strategy", strategy]
    if failing:
        script += ["--fail-rank", str(fail_rank), "--fail-step", str(fail_step), "--fail-how", fail_how]
    command = distributed.torchrun_command(script, nproc, port=port, python=sys.executable)
    child_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                 **distributed.nccl_environment(env.get("gpu"), nproc, os.environ)}
    limit = limit_s if limit_s is not None else timeout_s + START_UP_S + 1200.0
    printed: list[str] = []
    try:
        elapsed = run_job(command, child_env, out, nproc, limit, progress, f"{cfg.model} on {nproc} process(es)",
                          printed)
    except DistributedError as error:
        if failing:  # cached like a finished job, so a rerun (or the browser test after nbval) shows it at once
            results.write_json_atomic(failed_path, {"message": str(error), "rank": error.rank,
                                                    "exit_code": error.exit_code, "elapsed_s": error.elapsed_s,
                                                    "log": error.log, "printed": printed})
        raise
    result = RunResult.from_dict(json.loads((out / "result.json").read_text()))
    shutil.rmtree(out, ignore_errors=True)  # a failed job's folder stays, with its log and error records
    result.distributed.update({"nproc": nproc, "threads_per_rank": threads, "launch_time_s": elapsed,
                               "command": distributed.shell(["torchrun", *command[3:]]),
                               "nccl_environment": distributed.nccl_environment(env.get("gpu"), nproc, os.environ)})
    results.write_json_atomic(path, result.to_dict())
    _remember(result)
    return result


_LAST_JOB: dict = {}  # the start-up and step time of the last job launched in this session (panel estimates)


def _remember(job: RunResult) -> None:
    _LAST_JOB.update(launch_s=job.distributed["launch_time_s"] - job.train_time_s, step_s=job.step_time_s)


def last_job() -> dict:
    """The start-up (``launch_s``) and step time (``step_s``) of the last job this session ran or read; {} before."""
    return dict(_LAST_JOB)


def job_row(result: RunResult) -> dict:
    """One job's headline figures as a table row.

    Args:
        result: a `launch` result.
    """
    job = result.distributed
    comm = job.get("communication") or {}
    ranks = job["ranks"]
    return {
        "world_size": job["world_size"], "backend": job["backend"], "grad_accum": result.config["grad_accum"],
        "bucket_cap_mb": job.get("bucket_cap_mb"), "samples_per_rank": job["samples_per_rank"],
        "threads_per_rank": job.get("threads_per_rank"), "step_time_s": result.step_time_s,
        "step_time_p10_s": result.step_time_p10_s, "step_time_p90_s": result.step_time_p90_s,
        "throughput": result.throughput, "allreduces_per_step": ranks[0]["allreduces_per_step"],
        "allreduce_bytes_per_step": job.get("allreduce_bytes_per_step"),
        "allreduced_per_step_bytes": job.get("allreduce_bytes_per_step"),  # the same, named for `display`'s units
        "comm_share": comm.get("share"),
        "peak_memory_bytes": result.peak_memory_bytes, "accuracy": result.accuracy,
        "final_loss": result.losses[-1] if result.losses else None,
        "identical_weights": len(set(job["weights_sha256"])) == 1, "launch_time_s": job.get("launch_time_s"),
    }


def jobs_frame(jobs: list[RunResult]) -> pd.DataFrame:
    """`job_row` of each job, one row each.

    Args:
        jobs: `launch` results.
    """
    return pd.DataFrame([job_row(job) for job in jobs])



def time_verdict(job, reference) -> str:
    """"faster" or "slower" where ``job``'s p10-p90 step-time spread lies clear of ``reference``'s, else the same.

    Args:
        job, reference: rows (or dicts) with ``step_time_p10_s`` and ``step_time_p90_s``.
    """
    spreads = [job["step_time_p10_s"], job["step_time_p90_s"], reference["step_time_p10_s"],
               reference["step_time_p90_s"]]
    if any(v is None or math.isnan(v) for v in spreads):
        return "no step-time spread to judge by"
    if spreads[1] < spreads[2]:
        return "faster"
    if spreads[0] > spreads[3]:
        return "slower"
    return "the same within the step times' p10-p90 spread"

"""Notebook 07 (distributed data parallel): launching torchrun jobs, their figures and the findings.

- `launch`: one data-parallel `fit` of a config over N processes, started with torchrun on labkit's
  worker (`labkit.worker`), rank 0's output streamed into the notebook with a progress bar, a
  `RunResult` back (cached). ``fail_rank``/``fail_step`` make a rank fail on purpose: the job then ends
  with a `DistributedError` naming that rank instead of hanging.
- `max_processes`, `workload`: how many ranks this machine runs, and the notebook's fine-tune.
- `equivalence`, `equivalence_finding`: one process against N on the same global batch: loss curves,
  the final weights of every rank, accuracy.
- `scaling`, `scaling_finding`: throughput, speed-up and efficiency T1 / (N x TN) over world sizes,
  with the communication share of a step from the profiler.
- `accumulation_finding`: gradient all-reduces per optimizer step with and without accumulation
  (``no_sync`` on all but the last micro-batch).
- `fault_demo`: a rank killed mid-run, the time until the job ended and what it said.
- `panel_run`, `DistRun`: what the notebook's panel runs.

The mechanism is in `labkit.techniques.distributed`; `labkit.train.Trainer` applies it inside a
process group.
"""

from __future__ import annotations

import json
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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from ... import config, data, models, results, train
from ...capacity import training_memory
from ...config import RunConfig
from ...env import Profile, env_report, profile, resolve_device
from ...errors import ConfigError, DistributedError
from ...messages import worded
from ...result import RunResult
from ...techniques import distributed
from ...validate import is_int, is_number
from ...worker import LINE, PROGRESS

WORKER = ["-m", "labkit.worker"]
START_UP_S = 120.0  # allowed for torchrun, the imports and the rendezvous, on top of the training
LOG_TAIL_LINES = 30
FAIL_HOW = ("raise", "exit", "hang")
EARLY_STEPS = 10
VIT = "tiny_vit"  # LayerNorm, no BatchNorm: one process and N give the same loss curve on a CPU too


def cpu_cores() -> int:
    """The CPU cores this process may use (the container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def max_processes(device_type: str) -> int:
    """The most ranks one job may have here: one per GPU, or one per CPU core."""
    return torch.cuda.device_count() if device_type == "cuda" else cpu_cores()


def workload(prof: Profile | None = None) -> RunConfig:
    """The notebook's fine-tune: ``tiny_vit`` on the small offline data at ``ci``/``quick`` (no BatchNorm,
    so one process and N compute the same thing on a CPU), the profile's workload at ``full``."""
    prof = prof or profile()
    base = config.baseline(prof)
    if base.model == "small_cnn":
        return base.replace(model=VIT)
    return base


def planned_steps(cfg: RunConfig) -> int:
    """The optimizer steps a job of ``cfg`` trains (the global batch sets the steps per epoch, as in one process)."""
    return train.total_steps(cfg, (cfg.train_size or profile().train_size) // cfg.batch_size)


def threads_per_rank(device_type: str, nproc: int) -> int:
    """CPU threads each rank gets: the cores shared out on a CPU; one on GPUs (torchrun's default)."""
    return max(1, cpu_cores() // nproc) if device_type == "cpu" else 1


def _check_launch(cfg: RunConfig, nproc, fail_rank, fail_step, fail_how, backend, bucket_cap_mb, timeout_s,
                  port, strategy: str = "ddp") -> tuple[torch.device, str]:
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


def _root_cause(out: Path) -> list[dict]:
    """The ranks' error records, first failure first."""
    records = [json.loads(path.read_text()) for path in sorted(out.glob("error-rank*.json"))]
    return sorted(records, key=lambda record: record["time"])


_SOURCE_PATH = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*")  # gloo's "[/__w/.../pair.cc:561] "


# DDP's wrapper around a collective's error, with the inner error's type (the record names the type already)
_CALLBACK = re.compile(r"Got the following error when running the callback: (?:\w+: )?")


def _first_line(text: str, limit: int = 160) -> str:
    """The first line of an error message, without C++ source paths and DDP's callback wrapper, at most
    ``limit`` characters."""
    text = _CALLBACK.sub("", _SOURCE_PATH.sub("", str(text))).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


_NCCL_TIMEOUT = re.compile(r"Rank (\d+)\] Watchdog caught collective operation timeout")


def _torchrun_root_rank(log: list[str]) -> tuple[int | None, int | None]:
    """The rank and exit code of torchrun's "Root Cause (first observed failure)" summary, if it printed one."""
    text = "\n".join(log)
    cause = text.split("Root Cause", 1)
    if len(cause) < 2:
        return None, None
    rank = re.search(r"rank\s*:\s*(\d+)", cause[1])
    code = re.search(r"exitcode\s*:\s*(-?\d+)", cause[1])
    return (int(rank.group(1)) if rank else None), (int(code.group(1)) if code else None)


def _failure(out: Path, nproc: int, code: int | None, elapsed_s: float, log: list[str], hung: bool) -> DistributedError:
    tail = "\n".join(log[-LOG_TAIL_LINES:])
    records = _root_cause(out)
    ended = f"The job ended with exit code {code} after {elapsed_s:.1f} s"
    if hung and not records:
        return DistributedError(f"the job did not finish within {elapsed_s:.0f} s and was stopped: no rank reported "
                                f"an error, so a rank is stuck (a hang). torchrun's last lines:\n{tail}",
                                exit_code=code, elapsed_s=elapsed_s, log=tail)
    rank, rank_code = _torchrun_root_rank(log)
    watchdog = sorted({int(r) for r in _NCCL_TIMEOUT.findall("\n".join(log))})
    if watchdog and set(watchdog) != set(range(nproc)):  # NCCL's watchdog ended the ranks that waited too long
        silent = [r for r in range(nproc) if r not in watchdog]
        waited = ", ".join(str(r) for r in watchdog)
        return DistributedError(f"rank {', '.join(str(r) for r in silent)} stopped taking part: rank {waited} waited "
                                f"for it in a collective until the process group's timeout, and NCCL's watchdog "
                                f"ended it. {ended}", rank=silent[0], exit_code=code, elapsed_s=elapsed_s, log=tail)
    if rank is not None and rank not in {r["rank"] for r in records}:  # the first to fail said nothing: it died
        message = (f"rank {rank} died with exit code {rank_code} without raising an error (a crash, os._exit or the "
                   f"out-of-memory killer); torchrun stopped the other ranks. {ended}")
        others = [f"rank {r['rank']} then stopped with {r['type']}: {_first_line(r['message'], 120)}" for r in records]
        return DistributedError("; ".join([message, *others]), rank=rank, exit_code=code, elapsed_s=elapsed_s, log=tail)
    if not records:
        return DistributedError(f"the job ended with exit code {code} after {elapsed_s:.1f} s before any rank "
                                f"reported an error. torchrun's last lines:\n{tail}",
                                exit_code=code, elapsed_s=elapsed_s, log=tail)
    silent = sorted(set(range(nproc)) - {r["rank"] for r in records})
    root = records[0]
    said = f"{root['type']} {root['message']}".lower()
    timed_out = "timed out" in said or "timeout" in said
    if timed_out and silent:  # the others gave up waiting for a rank that said nothing: that one is stuck
        names = ", ".join(str(r) for r in silent)
        message = (f"rank {names} stopped taking part after step {root['step']}: rank {root['rank']} waited "
                   f"for it in an all-reduce until the process group's timeout ({root['type']}: "
                   f"{_first_line(root['message'])}). {ended}")
        return DistributedError(message, rank=silent[0], exit_code=code, elapsed_s=elapsed_s, log=tail)
    message = f"rank {root['rank']} failed after step {root['step']}: {root['type']}: {_first_line(root['message'])}. {ended}"
    others = [f"rank {r['rank']} then stopped with {r['type']}: {_first_line(r['message'], 120)}" for r in records[1:]]
    if others:
        message += "; " + "; ".join(others)
    return DistributedError(message, rank=root["rank"], exit_code=code, elapsed_s=elapsed_s, log=tail)


def _run_job(command: list[str], env: dict, out: Path, nproc: int, limit_s: float, progress: bool, desc: str,
             printed: list | None = None) -> float:
    """Run torchrun, print rank 0's lines (and add them to ``printed``), move a bar; return the wall time or raise
    `DistributedError`."""
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
            if line.startswith(PROGRESS):
                done, total = (int(part) for part in line[len(PROGRESS):].split())
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
        raise _failure(out, nproc, code, elapsed, log, hung)
    return elapsed


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def launch(cfg: RunConfig, nproc: int = 2, fail_rank: int | None = None, fail_step: int | None = None,
           fail_how: str = "raise", backend: str | None = None, bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB,
           timeout_s: float = distributed.DEFAULT_TIMEOUT_S, port: int | None = None, limit_s: float | None = None,
           strategy: str = "ddp", refresh: bool = False, progress: bool = True) -> RunResult:
    """Run ``fit(cfg)`` data parallel over ``nproc`` processes with torchrun, on labkit's worker.

    The command is ``torchrun --standalone --nproc_per_node=N -m labkit.worker ...`` (gloo on a CPU, nccl
    on GPUs, one GPU per process). ``cfg.batch_size`` is the global batch: each rank takes
    ``batch_size / nproc`` of it. Rank 0's lines are printed here; a bar follows its steps. Finished
    jobs are cached like `labkit.results.cached_fit`, and so is the error of a job told to fail (``fail_rank``):
    a rerun raises it again at once, with rank 0's lines printed as they were.

    Args:
        cfg: the run. nproc: processes (ranks), at most one per GPU or CPU core.
        fail_rank, fail_step: make rank ``fail_rank`` fail after optimizer step ``fail_step``, as
            ``fail_how`` says: ``raise`` an error, ``exit`` at once (as a crash or the OOM killer
            would), or ``hang`` (stop taking part while staying alive: the others wait for it in their
            next all-reduce until ``timeout_s``).
        backend: ``gloo`` or ``nccl`` (None: the device's). bucket_cap_mb: DDP's gradient bucket size.
        timeout_s: the process group's timeout: how long a collective waits for a missing rank.
        port: the rendezvous port (None: torchrun picks a free one). limit_s: stop the whole job after
            this many seconds (None: ``timeout_s`` plus start-up time plus 20 minutes).
        strategy: ``ddp`` (DistributedDataParallel: every rank holds the whole model) or ``fsdp`` (FSDP2's
            ``fully_shard`` on every block: each rank holds 1/N of the weights, gradients and optimizer state).
        refresh: run again even when a cached result exists. progress: show the bar.

    Returns:
        The job's `RunResult`: rank 0's, with the loss, FLOPs and accuracy combined over the ranks and
        ``.distributed`` holding ``world_size``, ``backend``, ``weights_sha256`` (one per rank), each
        rank's figures (``ranks``), the communication share of a profiled step (``communication``), the
        CPU threads per rank and the launch time.

    Raises:
        DistributedError: a rank failed (the message names it, the step and its error), or the job hung
            past ``limit_s``.

    Example:
        >>> res = launch(labkit.RunConfig(model="tiny_vit", max_steps=16), nproc=2)
        >>> res.distributed["world_size"], len(set(res.distributed["weights_sha256"]))
        (2, 1)
    """
    device, backend = _check_launch(cfg, nproc, fail_rank, fail_step, fail_how, backend, bucket_cap_mb, timeout_s,
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
        elapsed = _run_job(command, child_env, out, nproc, limit, progress, f"{cfg.model} on {nproc} process(es)",
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


# --- experiments -----------------------------------------------------------------------------------


def job_row(result: RunResult) -> dict:
    """One job's headline figures as a table row."""
    job = result.distributed
    comm = job.get("communication") or {}
    ranks = job["ranks"]
    return {
        "world_size": job["world_size"], "backend": job["backend"], "grad_accum": result.config["grad_accum"],
        "bucket_cap_mb": job.get("bucket_cap_mb"), "samples_per_rank": job["samples_per_rank"],
        "threads_per_rank": job.get("threads_per_rank"), "step_time_s": result.step_time_s,
        "throughput": result.throughput, "allreduces_per_step": ranks[0]["allreduces_per_step"],
        "allreduce_bytes_per_step": job.get("allreduce_bytes_per_step"), "comm_share": comm.get("share"),
        "peak_memory_bytes": result.peak_memory_bytes, "accuracy": result.accuracy,
        "final_loss": result.losses[-1] if result.losses else None,
        "identical_weights": len(set(job["weights_sha256"])) == 1, "launch_time_s": job.get("launch_time_s"),
    }


def jobs_frame(jobs: list[RunResult]) -> pd.DataFrame:
    return pd.DataFrame([job_row(job) for job in jobs])


@dataclass
class Equivalence:
    """One process against N on the same global batch (`equivalence`)."""

    one: RunResult
    many: RunResult

    @property
    def frame(self) -> pd.DataFrame:
        n = self.many.distributed["world_size"]
        frame = pd.DataFrame({"step": range(1, len(self.one.losses) + 1), "loss_1": self.one.losses,
                              f"loss_{n}": self.many.losses})
        frame["loss_difference"] = (frame["loss_1"] - frame[f"loss_{n}"]).abs()
        return frame

    @property
    def max_difference(self) -> float:
        return float(self.frame["loss_difference"].max())

    @property
    def early_difference(self) -> float:
        """The largest loss difference over the first ``EARLY_STEPS`` steps: rounding only, before GPU kernels'
        non-determinism has had steps to grow (over hundreds of steps two GPU runs drift apart a little)."""
        return float(self.frame["loss_difference"].iloc[:EARLY_STEPS].max())

    @property
    def identical_weights(self) -> bool:
        return len(set(self.many.distributed["weights_sha256"])) == 1

    @worded
    def finding(self) -> str:
        n, batch = self.many.distributed["world_size"], self.one.config["batch_size"]
        digest = self.many.distributed["weights_sha256"][0][:12]
        weights = (f"all {n} ranks ended with identical weights (sha256 {digest}...)" if self.identical_weights
                   else f"the ranks' weights DIFFER ({', '.join(d[:8] for d in self.many.distributed['weights_sha256'])})")
        same_accuracy = "the same" if self.one.accuracy == self.many.accuracy else "a different"
        return (f"Global batch {batch}: 1 process, and {n} processes of {batch // n} each, trained the same model. "
                f"Their loss curves differ by at most {self.max_difference:.1e} over {len(self.one.losses)} steps "
                f"(float rounding: the all-reduce adds the ranks' gradients in another order); {weights}; and "
                f"{same_accuracy} test accuracy ({self.one.accuracy:.1%} and {self.many.accuracy:.1%}).")


def equivalence(cfg: RunConfig, nproc: int = 2, progress: bool = True) -> Equivalence:
    """`launch` ``cfg`` on one process and on ``nproc``: the same global batches, so the same training.

    Example:
        >>> eq = equivalence(workload()); print(eq.finding())
    """
    return Equivalence(launch(cfg, nproc=1, progress=progress), launch(cfg, nproc=nproc, progress=progress))


def world_sizes(device_type: str, most: int = 8) -> tuple[int, ...]:
    """1, 2, 4, ... up to the processes this machine runs (at most ``most``)."""
    top = min(most, max_processes(device_type))
    sizes, n = [], 1
    while n <= top:
        sizes.append(n)
        n *= 2
    return tuple(sizes)


def scaling(cfg: RunConfig, sizes: tuple[int, ...] | None = None, progress: bool = True) -> pd.DataFrame:
    """Throughput against world size at the same global batch, with speed-up and efficiency T1 / (N x TN).

    Example:
        >>> scaling(workload())[["world_size", "throughput", "efficiency"]]
    """
    sizes = sizes or world_sizes(resolve_device(cfg.device).type)
    frame = jobs_frame([launch(cfg, nproc=n, progress=progress) for n in sizes])
    first = frame.iloc[0]
    frame["speedup"] = frame["throughput"] / first.throughput
    frame["efficiency"] = first.step_time_s / (frame["world_size"] * frame["step_time_s"])
    return frame


@worded
def scaling_finding(frame: pd.DataFrame) -> str:
    """Which scaling happened here, from the measured throughputs."""
    base, last = frame.iloc[0], frame.iloc[-1]
    n = int(last.world_size)
    line = (f"{n} processes: {last.throughput:.0f} samples/s against {base.throughput:.0f} on one, "
            f"{last.speedup:.2f}x, efficiency {last.efficiency:.0%}")
    comm = f"; the gradient all-reduce took {last.comm_share:.0%} of a profiled step" if pd.notna(last.comm_share) else ""
    if last.efficiency >= 0.85:
        verdict = "Near-linear: each process brought its own hardware and communication stayed small."
    elif last.speedup > 1.05:
        verdict = ("A partial gain: the extra processes helped, but less than linearly (communication, waiting for "
                   "the slowest rank, and work that does not shrink with the batch).")
    else:
        verdict = "No gain: the extra processes brought no extra hardware, or communication ate it."
    if base.threads_per_rank is not None and base.threads_per_rank > 1 and last.threads_per_rank == 1:
        verdict += (f" Here one process already used {int(base.threads_per_rank)} CPU threads; {n} processes got "
                    "one thread each, so they shared the same cores.")
    return f"{line}{comm}. {verdict}"


@worded
def accumulation_finding(plain: RunResult, accumulated: RunResult) -> str:
    """All-reduces per optimizer step with and without gradient accumulation (no_sync on early micro-batches)."""
    k = accumulated.config["grad_accum"]
    a, b = plain.distributed["ranks"][0]["allreduces_per_step"], accumulated.distributed["ranks"][0]["allreduces_per_step"]
    same = max(abs(x - y) for x, y in zip(plain.losses, accumulated.losses, strict=True))
    verdict = ("no_sync skipped the all-reduce on all but the last micro-batch" if b <= a
               else "MORE all-reduces with accumulation: the early micro-batches synchronised too")
    return (f"grad_accum=1: {a:g} gradient all-reduce(s) per optimizer step; grad_accum={k}: {b:g} for {k} "
            f"micro-batches: {verdict} (without it: {a * k:g}). The loss curves differ by at most {same:.1e}: the "
            "same global batch, summed in micro-batches.")


def bucket_sweep(cfg: RunConfig, sizes=(0.25, distributed.DEFAULT_BUCKET_CAP_MB), nproc: int = 2,
                 progress: bool = True) -> pd.DataFrame:
    """The same job with DDP's gradient buckets at each size in MB: buckets per step, step time."""
    return jobs_frame([launch(cfg, nproc=nproc, bucket_cap_mb=size, progress=progress) for size in sizes])


@worded
def bucket_finding(frame: pd.DataFrame) -> str:
    small, large = frame.iloc[0], frame.iloc[-1]
    ratio = small.step_time_s / large.step_time_s
    return (f"{small.bucket_cap_mb:g} MB buckets: {small.allreduces_per_step:g} all-reduces per step, "
            f"{small.step_time_s * 1e3:.0f} ms a step; {large.bucket_cap_mb:g} MB: {large.allreduces_per_step:g}, "
            f"{large.step_time_s * 1e3:.0f} ms ({ratio:.2f}x). Smaller buckets start sending earlier in the backward "
            "pass but pay each collective's fixed cost more often.")


@dataclass
class FaultDemo:
    """A job with one rank failed on purpose (`fault_demo`)."""

    how: str
    error: DistributedError
    elapsed_s: float
    timeout_s: float

    @worded
    def finding(self) -> str:
        return (f"fail_how={self.how!r}: the job ended after {self.elapsed_s:.1f} s (process-group timeout "
                f"{self.timeout_s:g} s) with exit code {self.error.exit_code}, naming rank {self.error.rank}:\n"
                f"  {self.error}")


def fault_demo(cfg: RunConfig, nproc: int = 2, fail_rank: int = 1, fail_step: int = 3, how: str = "raise",
               timeout_s: float = distributed.DEFAULT_TIMEOUT_S, progress: bool = True) -> FaultDemo:
    """Kill or freeze rank ``fail_rank`` after step ``fail_step`` and time how the job ends.

    Example:
        >>> print(fault_demo(workload(), how="hang", timeout_s=5).finding())
    """
    start = time.perf_counter()
    try:
        launch(cfg, nproc=nproc, fail_rank=fail_rank, fail_step=fail_step, fail_how=how, timeout_s=timeout_s,
               progress=progress)
    except DistributedError as error:  # the job's own time: a cached failure comes back at once
        return FaultDemo(how, error, error.elapsed_s or time.perf_counter() - start, timeout_s)
    raise DistributedError(f"rank {fail_rank} was told to fail after step {fail_step}, yet the job finished")


@dataclass
class DistRun:
    """What the panel ran: one job, as a row (`job_row`) with a label."""

    row: dict

    def to_row(self) -> dict:
        return dict(self.row)

    def __str__(self) -> str:
        r = self.row
        return (f"{r['setup']}: {r['step_time_s'] * 1e3:.0f} ms a step, {r['throughput']:.0f} samples/s, "
                f"{r['allreduces_per_step']:g} all-reduces a step, accuracy {r['accuracy']:.1%}")


def panel_run(cfg: RunConfig, nproc: int = 2, bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB,
              progress: bool = False) -> DistRun:
    """The notebook panel's run: `launch` with these settings, as one labelled row."""
    row = job_row(launch(cfg, nproc=nproc, bucket_cap_mb=bucket_cap_mb, progress=progress))
    row["setup"] = f"{nproc}p, {bucket_cap_mb:g}MB, acc{cfg.grad_accum}"
    return DistRun(row)


def multi_node_commands(nproc: int = 4, nnodes: int = 2, endpoint: str = "10.0.0.1:29500") -> list[str]:
    """The command each of ``nnodes`` machines runs for one job, as a learner would type it."""
    script = ["-m", "labkit.worker", "--config", "run.json", "--out", "out/"]
    return [" \\\n    ".join(["torchrun", *distributed.torchrun_command(script, nproc, nnodes=nnodes, node_rank=rank,
                                                                         rdzv_endpoint=endpoint)[3:-len(script)],
                                   distributed.shell(script)])
            for rank in range(nnodes)]



# --- the plain PyTorch script of section 2 ----------------------------------------------------------------

def mechanism_config() -> RunConfig:
    """The small CPU run that notebook 07's plain DDP script and labkit's engine both train (any machine)."""
    return RunConfig(model=VIT, dataset="shapes10", batch_size=32, max_steps=8, train_size=512, device="cpu")


def plain_setup(config_path: str):
    """For a plain DDP script: its `RunConfig`, the training split, a model built as `fit` builds it, and the
    function that turns a uint8 batch into model input."""
    cfg = RunConfig.from_dict(json.loads(Path(config_path).read_text()), source=config_path)
    split = train.run_splits(cfg)["train"]
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)[0]
    return cfg, split, model, lambda images: data.to_model_input(images, split, "cpu")


def plain_finish(losses: list, model: torch.nn.Module, out: str) -> None:
    """For a plain DDP script: average the losses over the ranks, and rank 0 writes them with every rank's weight
    digest to ``out/result.json``; then leave the process group and the process.

    The process ends with ``os._exit(0)``: gloo's worker threads can abort Python's own shutdown after the
    job is done ("terminate called without an active exception", a known torch issue; about one job in
    twenty here), which torchrun would report as a crashed rank.
    """
    mean = distributed.all_reduce_mean(torch.stack(losses))
    digests = distributed.all_gather(distributed.weights_sha256(models.unwrap(model)))
    if distributed.is_main():
        results.write_json_atomic(Path(out) / "result.json", {"losses": mean.tolist(), "weights_sha256": digests})
    distributed.cleanup()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_script(script: str | Path, cfg: RunConfig, nproc: int = 2, progress: bool = True) -> dict:
    """Run a plain DDP ``script`` with torchrun as ``script CONFIG.json OUT``; returns what it wrote to ``OUT/result.json``."""
    device, backend = _check_launch(cfg, nproc, None, None, "raise", None, 1.0, 60.0, None)
    if not Path(script).is_file():
        raise ConfigError("script", str(script), f"a Python file that exists (relative to {Path.cwd()}); write it first")
    out = Path(tempfile.mkdtemp(prefix="labkit-script-"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    command = distributed.torchrun_command([str(script), str(out / "config.json"), str(out)], nproc,
                                           python=sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank(device.type, nproc)), "PYTHONUNBUFFERED": "1"}
    _run_job(command, env, out, nproc, START_UP_S + 600.0, progress, f"{Path(script).name} on {nproc} process(es)")
    record = json.loads((out / "result.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return record


# --- FSDP: shard the model instead of copying it ----------------------------------------------------------


def fsdp_comparison(cfg: RunConfig, nproc: int = 2, progress: bool = True) -> pd.DataFrame:
    """The same job with DDP (a whole copy per rank) and FSDP2 (1/N per rank): what each rank holds, time, loss.

    Example:
        >>> lab.fsdp_comparison(workload())[["strategy", "parameter_bytes", "optimizer_state_bytes"]]
    """
    rows = []
    for strategy in distributed.STRATEGIES:
        job = launch(cfg, nproc=nproc, strategy=strategy, progress=progress)
        rank0 = job.distributed["ranks"][0]
        rows.append({"strategy": strategy, "world_size": nproc, "parameter_bytes": rank0["parameter_bytes"],
                     "optimizer_state_bytes": rank0["optimizer_state_bytes"],
                     "peak_memory_bytes": job.peak_memory_bytes, "step_time_s": job.step_time_s,
                     "comm_share": (job.distributed.get("communication") or {}).get("share"),
                     "final_loss": job.losses[-1], "accuracy": job.accuracy,
                     "weights_sha256": job.distributed["weights_sha256"][0], "losses": job.losses})
    return pd.DataFrame(rows)


@worded
def fsdp_finding(frame: pd.DataFrame) -> str:
    ddp, fsdp = frame.iloc[0], frame.iloc[1]
    n = int(fsdp.world_size)
    same = "the same final weights" if ddp.weights_sha256 == fsdp.weights_sha256 else "slightly different weights"
    loss_gap = max(abs(a - b) for a, b in zip(ddp.losses, fsdp.losses, strict=True))
    return (f"Per rank, FSDP held {fsdp.parameter_bytes / ddp.parameter_bytes:.0%} of DDP's parameter bytes and "
            f"{fsdp.optimizer_state_bytes / ddp.optimizer_state_bytes:.0%} of its optimizer state on {n} ranks "
            f"(1/{n} = {1 / n:.0%}, plus uneven shards); its steps took {fsdp.step_time_s / ddp.step_time_s:.2f}x "
            f"DDP's (weights all-gathered before each block, gradients reduce-scattered after). The two trained "
            f"{same}: the losses differ by at most {loss_gap:.1e}.")


def fsdp_sizing(num_params: float = 7e9, gpu_bytes: float = 16e9, precision: str = "fp32") -> pd.DataFrame:
    """Training memory per GPU of a ``num_params`` model with AdamW, whole (DDP) or sharded over N (FSDP),
    from `labkit.training_memory`, against one GPU of ``gpu_bytes`` (activations not counted)."""
    total = training_memory(num_params, precision=precision, optimizer="adamw")["total"]
    rows = [{"strategy": "DDP (a copy per GPU)", "gpus": n, "per_gpu_GB": total / 1e9, "fits": total <= gpu_bytes}
            for n in (1,)]
    rows += [{"strategy": "FSDP (1/N per GPU)", "gpus": n, "per_gpu_GB": total / n / 1e9, "fits": total / n <= gpu_bytes}
             for n in (2, 4, 8, 16)]
    return pd.DataFrame(rows)


# --- DataParallel against DistributedDataParallel ---------------------------------------------------------

SEED_DP_DDP = {"setup": "4 x V100", "DataParallel_hours": 8.0, "DDP_hours": 1.5}


def data_parallel_fit(cfg: RunConfig, progress: bool = True) -> RunResult:
    """``fit(cfg)`` with the model in ``nn.DataParallel`` in this process: one process, every visible GPU.

    Each step scatters the batch from GPU 0, copies the model to every GPU, runs the replicas in threads
    and gathers the outputs back on GPU 0, where the loss and the gradients are summed. Without GPUs the
    wrapper just calls the model (no replicas).
    """
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, train.run_splits(cfg)["train"].num_classes, pretrained=cfg.pretrained)[0]
    return train.fit(cfg, model=torch.nn.DataParallel(model), progress=progress)


@dataclass
class DataParallelComparison:
    """DataParallel against DDP on this machine's GPUs (`dp_vs_ddp`); ``frame`` is None with fewer than two."""

    gpus: int
    frame: pd.DataFrame | None

    @worded
    def finding(self) -> str:
        seed = SEED_DP_DDP
        if self.frame is None:
            return (f"DataParallel against DDP needs at least 2 GPUs; this machine has {self.gpus}, so nothing was "
                    f"measured here. The seed's run on {seed['setup']}: {seed['DataParallel_hours']:g} h with "
                    f"DataParallel, {seed['DDP_hours']:g} h with DDP ({seed['DataParallel_hours'] / seed['DDP_hours']:.1f}x). "
                    "On Kaggle's 2 x T4 this cell measures both.")
        dp, ddp = self.frame.iloc[0], self.frame.iloc[1]
        return (f"On {self.gpus} GPUs: DataParallel {dp.throughput:.0f} samples/s, DDP {ddp.throughput:.0f} "
                f"({ddp.throughput / dp.throughput:.2f}x); GPU 0's peak memory {dp.peak_memory_bytes / 2**20:.0f} MiB "
                f"with DataParallel (it gathers every output and holds the master copy) against "
                f"{ddp.peak_memory_bytes / 2**20:.0f} MiB per GPU with DDP. The seed's run on {seed['setup']}: "
                f"{seed['DataParallel_hours'] / seed['DDP_hours']:.1f}x.")


def dp_vs_ddp(cfg: RunConfig, progress: bool = True) -> DataParallelComparison:
    """Measure DataParallel and DDP on every GPU of this machine at the same global batch (two or more GPUs).

    Runs the DDP job first (torchrun starts fresh processes) and DataParallel after it, in this process.
    """
    gpus = torch.cuda.device_count() if resolve_device(cfg.device).type == "cuda" else 0
    if gpus < 2:
        return DataParallelComparison(gpus, None)
    ddp = launch(cfg, nproc=gpus, progress=progress)
    dp = data_parallel_fit(cfg, progress=progress)
    rows = [{"method": name, "gpus": gpus, "step_time_s": r.step_time_s, "throughput": r.throughput,
             "peak_memory_bytes": r.peak_memory_bytes, "accuracy": r.accuracy} for name, r in
            (("DataParallel", dp), ("DDP", ddp))]
    return DataParallelComparison(gpus, pd.DataFrame(rows))


def panel_estimate(cfg: RunConfig) -> str | None:
    """The panel's time line, from the last job this session launched (None before any)."""
    if not _LAST_JOB:
        return None
    steps = planned_steps(cfg)
    seconds = _LAST_JOB["launch_s"] + steps * _LAST_JOB["step_s"]
    return (f"Estimated time: about {seconds:.0f} s (from the last job here: {_LAST_JOB['launch_s']:.0f} s to start "
            f"torchrun, import and join, then {steps} steps at about {_LAST_JOB['step_s'] * 1e3:.0f} ms; a cached "
            "setting shows at once).")

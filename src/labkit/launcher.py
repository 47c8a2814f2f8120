"""A data-parallel `fit` over N processes, started with torchrun on labkit's worker (`labkit.worker`), and the rank
that failed named when it does not finish.

`launch` runs ``torchrun --standalone --nproc_per_node=N -m labkit.worker ...``, streams rank 0's lines with a
progress bar and returns the job's `RunResult`, cached like `labkit.results.cached_fit`; a rank made to fail on
purpose (``fail_rank``, ``fail_step``, ``fail_how``) ends the job with a `DistributedError` naming it, cached too.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import data, machine, results, train
from .config import RunConfig
from .env import env_report, profile, resolve_device
from .errors import ConfigError, DistributedError
from .result import RunResult
from .techniques import distributed
from .validate import is_int, is_number
from .worker import LINE, PROGRESS

WORKER = ["-m", "labkit.worker"]
START_UP_S = 120.0  # allowed for torchrun, the imports and the rendezvous, on top of the training
FAIL_HOW = ("raise", "exit", "hang")
VIT = "tiny_vit"  # LayerNorm, no BatchNorm: one process and N train the same model on CPU processes too
LOG_TAIL_LINES = 30

# rank 0's progress line (``PROGRESS done total``); ranks share one pipe, so another rank's output may follow on it
_PROGRESS_LINE = re.compile(re.escape(PROGRESS) + r"(\d+) (\d+)(.*)$")
_SOURCE_PATH = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*")  # gloo's "[/__w/.../pair.cc:561] "
_CALLBACK = re.compile(r"Got the following error when running the callback: (?:\w+: )?")  # DDP's wrapper
# what a surviving rank says when its peer's process is gone (gloo, and NCCL's socket bootstrap)
_LOST_PEER = re.compile(r"connection reset by peer|connection closed by peer|broken pipe", re.IGNORECASE)
STOPPED_BY_TORCHRUN = -15  # SIGTERM: the exit code of a rank torchrun ended because another failed
_NCCL_TIMEOUT = re.compile(r"Rank (\d+)\] Watchdog caught collective operation timeout")


def cpu_cores() -> int:
    """The CPU cores this process may use (the container's share, not the host's count)."""
    return machine.here().cpu_cores


def max_processes(device_type: str) -> int:
    """The most ranks one job may have here: one per GPU, or one per CPU core."""
    return machine.here().gpu_count if device_type == "cuda" else cpu_cores()


def planned_steps(cfg: RunConfig) -> int:
    """The optimizer steps a job of ``cfg`` trains (the global batch sets the steps per epoch, as in one process)."""
    return train.total_steps(cfg, (cfg.train_size or profile().train_size) // cfg.batch_size)


def thread_budget() -> int:
    """The CPU threads a job may share out: this process's torch threads (``OMP_NUM_THREADS``), at most its cores."""
    return max(1, min(cpu_cores(), torch.get_num_threads()))


def threads_per_rank(device_type: str, nproc: int) -> int:
    """CPU threads each rank gets: the `thread_budget` shared out on a CPU; one on GPUs (torchrun's default)."""
    return max(1, thread_budget() // nproc) if device_type == "cpu" else 1


def nccl_environment(gpu_name: str | None, nproc: int, environ=None) -> dict:
    """NCCL settings a multi-GPU job on this GPU needs and that are not set already: Kaggle's 2 x T4 have no working
    peer-to-peer path (NCCL hangs or crashes), so ``NCCL_P2P_DISABLE=1`` routes through host memory."""
    environ = os.environ if environ is None else environ
    if nproc > 1 and gpu_name and "T4" in gpu_name and "NCCL_P2P_DISABLE" not in environ:
        return {"NCCL_P2P_DISABLE": "1"}
    return {}


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def torchrun_command(script: list[str], nproc: int, nnodes: int = 1, node_rank: int | None = None,
                     rdzv_endpoint: str | None = None, port: int | None = None, python: str = "python") -> list[str]:
    """torchrun's command line for ``script`` (``["-m", module, ...]`` or a file): ``--standalone`` on one machine
    (or ``port``); on several, the same command on each with ``nnodes``, the shared ``rdzv_endpoint`` and its
    ``node_rank``."""
    command = [python, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        command += ["--standalone"] if port is None else ["--master_addr=127.0.0.1", f"--master_port={port}"]
        command += ["--nnodes=1"]
    else:
        if not rdzv_endpoint:
            raise ConfigError("rdzv_endpoint", rdzv_endpoint, "host:port of one machine, reachable from all of "
                              "them, when nnodes > 1")
        command += [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}"]
        if node_rank is not None:
            command += [f"--node_rank={node_rank}"]
    return command + [f"--nproc_per_node={nproc}", *script]


def multi_node_commands(nproc: int = 4, nnodes: int = 2, endpoint: str = "10.0.0.1:29500") -> list[str]:
    """The command each of ``nnodes`` machines runs for one job, as a learner would type it."""
    script = ["-m", "labkit.worker", "--config", "run.json", "--out", "out/"]
    return [" \\\n    ".join(["torchrun", *torchrun_command(script, nproc, nnodes=nnodes, node_rank=rank,
                                                             rdzv_endpoint=endpoint)[3:-len(script)], shell(script)])
            for rank in range(nnodes)]


def shell(command: list[str]) -> str:
    """A command list as one line to paste into a terminal."""
    return " ".join(shlex.quote(part) for part in command)


def check_launch(cfg: RunConfig, nproc, fail_rank=None, fail_step=None, fail_how="raise", backend=None,
                 bucket_cap_mb=distributed.DEFAULT_BUCKET_CAP_MB, timeout_s=distributed.DEFAULT_TIMEOUT_S, port=None,
                 strategy: str = "ddp", token_mean: str = "global") -> tuple[torch.device, str]:
    """The device and backend of a job with `launch`'s arguments, or `ConfigError` naming the first bad one."""
    if not isinstance(cfg, RunConfig):
        raise ConfigError("cfg", cfg, "a labkit.RunConfig")
    if strategy not in distributed.STRATEGIES:
        raise ConfigError("strategy", strategy, f"one of {list(distributed.STRATEGIES)} (ddp: every rank holds the "
                                                "whole model; fsdp: each holds 1/N of it)")
    if token_mean not in distributed.TOKEN_MEANS:
        raise ConfigError("token_mean", token_mean, f"one of {list(distributed.TOKEN_MEANS)} (global: a language "
                                                    "model's loss over the job's label tokens; rank: each rank's own)")
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
    if fail_step is not None and fail_step > planned_steps(cfg):
        raise ConfigError("fail_step", fail_step, f"a step the run reaches: 1 to {planned_steps(cfg)}")
    if fail_how not in FAIL_HOW:
        raise ConfigError("fail_how", fail_how, f"one of {list(FAIL_HOW)} (raise an error, exit at once, hang)")
    if not is_number(bucket_cap_mb) or not bucket_cap_mb > 0:
        raise ConfigError("bucket_cap_mb", bucket_cap_mb, "a number of MB > 0 (DDP's default is 25)")
    if not is_number(timeout_s) or not timeout_s > 0:
        raise ConfigError("timeout_s", timeout_s, "a number of seconds > 0")
    if port is not None:
        if not is_int(port) or not 1024 <= port <= 65535:
            raise ConfigError("port", port, "None (torchrun picks a free port) or a TCP port from 1024 to 65535")
        if port_in_use(port):
            raise ConfigError("port", port, "a free TCP port: something on this machine already listens on it",
                              "Pass port=None and torchrun picks a free one")
    return device, backend


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def run_job(command: list[str], env: dict, out: Path, nproc: int, limit_s: float, progress: bool, desc: str,
            printed: list | None = None) -> float:
    """Run torchrun, print rank 0's lines (and add them to ``printed``), move a bar; the wall time, or the
    `DistributedError` of a job that failed or ran past ``limit_s`` (`failure`)."""
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
                if progress_line[3]:  # another rank's output (a traceback) landed on the same line of the pipe
                    log.append(progress_line[3])
                if bar is None:
                    bar = tqdm(total=int(progress_line[2]), desc=desc, leave=False, disable=not show_bar)
                bar.total, bar.n = int(progress_line[2]), int(progress_line[1])
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
        raise failure(out, nproc, code, elapsed, log, hung)
    return elapsed


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _read_cached(path: Path, parse):
    """``parse`` of the JSON record at ``path``; None where there is none or it no longer reads (then removed)."""
    if not path.exists():
        return None
    try:
        return parse(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None


def _failure_record(record: dict) -> tuple[DistributedError, list]:
    error = DistributedError(record["message"], rank=record["rank"], exit_code=record["exit_code"],
                             elapsed_s=record["elapsed_s"], log=record["log"])
    return error, record.get("printed", [])


def launch(cfg: RunConfig, nproc: int = 2, fail_rank: int | None = None, fail_step: int | None = None,
           fail_how: str = "raise", backend: str | None = None,
           bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB, timeout_s: float = distributed.DEFAULT_TIMEOUT_S,
           port: int | None = None, limit_s: float | None = None, strategy: str = "ddp", refresh: bool = False,
           progress: bool = True, token_mean: str = "global") -> RunResult:
    """Run ``fit(cfg)`` data parallel over ``nproc`` processes with torchrun; the job's `RunResult` (cached).

    ``cfg.batch_size`` is the global batch; rank ``fail_rank`` fails on purpose after step ``fail_step`` (``raise``,
    ``exit`` at once like a crash, or ``hang``); ``timeout_s`` is the process group's timeout; ``limit_s`` stops the
    whole job (None: the timeout, start-up and 20 minutes); ``strategy`` ``ddp`` or ``fsdp`` (FSDP2's
    ``fully_shard``: 1/N per rank); ``token_mean`` ``global`` (a language model's loss over the job's label tokens)
    or ``rank`` (each rank's own mean: the uneven-token pitfall, to show it).
    """
    device, backend = check_launch(cfg, nproc, fail_rank, fail_step, fail_how, backend, bucket_cap_mb, timeout_s,
                                   port, strategy, token_mean)
    if limit_s is not None and (not is_number(limit_s) or not limit_s > 0):
        raise ConfigError("limit_s", limit_s, "None (no limit beyond the timeout) or a number of seconds > 0")
    threads = threads_per_rank(device.type, nproc)
    failing = fail_rank is not None
    env = env_report(cfg.device)
    key = (f"{results.cache_key(cfg, env)}-launch-{strategy}-n{nproc}-{backend}-b{bucket_cap_mb:g}-t{threads}-"
           f"timeout{timeout_s:g}" + ("" if token_mean == "global" else f"-mean-{token_mean}"))
    path = results.results_dir() / f"{key}.json"
    failed_path = results.results_dir() / f"{key}-fail-r{fail_rank}-s{fail_step}-{fail_how}.json"
    cached = None if refresh else _read_cached(failed_path if failing else path,
                                               _failure_record if failing else RunResult.from_dict)
    if cached is not None and failing:  # a failure on purpose is a result too: shown again
        error, printed = cached
        for line in printed:
            print(line, flush=True)
        raise error
    if cached is not None:
        _remember(cached)
        return cached
    data.download_once(cfg.dataset)  # here, once: N ranks would each fetch the same archive into the same folder
    out = Path(tempfile.mkdtemp(prefix="labkit-launch-"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    script = [*WORKER, "--config", str(out / "config.json"), "--out", str(out), "--backend", backend,
              "--timeout-s", f"{timeout_s:g}", "--bucket-cap-mb", f"{bucket_cap_mb:g}", "--strategy", strategy,
              "--token-mean", token_mean]
    if failing:
        script += ["--fail-rank", str(fail_rank), "--fail-step", str(fail_step), "--fail-how", fail_how]
    command = torchrun_command(script, nproc, port=port, python=sys.executable)
    nccl = nccl_environment(env.get("gpu"), nproc)
    child_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", **nccl}
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
                               "command": shell(["torchrun", *command[3:]]), "nccl_environment": nccl})
    results.write_json_atomic(path, result.to_dict())
    _remember(result)
    return result


def run_script(script: str | Path, cfg: RunConfig, nproc: int = 2, progress: bool = True) -> dict:
    """Run a plain DDP ``script`` with torchrun as ``script CONFIG.json OUT``; what it wrote to ``OUT/result.json``."""
    device, _ = check_launch(cfg, nproc)
    if not Path(script).is_file():
        raise ConfigError("script", str(script), f"a Python file that exists (relative to {Path.cwd()}); write it "
                          "first")
    out = Path(tempfile.mkdtemp(prefix="labkit-script-"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    command = torchrun_command([str(script), str(out / "config.json"), str(out)], nproc, python=sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank(device.type, nproc)), "PYTHONUNBUFFERED": "1"}
    if device.type == "cpu":  # a script that takes the GPUs when it sees them runs as CPU processes here
        env["CUDA_VISIBLE_DEVICES"] = ""
    run_job(command, env, out, nproc, START_UP_S + 600.0, progress, f"{Path(script).name} on {nproc} process(es)")
    record = json.loads((out / "result.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return record


_LAST_JOB: dict = {}  # the start-up and step time of the last job launched in this session (panel estimates)


def _remember(job: RunResult) -> None:
    _LAST_JOB.update(launch_s=job.distributed["launch_time_s"] - job.train_time_s, step_s=job.step_time_s)


def last_job() -> dict:
    """The start-up (``launch_s``) and step time (``step_s``) of the last job this session ran or read; {} before."""
    return dict(_LAST_JOB)


def first_line(text: str, limit: int = 160) -> str:
    """The first line of an error message, without C++ source paths and DDP's callback wrapper."""
    text = _CALLBACK.sub("", _SOURCE_PATH.sub("", str(text))).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def torchrun_root_rank(log: list[str]) -> tuple[int | None, int | None]:
    """The rank and exit code of torchrun's "Root Cause (first observed failure)" summary, if it printed one."""
    cause = "\n".join(log).split("Root Cause", 1)
    if len(cause) < 2:
        return None, None
    rank = re.search(r"rank\s*:\s*(\d+)", cause[1])
    code = re.search(r"exitcode\s*:\s*(-?\d+)", cause[1])
    return (int(rank.group(1)) if rank else None), (int(code.group(1)) if code else None)


def torchrun_failures(log: list[str]) -> dict[int, int]:
    """Every failed rank's exit code in torchrun's summary (the root cause and the others)."""
    found = re.findall(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", "\n".join(log))
    return {int(rank): int(code) for rank, code in found}


def failure(out: Path, nproc: int, code: int | None, elapsed_s: float, log: list[str], hung: bool) -> DistributedError:
    """The `DistributedError` of a failed job, naming the rank that failed first: the one that raised (its
    ``error-rank<R>.json``), the one that died without a word (torchrun's summary), or the one the others waited
    for until the process group's timeout."""
    tail = "\n".join(log[-LOG_TAIL_LINES:])
    records = sorted((json.loads(p.read_text()) for p in sorted(out.glob("error-rank*.json"))), key=lambda r: r["time"])
    ended = f"The job ended with exit code {code} after {elapsed_s:.1f} s"

    def error(message: str, rank: int | None = None) -> DistributedError:
        return DistributedError(message, rank=rank, exit_code=code, elapsed_s=elapsed_s, log=tail)

    def then(rest: list[dict]) -> list[str]:
        return [f"rank {r['rank']} then stopped with {r['type']}: {first_line(r['message'], 120)}" for r in rest]

    if hung and not records:
        return error(f"the job did not finish within {elapsed_s:.0f} s and was stopped: no rank reported an error, so "
                     f"a rank is stuck (a hang). torchrun's last lines:\n{tail}")
    rank, rank_code = torchrun_root_rank(log)
    watchdog = sorted({int(r) for r in _NCCL_TIMEOUT.findall("\n".join(log))})
    if watchdog and set(watchdog) != set(range(nproc)):  # NCCL's watchdog ended the ranks that waited too long
        silent = [r for r in range(nproc) if r not in watchdog]
        return error(f"rank {', '.join(map(str, silent))} stopped taking part: rank {', '.join(map(str, watchdog))} "
                     f"waited for it in a collective until the process group's timeout, and NCCL's watchdog ended "
                     f"it. {ended}", silent[0])
    recorded = {r["rank"] for r in records}
    lost_peer = any(_LOST_PEER.search(r["message"]) for r in records)
    if (rank is None or rank in recorded) and lost_peer:  # torchrun saw a survivor first, whose peer had gone
        silent = {r: c for r, c in torchrun_failures(log).items() if r not in recorded and c != STOPPED_BY_TORCHRUN}
        rank, rank_code = min(silent.items()) if silent else (rank, rank_code)
    if rank is not None and rank not in recorded:  # the first to fail said nothing: it died
        return error("; ".join([f"rank {rank} died with exit code {rank_code} without raising an error (a crash, "
                                f"os._exit or the out-of-memory killer); torchrun stopped the other ranks. {ended}",
                                *then(records)]), rank)
    if not records:
        return error(f"the job ended with exit code {code} after {elapsed_s:.1f} s before any rank reported an error. "
                     f"torchrun's last lines:\n{tail}")
    silent = sorted(set(range(nproc)) - {r["rank"] for r in records})
    root = records[0]
    said = f"{root['type']} {root['message']}".lower()
    if ("timed out" in said or "timeout" in said) and silent:  # the others gave up waiting for a silent rank
        return error(f"rank {', '.join(map(str, silent))} stopped taking part after step {root['step']}: rank "
                     f"{root['rank']} waited for it in an all-reduce until the process group's timeout "
                     f"({root['type']}: {first_line(root['message'])}). {ended}", silent[0])
    return error("; ".join([f"rank {root['rank']} failed after step {root['step']}: {root['type']}: "
                            f"{first_line(root['message'])}. {ended}", *then(records[1:])]), root["rank"])

"""Reading how a torchrun job ended: the ranks' error records and torchrun's log, into one `DistributedError`.

A rank of labkit's worker that fails writes ``error-rank<R>.json`` (its step, error type and message) before it
exits. `failure` names the rank that failed first: the one that raised, the one that died without a word (torchrun's
"Root Cause" summary), or the one the others waited for until the process group's timeout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...errors import DistributedError

LOG_TAIL_LINES = 30


def root_cause(out: Path) -> list[dict]:
    """The ranks' error records, first failure first.

    Args:
        out: the job's folder.
    """
    records = [json.loads(path.read_text()) for path in sorted(out.glob("error-rank*.json"))]
    return sorted(records, key=lambda record: record["time"])


_SOURCE_PATH = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*")  # gloo's "[/__w/.../pair.cc:561] "


# DDP's wrapper around a collective's error, with the inner error's type (the record names the type already)
_CALLBACK = re.compile(r"Got the following error when running the callback: (?:\w+: )?")


def first_line(text: str, limit: int = 160) -> str:
    """The first line of an error message, without C++ source paths and DDP's callback wrapper.

    Args:
        text: the message. limit: the most characters kept.
    """
    text = _CALLBACK.sub("", _SOURCE_PATH.sub("", str(text))).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


_NCCL_TIMEOUT = re.compile(r"Rank (\d+)\] Watchdog caught collective operation timeout")


def torchrun_root_rank(log: list[str]) -> tuple[int | None, int | None]:
    """The rank and exit code of torchrun's "Root Cause (first observed failure)" summary, if it printed one.

    Args:
        log: torchrun's output lines.
    """
    text = "\n".join(log)
    cause = text.split("Root Cause", 1)
    if len(cause) < 2:
        return None, None
    rank = re.search(r"rank\s*:\s*(\d+)", cause[1])
    code = re.search(r"exitcode\s*:\s*(-?\d+)", cause[1])
    return (int(rank.group(1)) if rank else None), (int(code.group(1)) if code else None)


def failure(out: Path, nproc: int, code: int | None, elapsed_s: float, log: list[str], hung: bool) -> DistributedError:
    """The `DistributedError` of a failed job, naming the rank that failed first and how.

    Args:
        out: the job's folder (the ranks' error records). nproc: its processes. code: torchrun's exit code.
        elapsed_s: the job's wall time. log: torchrun's output lines. hung: whether the job ran past its limit.
    """
    tail = "\n".join(log[-LOG_TAIL_LINES:])
    records = root_cause(out)
    ended = f"The job ended with exit code {code} after {elapsed_s:.1f} s"
    if hung and not records:
        return DistributedError(f"the job did not finish within {elapsed_s:.0f} s and was stopped: no rank reported "
                                f"an error, so a rank is stuck (a hang). torchrun's last lines:\n{tail}",
                                exit_code=code, elapsed_s=elapsed_s, log=tail)
    rank, rank_code = torchrun_root_rank(log)
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
        others = [f"rank {r['rank']} then stopped with {r['type']}: {first_line(r['message'], 120)}" for r in records]
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
                   f"{first_line(root['message'])}). {ended}")
        return DistributedError(message, rank=silent[0], exit_code=code, elapsed_s=elapsed_s, log=tail)
    message = (f"rank {root['rank']} failed after step {root['step']}: {root['type']}: "
               f"{first_line(root['message'])}. {ended}")
    others = [f"rank {r['rank']} then stopped with {r['type']}: {first_line(r['message'], 120)}" for r in records[1:]]
    if others:
        message += "; " + "; ".join(others)
    return DistributedError(message, rank=root["rank"], exit_code=code, elapsed_s=elapsed_s, log=tail)


"""The process torchrun starts for `labkit.launcher.launch`: one rank of a data-parallel `fit`.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m labkit.worker --config run.json --out DIR

Each rank joins the process group (`labkit.techniques.distributed.init`), trains with
`labkit.train.Trainer` (which goes data parallel inside a process group) and leaves the group. Only
rank 0 prints, and only rank 0 writes the result (``DIR/result.json``). A rank that fails writes what
happened to ``DIR/error-rank<R>.json`` before it exits non-zero, so that the launcher can name it.
Lines meant for the notebook start with `LINE`; progress lines with `PROGRESS`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from .config import RunConfig
from .results import write_json_atomic
from .techniques import distributed
from .train import Trainer

LINE = "labkit| "
PROGRESS = "labkit-progress| "
EXIT_CODE = 13  # what a rank told to fail with fail_how="exit" exits with


class InjectedFailure(RuntimeError):
    """The failure `launch(..., fail_rank=R, fail_step=S)` asked for: rank R raises after step S."""


def _say(text: str) -> None:
    for line in str(text).splitlines() or [""]:
        print(f"{LINE}{line}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m labkit.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a JSON file of RunConfig fields")
    parser.add_argument("--out", required=True, help="the folder for result.json and error files")
    parser.add_argument("--backend", default=None, choices=distributed.BACKENDS)
    parser.add_argument("--timeout-s", type=float, default=distributed.DEFAULT_TIMEOUT_S)
    parser.add_argument("--bucket-cap-mb", type=float, default=distributed.DEFAULT_BUCKET_CAP_MB)
    parser.add_argument("--strategy", default="ddp", choices=distributed.STRATEGIES)
    parser.add_argument("--token-mean", default="global", choices=distributed.TOKEN_MEANS)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--fail-step", type=int, default=None)
    parser.add_argument("--fail-how", default="raise", choices=("raise", "exit", "hang"))
    return parser.parse_args(argv)


def _fail(rank: int, step: int, how: str, args) -> None:
    said = f"rank {rank} failed on purpose after step {step} (fail_rank={args.fail_rank}, fail_step={args.fail_step})"
    if how == "exit":  # as a crash or the OOM killer would: no exception, no record, no clean-up
        os._exit(EXIT_CODE)
    if how == "hang":  # alive, but never joins the next collective: the others wait until the timeout
        while True:
            time.sleep(1)
    raise InjectedFailure(said)


def covered_us(spans: list[tuple[float, float]]) -> float:
    """The time covered by the union of ``(start, end)`` spans: overlapping collectives count once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def communication_share(trainer: Trainer) -> dict:
    """One more training step under torch.profiler: its time and the time its gradient all-reduces took.

    gloo runs each collective on its own CPU thread ("gloo:all_reduce", and FSDP's "gloo:all_gather" /
    "gloo:reduce_scatter"); on GPUs the NCCL kernels' device time is summed. Collectives overlap the
    backward pass, and their time includes waiting for the slowest rank, so the share is an upper bound
    of what communication adds to a step.
    """
    item = next(iter(trainer.loader))
    cuda = trainer.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        start = time.perf_counter()
        trainer.step(item)
        if cuda:
            torch.cuda.synchronize(trainer.device)
        step_s = time.perf_counter() - start
    if cuda:
        spans = [e.time_range for e in prof.events() if "nccl" in e.name.lower()
                 and e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        spans = [e.time_range for e in prof.events() if e.name.startswith("gloo:")]
    comm_s = covered_us([(span.start, span.end) for span in spans]) / 1e6
    return {"profiled_step_s": step_s, "allreduce_s": comm_s, "share": comm_s / step_s if step_s > 0 else None}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    step = [0]
    rank = None
    try:
        ctx = distributed.init(args.backend, args.timeout_s)
        rank = ctx.rank
        if rank != 0:  # only rank 0 prints: the others' output goes to a file
            sys.stdout = open(out / f"rank{rank}.log", "w", buffering=1)  # noqa: SIM115 - open until exit
        cfg = RunConfig.from_dict(json.loads(Path(args.config).read_text()), source="worker config")

        def on_step(done: int, total: int) -> None:
            step[0] = done
            if rank == args.fail_rank and done == args.fail_step:
                _fail(rank, done, args.fail_how, args)
            if rank == 0:
                print(f"{PROGRESS}{done} {total}", flush=True)

        if rank == 0:
            _say(f"{ctx.world_size} processes on {ctx.backend}; each trains on {cfg.batch_size // ctx.world_size} "
                 f"of every {cfg.batch_size} samples")
        trainer = Trainer(cfg, bucket_cap_mb=args.bucket_cap_mb, strategy=args.strategy, token_mean=args.token_mean)
        result = trainer.run(on_step=on_step, progress=False)
        result.distributed["timeout_s"] = args.timeout_s
        shares = distributed.all_gather(communication_share(trainer))  # after the result's weights were taken
        result.distributed["communication"] = shares[0]
        result.distributed["communication_by_rank"] = shares
        if rank == 0:
            write_json_atomic(out / "result.json", result.to_dict())
    except BaseException as exc:
        record = {"rank": rank, "step": step[0], "type": type(exc).__name__, "message": str(exc),
                  "traceback": traceback.format_exc(), "time": time.time()}
        name = f"error-rank{rank}.json" if rank is not None else "error-rank-unknown.json"
        write_json_atomic(out / name, record)
        raise
    finally:
        distributed.cleanup()
    return 0


def run_and_exit(argv=None) -> None:
    """`main`, then leave at once, so that torchrun does not report a finished job as a crashed rank.

    torch's C++ threads (gloo, the profiler) can abort the interpreter's own shutdown ("terminate called
    without an active exception", seen on about one job in twenty here) after the job has finished.
    """
    try:
        code = main(argv)
    except BaseException:  # the error record is written; show the traceback, exit non-zero
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()

"""``labkit bench --suite gpu``: every GPU-only measurement of notebooks 01-10 in one command, within a time budget.

The command a GPU session runs, from the repository root (no network needed; ``benchmarks/gpu_wheels.sh`` run
beforehand where there is network puts bitsandbytes, torchao and ipywidgets in ``.whl/``, which it installs)::

    bash benchmarks/gpu_suite.sh   # pip install --no-deps -e . && LABKIT_OFFLINE=1 labkit bench --suite gpu --out $OUT

Each part calls its notebook's lab (`labkit.bench.parts`) and writes ``<notebook>-<part>-<gpu>-<date>.json`` as
soon as it finishes, labelled with the GPU, its capability, torch's CUDA/cuDNN/NCCL builds, the date and the
workloads it ran on (``workload``, and ``fallback`` for a stand-in: `labkit.bench.suite_workloads`). The summary
``gpu_suite-summary-<gpu>-<date>.json`` (part, seconds, status, file, reason, workload, fallback) is rewritten after
every part, so an interruption keeps what finished. A part that raises is recorded there and the others go on; a
part is skipped, with that reason, when its estimate would overrun the budget, and stopped at three times its
estimate or the budget's end; one that cannot run here (DDP on one GPU) says why.

Sizing (``full`` on one T4, the slowest GPU the lab promises): ResNet-18 at 128x128, batch 128, takes about
0.13 s a step in fp32 and 0.05 s in fp16 (``benchmarks/size_full_workload.py``: FLOP counts at NVIDIA's published
T4 rate); bf16 is emulated there (taken as 3x fp32). Offline, without CIFAR-10 on disk, the same model, size and
batch run from random weights on ``shapes10``: the same costs. Every run is cut to `SUITE_STEPS` steps (5 warm-up,
2 profiling, 33 timed: enough for a median and a p10-p90 spread) and costs about 6 s besides (model, cuDNN's
autotuning, the profiling steps, the test split). Each part's estimate is runs x (steps x step time + 6 s).
The language-model arms run SmolLM2-135M's shape from random weights (`labkit.workloads.lm_speed_config`: 13 steps,
6 timed): 6 x 135M FLOPs a token, at 35 % of the T4's 8.1 TFLOP/s in fp32 and 65 in fp16, is 0.15 s and 0.02 s
for 512 tokens, plus AdamW's pass over the weights (0.01-0.04 s):

====================  ===  ===========================================================
part                  s    what costs
====================  ===  ===========================================================
01 compare            55   4 runs: fp32 5 s, TF32 5 s (none on a T4), fp16 2 s, bf16 16 s
01 memory             35   8 runs of 9 steps at batch 32-256, no evaluation
01 layouts            40   4 runs: channels_last or not, fp32 and fp16
02 search             30   about 16 one-step probes up to the 15 GiB cap
03 staged             55   5 runs: baseline, +AMP, +checkpointing, +8-bit AdamW, all
03 optimizers         25   2 new runs (the AdamW baseline is read from the cache)
04 2to4               20   1 fine-tune, 4 evaluations, a 4096^2 fp16 matmul (sm80+)
04 storage            25   CPU matmuls of the largest weight at 4 sparsities
05 levels             55   5 runs, the frozen ones faster
06 methods            70   tiny_vit fine-tune; 8 methods x 2 models built, timed, scored
07 dp-vs-ddp          45   2+ GPUs only: torchrun start-up, DDP and DataParallel runs
08 qlora              20   Qwen2.5-1.5B (08's QLoRA model), 2 runs of 9 steps
09 profiler           15   2 x (2 warm-up steps + 1 profiled step, a trace)
01 lm                 15   2 runs at 4 x 128 tokens: fp32 2 s, fp16 0.5 s (bf16 too where native)
10 attention          55   6 runs at 2 x 128/256/512 tokens, fp32: 0.08-0.33 s a step, eager 1.2x
10 optimizers         20   4 models built (8 s); 40 rounds of 3 AdamW steps, 0.01-0.05 s each
10 ladder             160  7 runs at 8 x 64 tokens (9 s of steps); 2 cold compiles, about 50 s each
====================  ===  ===========================================================

About 695 s on one T4 (07 needs 2+ GPUs): over the budget, so a T4 runs notebooks 01-09 and skips the
language-model arms, which come last, with that reason; name them to run them alone (``bash
benchmarks/gpu_suite.sh 10_language_models 01_mixed_precision-lm``). The budget counts the seconds spent and the
estimates are a T4's, so a faster GPU (an A100, an H200) reaches the last parts within it.

At ``ci`` the same parts run on the CPU in seconds (``tests/test_bench.py``): a smoke test of every part.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
import torch

from ..config import RunConfig
from ..display import text_table
from ..env import env_report, profile
from ..errors import ConfigError
from ..results import write_reference
from ..validate import is_number
from . import parts
from .common import SUITE_STEPS, Part, profile_env, provenance, reference_path, write_part
from .suite_workloads import Workload, suite_workloads

DEFAULT_BUDGET_S = 450.0  # 7.5 minutes: the 8-minute target less Python's start-up and the final summary
PART_LIMIT_FACTOR = 3.0  # a part is stopped at this many times its estimate (a hang must not take the rest)
MIN_PART_LIMIT_S = 60.0


@dataclasses.dataclass(frozen=True)
class SuitePart:
    """One part of a suite: its notebook, name, what it measures, its workloads and its estimate."""

    notebook: str
    name: str
    run: Callable[..., Part]
    workloads: tuple[str, ...]  # keys of `suite_workloads`: the cfgs ``run`` takes, in order
    estimate_s: float  # seconds on one T4 at `full` (see the module docstring)
    measures: str

    @property
    def label(self) -> str:
        return f"{self.notebook}-{self.name}"


GPU_SUITE = (
    SuitePart("01_mixed_precision", "compare", parts.compare_01, ("cnn",), 55,
              "fp32, TF32, fp16 + GradScaler, bf16: step time and peak memory (4 runs)"),
    SuitePart("01_mixed_precision", "memory", parts.memory_01, ("cnn",), 35,
              "peak memory in fp32 and 16 bits at batch 32, 64, 128, 256 (8 runs of 9 steps)"),
    SuitePart("01_mixed_precision", "layouts", parts.layouts_01, ("cnn",), 40,
              "channels_last against NCHW, fp32 and 16 bits (4 runs)"),
    SuitePart("02_batch_size", "search", parts.search_02, ("cnn",), 30,
              "the largest batch under a T4's 15 GiB: real out-of-memory back-off (about 16 one-step probes)"),
    SuitePart("03_memory_savers", "staged", parts.staged_03, ("cnn",), 55,
              "baseline, +AMP, +checkpointing, +8-bit AdamW, all: memory by category (5 runs)"),
    SuitePart("03_memory_savers", "optimizers", parts.optimizers_03, ("cnn",), 25,
              "AdamW, 8-bit AdamW, paged 8-bit AdamW (2 new runs)"),
    SuitePart("04_pruning", "2to4", parts.semi_structured_04, ("cnn",), 20,
              "2:4 sparsity: a 4096x4096 fp16 Linear's speed-up (sm80+), accuracy (1 fine-tune, 4 evaluations)"),
    SuitePart("04_pruning", "storage", parts.storage_04, ("cnn",), 25,
              "the largest weight dense, COO and CSR: bytes and (CPU) matmul time at 4 sparsities"),
    SuitePart("05_freezing", "levels", parts.levels_05, ("cnn",), 55,
              "step time, memory and backward FLOPs per freezing level (5 runs)"),
    SuitePart("06_quantization", "methods", parts.methods_06, ("cnn", "vit"), 70,
              "GPU latency of fp16, bf16, torchao int8/int4 (tinygemm, sm80+), bitsandbytes int8/NF4, both models"),
    SuitePart("07_distributed", "dp-vs-ddp", parts.dp_vs_ddp_07, ("ddp",), 45,
              "DataParallel against DDP over NCCL (2+ GPUs; one GPU: not run)"),
    SuitePart("08_lora", "qlora", parts.qlora_08, ("lm",), 20,
              "LoRA on an NF4 base against a 16-bit base: memory and step time (2 runs of 9 steps)"),
    SuitePart("09_recipe", "profiler", parts.profiler_09, ("cnn",), 15,
              "one step under torch.profiler with CUDA activity, fp32 and 16 bits"),
    # the language-model arms, last: over a T4's budget (the module docstring)
    SuitePart("01_mixed_precision", "lm", parts.lm_01, ("lm_speed",), 15,
              "fp32 against fp16 + GradScaler (and bf16 where native) on the language model (2-3 runs)"),
    SuitePart("10_language_models", "attention", parts.attention_10, ("lm_speed",), 55,
              "eager attention against SDPA: activations and step time at 3 lengths (6 runs, fp32)"),
    SuitePart("10_language_models", "optimizers", parts.optimizers_10, ("lm_speed",), 20,
              "AdamW's step alone: for-loop, foreach and fused kernels (4 models built, 40 rounds)"),
    SuitePart("10_language_models", "ladder", parts.ladder_10, ("lm_speed",), 160,
              "the speed ladder: 16 bits, SDPA, packing, fused AdamW, compile, checkpointing + chunked loss (7 runs)"),
)
SUITES = {"gpu": GPU_SUITE}


class PartTimeout(BaseException):  # noqa: N818 - a BaseException, so that a lab's `except Exception` lets it through
    """A part ran past its time limit."""


class SuiteStopped(BaseException):  # noqa: N818
    """The process was asked to stop (SIGTERM, e.g. from ``timeout``)."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise `PartTimeout` after ``seconds`` (main thread on a POSIX system; elsewhere no limit)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise PartTimeout(f"stopped after {seconds:.0f} s, its time limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _stop_on_sigterm():
    """Turn SIGTERM into `SuiteStopped`, so that the summary is written before the process ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SuiteStopped("stopped by SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _row_errors(part: Part) -> list[str]:
    """The errors of a part's failed runs or rows (a run that failed inside a lab is a row with its error)."""
    found = [r.error for r in part.runs if getattr(r, "error", None)]
    if isinstance(part.rows, pd.DataFrame) and "error" in part.rows:
        found += [str(e) for e in part.rows["error"].dropna() if e]
    return found


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def select(suite: str, names: Iterable[str] | None = None) -> list[SuitePart]:
    """The parts of ``suite`` named in ``names`` (a part's label or a notebook's name; default: all), in order.

    Args:
        suite: a key of `SUITES`.
        names: e.g. ``["01_mixed_precision-compare", "08_lora"]``.
    """
    if suite not in SUITES:
        raise ConfigError("suite", suite, f"one of {list(SUITES)}")
    every = SUITES[suite]
    if names is None:
        return list(every)
    names = list(names)
    known = {p.label for p in every} | {p.notebook for p in every}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError("parts", unknown or names, f"part names from {[p.label for p in every]} or notebook names")
    return [p for p in every if p.label in names or p.notebook in names]


def check_budget(budget_s) -> float:
    """``budget_s`` as a float if it is a number of seconds > 0, else `ConfigError` naming it."""
    if not is_number(budget_s) or budget_s <= 0:
        raise ConfigError("budget_s", budget_s, f"a number of seconds > 0 (default {DEFAULT_BUDGET_S:.0f})")
    return float(budget_s)


@dataclasses.dataclass
class SuiteReport:
    """What a suite run did: one row per part (``part``, ``status``, ``seconds``, ``file``, ``reason``) and where."""

    rows: list[dict]
    summary_path: Path

    @property
    def paths(self) -> list[Path]:
        return [self.summary_path.parent / r["file"] for r in self.rows if r["file"]]

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if r["status"] in ("failed", "timed out", "interrupted")]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


SUMMARY_COLUMNS = ("part", "seconds", "status", "file", "reason")


def _row(part: SuitePart, status: str, seconds: float = 0.0, file=None, reason=None, row_errors=0,
         labels: dict | None = None) -> dict:
    labels = labels or {}
    fallbacks = [label["fallback"] for label in labels.values() if label["fallback"]]
    return {"part": part.label, "notebook": part.notebook, "seconds": round(seconds, 2), "status": status,
            "file": Path(file).name if file else None, "reason": reason, "row_errors": row_errors,
            "estimate_s": part.estimate_s, "measures": part.measures,
            "workload": " | ".join(label["workload"] for label in labels.values()) or None,
            "fallback": " | ".join(fallbacks) or None}


def workload_extras(labels: dict) -> dict:
    """What a part's file says it ran on: ``workload`` (key -> `describe`'s line) and ``fallback`` (key -> why it is
    a stand-in and what holds; None when none is).

    Args:
        labels: workload key -> `Workload.label`.

    Example:
        >>> workload_extras({"cnn": Workload(RunConfig()).label()})
        {'workload': {'cnn': 'small_cnn (pretrained) on shapes10 at its own size, batch 64'}, 'fallback': None}
    """
    fallbacks = {key: label["fallback"] for key, label in labels.items() if label["fallback"]}
    return {"workload": {key: label["workload"] for key, label in labels.items()}, "fallback": fallbacks or None}


@dataclasses.dataclass
class _Outcome:
    status: str
    path: Path | None = None
    reason: str | None = None
    failed_rows: int = 0
    trace: str | None = None
    labels: dict = dataclasses.field(default_factory=dict)  # workload key -> `Workload.label`


def _run_part(part: SuitePart, built: dict, out_dir, env: dict, limit_s: float) -> _Outcome:
    """Run one part under its time limit, its workloads' labels in its file."""
    labels = {}
    try:
        with _time_limit(limit_s):
            loads: list[Workload] = [built[key]() for key in part.workloads]
            labels = {key: load.label() for key, load in zip(part.workloads, loads, strict=True)}
            result = part.run(*(load.cfg for load in loads))
        if result.not_run:
            return _Outcome("not run", reason=result.not_run, labels=labels)
        errors = _row_errors(result)
        # outside the limit, so that a file is written whole; named as the suite names the part
        labelled = dataclasses.replace(result, name=part.name, extras={**result.extras, **workload_extras(labels)})
        path = write_part(labelled, part.notebook, out_dir, env)
        reason = f"{len(errors)} run(s) or row(s) failed, first: {errors[0]}" if errors else None
        return _Outcome("ok", path, reason, len(errors), labels=labels)
    except PartTimeout as exc:
        return _Outcome("timed out", reason=str(exc), trace=traceback.format_exc(limit=-8), labels=labels)
    except Exception as exc:  # noqa: BLE001 - one part's failure is recorded, the others go on
        return _Outcome("failed", reason=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=-8),
                        labels=labels)
    finally:
        _free_memory()


def print_now(line: str) -> None:
    """Print and flush: a log read through a pipe shows each part as it ends, even if the process is then killed."""
    print(line, flush=True)


def _write_summary(rows: list[dict], path: Path, env: dict, extras: dict) -> None:
    write_reference([], path, rows=pd.DataFrame(rows), env=env, extras={**extras, "env": provenance(env)})


def run_suite(suite: str = "gpu", out_dir: Path | None = None, profile_name: str = "full",
              names: Iterable[str] | None = None, budget_s: float = DEFAULT_BUDGET_S, cfg: RunConfig | None = None,
              echo: Callable[[str], None] = print_now) -> SuiteReport:
    """Run a suite's parts in order within ``budget_s``, writing each part's file and the summary as it goes.

    Args:
        suite: a key of `SUITES` (``"gpu"``).
        out_dir: where to write (default: ``src/labkit/assets/reference``).
        profile_name: the profile the runs use (the caller's ``LABKIT_PROFILE`` is restored afterwards).
        names: parts or notebooks to run (default: all; see `select`).
        budget_s: seconds for the whole suite; a part whose estimate would overrun it is skipped, with that reason.
        cfg: a CNN run instead of the profile's workloads (tests pass a tiny one).
        echo: where progress lines go.

    Example:
        >>> run_suite("gpu", out_dir=Path("out")).frame()
    """
    chosen, budget_s = select(suite, names), check_budget(budget_s)
    started, rows, errors = time.perf_counter(), [], {}
    with profile_env(profile_name), _stop_on_sigterm():
        prof = profile()
        env = env_report(cfg.device if cfg else "auto")
        summary_path = reference_path(out_dir, f"{suite}_suite", "summary", env)
        built = {key: _memoized(make) for key, make in suite_workloads(prof, cfg).items()}
        workload_labels = {}  # key -> `Workload.label`, of each workload a part has built
        extras = {"suite": suite, "budget_s": budget_s, "suite_steps": SUITE_STEPS, "errors": errors,
                  "workloads": workload_labels}
        echo(f"labkit bench --suite {suite}: {len(chosen)} parts at {prof.name} on {env.get('gpu') or 'the CPU'} "
             f"(capability {env.get('capability')}, torch {env.get('torch')}, CUDA {torch.version.cuda}), "
             f"budget {budget_s:.0f} s")
        try:
            for index, part in enumerate(chosen, 1):
                elapsed = time.perf_counter() - started
                head = f"[{index}/{len(chosen)}] {part.label}"
                if elapsed + part.estimate_s > budget_s:
                    reason = (f"over the budget: {elapsed:.0f} s spent, this part's estimate is {part.estimate_s:.0f} "
                              f"s and the budget {budget_s:.0f} s")
                    rows.append(_row(part, "skipped", reason=reason))
                    echo(f"{head}: skipped ({reason})")
                    continue
                limit_s = min(budget_s - elapsed, max(PART_LIMIT_FACTOR * part.estimate_s, MIN_PART_LIMIT_S))
                echo(f"{head}: {part.measures} (estimate {part.estimate_s:.0f} s on a T4, limit {limit_s:.0f} s)")
                rows.append(_row(part, "running"))
                _write_summary(rows, summary_path, env, extras)  # a process killed meanwhile leaves "running" here
                part_start = time.perf_counter()
                done = _run_part(part, built, out_dir, env, limit_s)
                rows[-1] = _row(part, done.status, time.perf_counter() - part_start, done.path, done.reason,
                                done.failed_rows, done.labels)
                workload_labels.update(done.labels)
                if done.trace:
                    errors[part.label] = done.trace
                _write_summary(rows, summary_path, env, extras)
                tail = (f" -> {done.path}" if done.path else "") + (f" ({done.reason})" if done.reason else "")
                echo(f"{head}: {done.status} in {rows[-1]['seconds']:.1f} s{tail}"
                     + (" [a stand-in workload: its file's fallback says which]" if rows[-1]["fallback"] else ""))
        except (KeyboardInterrupt, SuiteStopped) as exc:
            if rows and rows[-1]["status"] == "running":
                rows[-1].update(status="interrupted", reason=str(exc) or type(exc).__name__)
            rows += [_row(p, "not run", reason="the suite was interrupted before it") for p in chosen[len(rows):]]
            _write_summary(rows, summary_path, env, extras)
            echo(_summary_text(rows, started, summary_path, workload_labels))
            if isinstance(exc, SuiteStopped):
                raise SystemExit(128 + signal.SIGTERM) from exc  # the exit status a shell gives a SIGTERM
            raise
        _write_summary(rows, summary_path, env, extras)
    echo(_summary_text(rows, started, summary_path, workload_labels))
    return SuiteReport(rows, summary_path)


def _memoized(make: Callable[[], Workload]) -> Callable[[], Workload]:
    """``make`` called once; a failure is raised again, to every part that asks."""
    done: list = []

    def get() -> Workload:
        if not done:
            try:
                done.append((make(), None))
            except Exception as exc:  # noqa: BLE001 - raised again below, to each part that needs it
                done.append((None, exc))
        value, error = done[0]
        if error is not None:
            raise error
        return value

    return get


def _summary_text(rows: list[dict], started: float, summary_path: Path, labels: dict) -> str:
    """The table printed at the end: part, seconds, status, file (its name), and why where it did not run; then each
    stand-in workload (``labels``: key -> `Workload.label`) and what of its numbers holds."""
    stand_ins = [label["fallback"] for label in labels.values() if label["fallback"]]
    frame = pd.DataFrame(rows, columns=list(_row(GPU_SUITE[0], "").keys()))[list(SUMMARY_COLUMNS)]
    frame["file"] = frame["file"].map(lambda f: Path(f).name if isinstance(f, str) else "-")
    frame["reason"] = frame["reason"].map(lambda r: (r[:77] + "...") if isinstance(r, str) and len(r) > 80 else r)
    counts = collections.Counter(frame.status)  # in the order the statuses first occur
    return (f"\n{text_table(frame.fillna('-'))}\n{len(rows)} parts in {time.perf_counter() - started:.0f} s: "
            f"{', '.join(f'{n} {s}' for s, n in counts.items())}. Summary: {summary_path}"
            + "".join(f"\nSTAND-IN: {line}" for line in stand_ins))

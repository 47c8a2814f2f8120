"""Command line: `labkit env | run | sweep | doctor | pretrain | bench | solutions`, and a learner's own fine-tune:
`labkit audit | plan | measure | ladder | recommend MODEL --data SPEC --gpu t4`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .bench import DEFAULT_BUDGET_S, SUITES, run_bench, run_suite
from .config import ALIASES
from .configfile import load_config, parse_yaml
from .display import MAX_TABLE_COLUMNS, text_record, text_table
from .env import env_report
from .errors import ConfigError, LabkitError
from .finetune import Finetune
from .labs.catalog import all_exercises
from .messages import wrap
from .pretrain import pretrain
from .results import cached_fit, sweep, to_frame
from .troubleshoot import doctor


def _parse_set(items: list[str]) -> dict:
    """``["batch_size=32,64", "precision=fp32"]`` -> ``{"batch_size": [32, 64], "precision": ["fp32"]}``."""
    axes = {}
    for item in items:
        if "=" not in item:
            raise ConfigError("--set", item, "FIELD=V1,V2,... (e.g. batch_size=32,64)")
        name, values = (part.strip() for part in item.split("=", 1))
        if name in axes:
            raise ConfigError("--set", item, f"each field once (put every value of {name} in one --set)")
        axes[name] = [parse_yaml(v, f"--set {name}") for v in values.split(",") if v.strip()]
    return axes


def _cmd_env(args) -> int:
    print(env_report())
    return 0


# What `labkit run` and `labkit sweep` show, in display units; the JSON line (and --csv) has every field.
RUN_COLUMNS = ("model", "dataset", "precision_used", "batch_size", "steps", "step_time_s", "throughput",
               "tokens_per_s", "real_tokens_per_s", "pad_fraction", "peak_memory_bytes", "accuracy", "test_loss",
               "perplexity", "model_size_bytes", "achieved_flops", "mfu", "error")
SWEEP_METRICS = ("step_time_s", "throughput", "peak_memory_bytes", "accuracy")
LM_SWEEP_METRICS = ("step_time_s", "tokens_per_s", "peak_memory_bytes", "test_loss")  # language models


def _cmd_run(args) -> int:
    cfg = load_config(args.config)
    result = cached_fit(cfg, refresh=args.refresh)
    print(text_record(to_frame([result]).iloc[0].to_dict(), RUN_COLUMNS))
    print(json.dumps(result.to_dict(), indent=1 if args.pretty else None))
    return 0


def _cmd_sweep(args) -> int:
    cfg = load_config(args.config)
    axes = _parse_set(args.set or [])
    frame = sweep(cfg, refresh=args.refresh, **axes)
    failed = "error" in frame and frame["error"].notna().any()
    language = "tokens_per_s" in frame and frame["tokens_per_s"].notna().any()
    metrics = LM_SWEEP_METRICS if language else SWEEP_METRICS
    columns = [*(ALIASES.get(axis, axis) for axis in axes), *metrics, *(["error"] if failed else [])]
    print(text_table(frame, columns[:MAX_TABLE_COLUMNS]))  # at most 7 axes and metrics: --csv has them all
    if args.csv:
        frame.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0


def _cmd_doctor(args) -> int:
    """Print the diagnosis; exit 1 when a problem was found (a script can stop on it), else 0."""
    diagnosis = doctor(args.config, nproc=args.nproc, backend=args.backend, timeout_s=args.timeout_s,
                       fail_rank=args.fail_rank, fail_step=args.fail_step, fail_how=args.fail_how)
    print(diagnosis)
    return 1 if diagnosis.problems else 0


def _cmd_pretrain(args) -> int:
    for name in args.models:
        info = pretrain(name, steps=args.steps)
        print(json.dumps(info))
    return 0


def _cmd_bench(args) -> int:
    """The notebooks' experiments, or a suite with ``--suite`` (exit 1 when one of its parts failed or timed out)."""
    out = Path(args.out) if args.out else None
    if args.suite:
        report = run_suite(args.suite, out_dir=out, profile_name=args.profile, names=args.experiments or None,
                           budget_s=DEFAULT_BUDGET_S if args.budget_s is None else args.budget_s)
        return 1 if report.failed else 0
    if args.budget_s is not None:
        raise ConfigError("--budget-s", args.budget_s, f"only with --suite ({', '.join(SUITES)})")
    for path in run_bench(out_dir=out, profile_name=args.profile, experiments=args.experiments or None):
        print(f"wrote {path}")
    return 0


def _cmd_solutions(args) -> int:
    every = all_exercises()
    wanted = args.names or every.names()
    for name in wanted:
        exercise = every.get(name)
        example = " (with example numbers: the notebook uses yours)" if getattr(exercise, "from_run", ()) else ""
        print(f"## {name}{example}\n{wrap(exercise.question)}\n\nSolution:\n{every.solution(name)}\n")
    return 0


FINETUNE_STEPS = ("audit", "plan", "measure", "ladder", "recommend")


def _cmd_finetune(args) -> int:
    """One step of `labkit.Finetune` on MODEL and --data: its table in human units (or --json), then its finding."""
    mine = Finetune(args.model, data=args.data, gpu=args.gpu, seq_len=args.seq_len, batch_size=args.batch_size,
                    loss_on=args.loss_on)
    if args.command == "plan":
        result = mine.plan(methods=("full", "lora", "qlora") if args.method == "auto" else (args.method,))
    elif args.command == "measure" and mine.target.gpus > 1:  # the plan's per-GPU rows, on as many processes
        result = mine.measure_ranks(methods=("full", "lora") if args.method == "auto" else (args.method,))
    elif args.command == "measure":
        result = mine.measure(methods=("full", "lora", "qlora") if args.method == "auto" else (args.method,))
    else:
        result = getattr(mine, args.command)()
    if args.command == "recommend" and args.export:
        print(result.yaml() if args.export == "yaml" else json.dumps(
            {"SFTConfig": result.sft, "LoraConfig": result.lora, "BitsAndBytesConfig": result.bnb}, indent=1))
        return 0
    if args.json:
        print(json.dumps({"finding": str(result.finding()), "rows": json.loads(result.frame.to_json(
            orient="records"))}, indent=1))
    else:
        print(result.text())
    return 1 if args.command == "audit" and result.faults else 0


def _finetune_parser(sub, name: str, text: str) -> None:
    cmd = sub.add_parser(name, help=text)
    cmd.add_argument("model", help="a hub id (Qwen/Qwen2.5-0.5B) or a folder holding config.json")
    cmd.add_argument("--data", required=True, help="a .jsonl/.json/.csv/.parquet file or hf:ORG/NAME")
    cmd.add_argument("--gpu", help="t4, kaggle-2xt4, this or a size such as 24GiB (default: this GPU, else t4)")
    cmd.add_argument("--method", default="auto", choices=["full", "lora", "qlora", "auto"])
    cmd.add_argument("--seq-len", type=int, help="the most tokens an example keeps (default 1024)")
    cmd.add_argument("--batch-size", type=int, default=8, help="rows per optimizer step (default 8)")
    cmd.add_argument("--loss-on", choices=["completion", "assistant", "all"], help="default: the data's shape's")
    cmd.add_argument("--json", action="store_true", help="the rows and finding as JSON, for scripts")
    if name == "recommend":
        cmd.add_argument("--export", choices=["yaml", "trl"], help="print labkit's YAML or TRL/PEFT arguments only")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="describe this machine (device, GPU, bf16, profile, versions)")
    run = sub.add_parser("run", help="run one config (YAML) and print its result as a table and JSON")
    run.add_argument("config")
    run.add_argument("--refresh", action="store_true", help="ignore the cached result")
    run.add_argument("--pretty", action="store_true", help="indent the JSON")
    sw = sub.add_parser("sweep", help="run a config over axes: --set batch_size=32,64 --set precision=fp32,bf16")
    sw.add_argument("config")
    sw.add_argument("--set", action="append", metavar="FIELD=V1,V2")
    sw.add_argument("--refresh", action="store_true")
    sw.add_argument("--csv", help="also write the table to this CSV file")
    doc = sub.add_parser("doctor", help="probe a config (YAML) for NaN loss, slow AMP, quantization and pruning "
                         "that do not pay, a distributed job that hangs; exit 1 if a problem is found")
    doc.add_argument("config")
    doc.add_argument("--nproc", type=int, help="also run it data parallel over N processes (the hang probe)")
    doc.add_argument("--backend", choices=["gloo", "nccl"], help="the distributed backend (default: the device's)")
    doc.add_argument("--timeout-s", type=float, help="the process-group timeout (at most the probe's 10 s)")
    doc.add_argument("--fail-rank", type=int, help="make this rank fail on purpose (a demonstration)")
    doc.add_argument("--fail-step", type=int, help="... after this optimizer step")
    doc.add_argument("--fail-how", default="raise", choices=["raise", "exit", "hang"])
    pre = sub.add_parser("pretrain", help="train labkit's offline checkpoints on their source tasks "
                         "(shapes_source; digits_source for tiny_llama)")
    pre.add_argument("models", nargs="*", default=["small_cnn", "shufflenet_v2_x0_5"])
    pre.add_argument("--steps", type=int, default=None, help="optimizer steps (default: each model's recipe)")
    bench = sub.add_parser("bench", help="the notebooks' experiments at the full profile -> reference JSON files")
    bench.add_argument("--out", help="folder for the JSON files (default: src/labkit/assets/reference)")
    bench.add_argument("--profile", default="full", choices=["ci", "quick", "full"], help="default: full")
    bench.add_argument("--suite", help=f"run a suite instead: {', '.join(SUITES)} (every GPU-only measurement of "
                       "01-09, each part's file written as it finishes, failures recorded, the rest run)")
    bench.add_argument("--budget-s", type=float, help=f"the suite's time budget in seconds (default "
                       f"{DEFAULT_BUDGET_S:.0f}); parts that would overrun it are skipped, with the reason")
    bench.add_argument("experiments", nargs="*", help="notebook names, e.g. 01_mixed_precision (default: all); with "
                       "--suite, part or notebook names, e.g. 01_mixed_precision-compare 08_lora")
    sol = sub.add_parser("solutions", help="the notebooks' exercises with their worked solutions (for instructors)")
    sol.add_argument("names", nargs="*", help="exercise names, e.g. 01.amp_step (default: all)")
    _finetune_parser(sub, "audit", "your data through your tokenizer: lengths, truncation, what is trained, EOS, "
                     "template, packing leak (exit 1 on a fault)")
    _finetune_parser(sub, "plan", "predicted memory of full / LoRA / QLoRA at your lengths against a GPU, no weights")
    _finetune_parser(sub, "measure", "a few steps here, longest batch first: measured peak beside predicted")
    _finetune_parser(sub, "ladder", "each technique on your model and data, rung by rung, counted outside the noise")
    _finetune_parser(sub, "recommend", "the run the plan supports, as labkit YAML or TRL / PEFT arguments")
    return parser


COMMANDS = {"env": _cmd_env, "run": _cmd_run, "sweep": _cmd_sweep, "doctor": _cmd_doctor, "pretrain": _cmd_pretrain,
            "bench": _cmd_bench, "solutions": _cmd_solutions, **dict.fromkeys(FINETUNE_STEPS, _cmd_finetune)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (LabkitError, FileNotFoundError) as exc:
        print(f"labkit {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

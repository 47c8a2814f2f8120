"""The ledger behind scripts/estimate_full.py: what a notebook runs at `full`, recorded while it runs on this CPU.

`install` (in the notebook's kernel, first) wraps the engine's few places where work happens and appends one JSON line
per event to ``$LABKIT_LEDGER``:

- ``train``: a `labkit.train.Trainer` run: its config, the steps it plans at `full` and the rows and width of a step;
  the run itself is cut to its two profiling steps and one timed step (the models are the shrunk ones of
  ``LABKIT_SHRINK=plan``: `labkit.env.FULL_PLAN`), so that the notebook goes on as it would;
- ``steps``: `Trainer.step` called outside a run (timing demos, traces): one event per step (a few run here);
- ``eval``: a test-split evaluation: the split's size (scored on its first batches only here);
- ``forward``: `labkit.inference.latencies`: the models' names, the batch and the number of calls, and whether the
  models are the CPU kind (torch.ao's int8 runs on a CPU only);
- ``launch``: a distributed job: its config, processes and planned steps (run here cut the same way).

`estimate` turns a ledger into T4 minutes: FLOPs of the real models (`labkit.models`' shapes, counted by PyTorch's
FLOP counter on the meta device) at a stated share of the T4's datasheet peak, a fixed cost per run, and the CPU
forwards at this CPU's measured matmul rate. Its method is `METHOD`, which the notebooks' headers quote.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from pathlib import Path

LEDGER_ENV = "LABKIT_LEDGER"
EVAL_ROWS = 64  # a test split is scored on this many rows here; the ledger records its real size
STEPS_HERE = 3  # Trainer.step outside a run (timing demos): the steps that run here; the ledger counts every one
# The share of the T4's datasheet peak (8.1 TFLOP/s fp32, 65 fp16 with tensor cores) a training step reaches, and
# what a run costs besides its steps: building the model, cuDNN's autotuning, the FLOP-counting and memory-tracking
# steps, moving the splits to the GPU.
T4_PEAK = {"fp32": 8.1e12, "fp16": 65e12}
T4_SHARE = {"fp32": 0.5, "fp16": 0.25}
RUN_OVERHEAD_S = 5.0
# A step is never faster than its kernels can be launched: in eager PyTorch each aten op costs the host about
# 10 us (dispatch and launch), and the GPU waits when its kernels are shorter (small batches, small models).
OP_S = 10e-6
LAUNCH_OVERHEAD_S = 20.0  # torchrun, the imports and NCCL's rendezvous
METHOD = ("FLOPs of every step at full's shapes (scripts/estimate_full.py) at {fp32:.0%} of a T4's fp32 peak and "
          "{fp16:.0%} of its fp16 peak, a step never under {op_us:g} us an op, {run:g} s a run, and CPU forwards at "
          "this CPU's matmul rate")


def _append(event: dict) -> None:
    with open(os.environ[LEDGER_ENV], "a") as handle:
        handle.write(json.dumps(event, default=str) + "\n")


def _subset(split, rows: int):
    """The first ``rows`` examples of an image or token split (the same type)."""
    import dataclasses

    if hasattr(split, "images"):
        return dataclasses.replace(split, images=split.images[:rows], labels=split.labels[:rows])
    return dataclasses.replace(split, input_ids=split.input_ids[:rows], labels=split.labels[:rows])


def _width(trainer) -> int | None:
    """A language model's tokens per row at `full`: the dataset's ``seq_len``, or the longest example."""
    split = trainer.train_split
    if not hasattr(split, "input_ids"):
        return None
    return int(trainer.cfg.seq_len or max(len(ids) for ids in split.input_ids))


def install() -> None:
    """Wrap the engine's training, evaluation, latency and launch entry points (see the module docstring)."""
    from labkit import evaluation, inference, launcher, train

    run, step, total_steps = train.Trainer.run, train.Trainer.step, train.total_steps
    in_run = {"depth": 0}

    @functools.wraps(run)
    def recorded_run(self, *args, **kwargs):
        planned = total_steps(self.cfg, len(self.loader))
        _append({"kind": "train", "config": self.cfg.to_dict(), "steps": planned, "width": _width(self),
                 "language": self.kind.name == "language", "world_size": getattr(self, "world_size", 1)})
        # here: no warm-up, the two profiling steps and one timed step
        self.profile = dataclasses.replace(self.profile, warmup_steps=0)
        train.total_steps = lambda cfg, batches: min(total_steps(cfg, batches), train.PROFILING_STEPS + 1)
        in_run["depth"] += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            in_run["depth"] -= 1
            train.total_steps = total_steps

    @functools.wraps(step)
    def recorded_step(self, *args, **kwargs):
        if in_run["depth"]:
            return step(self, *args, **kwargs)
        batch = getattr(args[0], "input_ids", args[0]) if args else None
        shape = tuple(getattr(batch, "shape", ()))
        _append({"kind": "steps", "config": self.cfg.to_dict(), "count": 1, "width": _width(self),
                 "language": self.kind.name == "language", "rows": shape[0] if shape else None})
        # a timing demo's hundreds of steps: a few of each input shape run here, the rest repeat the last loss; a
        # new shape (the batch-size search's probes) always runs, for the memory it measures
        if not hasattr(self, "_ledger_steps"):
            self._ledger_steps = {}
        taken = self._ledger_steps.setdefault(shape, [])
        if len(taken) < STEPS_HERE:
            taken.append(step(self, *args, **kwargs))
        return taken[-1]

    def recorded_eval(evaluate):
        @functools.wraps(evaluate)
        def wrapped(model, split, *args, **kwargs):
            cfg = next((a for a in args if hasattr(a, "image_size")), None)  # evaluate's RunConfig
            _append({"kind": "eval", "model": _model_name(model), "rows": len(split),
                     "width": getattr(split, "seq_len", None), "image_size": getattr(cfg, "image_size", None)})
            return evaluate(model, _subset(split, EVAL_ROWS), *args, **kwargs)
        return wrapped

    latencies = inference.latencies

    @functools.wraps(latencies)
    def recorded_latencies(models, x, prof=None, cpu=False):
        names = [_model_name(m) for m in models]
        quantized = [any("quantized" in type(m).__module__ for m in model.modules()) for model in models]
        calls = 2 * max(2, (prof or train.profile()).repeats // inference.LATENCY_ROUNDS) + 2
        _append({"kind": "forward", "models": names, "shape": list(x.shape), "calls": calls,
                 "cpu": [cpu or q for q in quantized]})
        return latencies(models, x, prof, cpu)

    launch = launcher.launch

    @functools.wraps(launch)
    def recorded_launch(cfg, nproc=2, *args, **kwargs):
        _append({"kind": "launch", "config": cfg.to_dict(), "nproc": nproc, "steps": launcher.planned_steps(cfg)})
        return launch(cfg, nproc, *args, **kwargs)

    train.Trainer.run, train.Trainer.step = recorded_run, recorded_step
    # imported by name by the kinds (`labkit.kinds`) and the labs (pruning's sensitivity scans, ...): every copy
    _replace(evaluation.evaluate, recorded_eval(evaluation.evaluate))
    _replace(evaluation.evaluate_tokens, recorded_eval(evaluation.evaluate_tokens))
    _replace(evaluation.score_tokens, recorded_eval(evaluation.score_tokens))
    _replace(latencies, recorded_latencies)
    _replace(launch, recorded_launch)


def _replace(original, wrapped) -> None:
    """Put ``wrapped`` in place of ``original`` in every labkit module, where it was defined and where it was imported
    by name (``from ..launcher import launch``): every module is imported first, as a notebook would import it later."""
    import importlib
    import pkgutil
    import sys

    import labkit

    for info in pkgutil.walk_packages(labkit.__path__, "labkit."):
        if not info.name.endswith(("__main__", ".worker", ".cli")):
            importlib.import_module(info.name)
    for name, module in list(sys.modules.items()):
        if name == "labkit" or name.startswith("labkit."):
            for attribute, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attribute, wrapped)


def _model_name(model) -> str | None:
    for module in model.modules():
        name = getattr(module, "labkit_name", None)
        if name:
            return name
    return None


# --- the estimate -------------------------------------------------------------------------------------------------


def _forward(model: str, width: int | None, image_size: int | None):
    """A forward pass of one example of ``model`` at `full`'s real shape, built on the meta device (call it there)."""
    import torch

    from labkit import models

    if model in models.HUB_MODELS or model in models.LANGUAGE_MODELS:
        net = (models.build_hub_model(model, pretrained=False)[0] if model in models.HUB_MODELS
               else models.build_language_model(model, 2048, pretrained=False)[0])
        x = torch.zeros(1, width or 64, dtype=torch.long)
        return lambda: net(input_ids=x)
    net = models.build(model, 10, pretrained=False)[0]
    size = image_size or 32
    x = torch.zeros(1, 3, size, size)
    return lambda: net(x)


@functools.lru_cache(maxsize=64)
def forward_flops(model: str, width: int | None, image_size: int | None) -> float:
    """FLOPs of one forward pass of one example of ``model`` at `full`'s real shape (the meta device: no compute)."""
    import torch

    from labkit import measure

    with torch.device("meta"):
        return float(measure.count_flops(_forward(model, width, image_size)))


@functools.lru_cache(maxsize=64)
def forward_ops(model: str, width: int | None, image_size: int | None) -> int:
    """The aten ops one forward pass of ``model`` dispatches (each a kernel launch or more on a GPU)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    with torch.device("meta"):
        forward = _forward(model, width, image_size)
        with Count():
            forward()
    return Count.ops


def _precision_on_t4(config: dict) -> str:
    """The rate a run's precision gets on a T4: ``auto`` and fp16 use its tensor cores; bf16 is emulated there,
    except in QLoRA's runs, whose precision follows the device (`qlora_dtypes`: bf16 on this CPU, fp16 on a T4)."""
    from labkit.labs.lora import QLORA_MODELS

    if config.get("precision") == "bf16" and config.get("model") == QLORA_MODELS["full"][0]:
        return "fp16"
    return "fp16" if config.get("precision") in ("auto", "fp16") else "fp32"


def _step_factor(config: dict) -> float:
    """A training step's FLOPs in forward passes: 3 (forward, and backward for inputs and weights); 2 where the
    weights take no gradient (LoRA, QLoRA, frozen stages: an upper bound for them); one more with checkpointing."""
    frozen = config.get("lora_rank") or config.get("freeze") not in (None, "none")
    return (2.0 if frozen else 3.0) + (1.0 if config.get("checkpointing") else 0.0)


def _gpu_seconds(flops: float, precision: str) -> float:
    return flops / (T4_PEAK[precision] * T4_SHARE[precision])


def _step_seconds(flops: float, ops: float, precision: str) -> float:
    """A step of ``flops`` and ``ops`` aten ops on a T4: its FLOPs at the stated share, or its launches if longer."""
    return max(_gpu_seconds(flops, precision), ops * OP_S)


def cpu_rate() -> float:
    """This CPU's float32 matmul rate in FLOP/s (2 threads, a 1024 x 1024 product, the best of five)."""
    import torch

    a = torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best


# A distributed job at `full` on Kaggle's two T4s runs the profile's workload (labkit.labs.distributed.workload); on
# this CPU the plan run took the small one (no SyncBatchNorm over gloo): a GPU job is counted with these fields.
GPU_JOB_WORKLOAD = {"model": "resnet18", "image_size": 128, "batch_size": 128}


def estimate(ledger: Path, cpu_flops_per_s: float) -> dict:
    """T4 seconds of a ledger by kind: ``train``, ``eval``, ``forward`` (GPU and CPU), ``launch``, and ``total``.

    A job on CPU processes (``device="cpu"``: 07's mechanism, the doctor's probes) is counted at this CPU's rate;
    any other job as Kaggle's two T4s run it (`GPU_JOB_WORKLOAD`).
    """
    seconds = {"train": 0.0, "eval": 0.0, "forward_gpu": 0.0, "forward_cpu": 0.0, "launch": 0.0, "runs": 0}
    for line in ledger.read_text().splitlines():
        event = json.loads(line)
        kind = event["kind"]
        if kind in ("train", "steps", "launch"):
            cfg = event["config"]
            on_cpu = kind == "launch" and cfg.get("device") == "cpu"
            if kind == "launch" and not on_cpu:
                cfg = {**cfg, **GPU_JOB_WORKLOAD}
            shape = (cfg["model"], event.get("width") or cfg.get("seq_len"), cfg.get("image_size"))
            count = event.get("steps", event.get("count", 1))
            flops = forward_flops(*shape) * (event.get("rows") or cfg["batch_size"]) * _step_factor(cfg)  # a step's
            ops = forward_ops(*shape) * _step_factor(cfg)
            if on_cpu:  # each process holds batch / nproc rows, on a core of its own
                seconds["launch"] += count * flops / event["nproc"] / (0.5 * cpu_flops_per_s / 2) + LAUNCH_OVERHEAD_S
            elif kind == "launch":  # each of nproc GPUs holds batch / nproc rows
                step = _step_seconds(flops / event["nproc"], ops, _precision_on_t4(cfg))
                seconds["launch"] += count * step + LAUNCH_OVERHEAD_S
            else:
                seconds["train"] += count * _step_seconds(flops, ops, _precision_on_t4(cfg))
                seconds["runs"] += kind == "train"
        elif kind == "eval" and event["model"]:
            flops = forward_flops(event["model"], event.get("width"), event.get("image_size")) * event["rows"]
            seconds["eval"] += _gpu_seconds(flops, "fp32")
        elif kind == "forward":
            rows, rest = event["shape"][0], event["shape"][1:]
            for name, on_cpu in zip(event["models"], event["cpu"], strict=True):
                if not name:
                    continue
                width = rest[0] if len(rest) == 1 else None
                size = rest[-1] if len(rest) == 3 else None
                flops = forward_flops(name, width, size) * rows * event["calls"]
                if on_cpu:
                    seconds["forward_cpu"] += flops / (0.5 * cpu_flops_per_s)
                else:
                    seconds["forward_gpu"] += _gpu_seconds(flops, "fp32")
    seconds["total"] = (seconds["train"] + seconds["eval"] + seconds["forward_gpu"] + seconds["forward_cpu"]
                        + seconds["launch"] + RUN_OVERHEAD_S * seconds["runs"])
    return seconds

"""Notebook 06, sections 2 and 3: every method of `labkit.techniques.quantization.METHODS` and QAT on both models
(fp32 timed twice: the gap between its two timings is the run's timing noise), the two static int8 flows, and
fp16 stacked with int8 dynamic; section 6: the panel's run."""

from __future__ import annotations

import collections
import copy
import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
from torch import nn

from ... import display, measure, results, train
from ...config import RunConfig
from ...env import cpu_fp16_native, cuda_usable, profile
from ...errors import ConfigError, UnsupportedError
from ...inference import LATENCY_ROUNDS, accuracy, example_batch, latencies, model_device
from ...labresult import LabResult
from ...messages import worded, wrap
from ...techniques import quantization
from ...techniques.quantization import METHODS
from ...validate import is_int
from .workload import (
    CALIBRATION_BATCHES,
    EVAL_IMAGES,
    QAT,
    VIT,
    accuracies,
    calibration_batches,
    eval_accuracy,
    extra_steps,
    fine_tuned,
    linear_share,
    points,
    qat_model,
    speedup,
    timing_noise,
    workloads,
)

# int8_pt2e is int8_static by another flow, compared in `flows`: eagerly its graph computes in float.
TABLE_METHODS = (*(m for m in METHODS if m != "int8_pt2e"), QAT)
QAT_API = "torch.ao FX (deprecated)"
CPU_BATCH_BESIDE_GPU = 8  # CPU latency batch when the models live on a GPU (the profile's large workload)
FLOWS = {"int8_static": "FX graph mode (torch.ao, deprecated)", "int8_pt2e": "PT2E (torchao)"}
STACKED = "fp16 then int8 dynamic"


@dataclass
class MethodsTable(LabResult):
    """`METHODS` and QAT, one row each; the table shows what a learner reads (the GPU's column where there is one),
    the frame also which touch Linear layers only."""

    shown = ("method", "what it does", "library", "weight bits", "calibration", "runs on this CPU", "runs on this GPU")


def methods_table() -> MethodsTable:
    """`METHODS` and QAT as a table, with whether each runs on this CPU (and on this GPU if there is one)."""
    gpu = cuda_usable()
    rows = [{"method": m.name, "what it does": m.description, "library": m.api, "weight bits": m.weight_bits,
             "calibration": m.calibration, "Linear only": m.linear_only,
             "runs on this CPU": quantization.supported(m.name, "cpu") is None,
             **({"runs on this GPU": quantization.supported(m.name, "cuda") is None} if gpu else {})}
            for m in METHODS.values()]
    rows.append({"method": QAT, "what it does": "fine-tuned with int8 rounding, then int8", "library": QAT_API,
                 "weight bits": 8, "calibration": False, "Linear only": False, "runs on this CPU": True,
                 **({"runs on this GPU": False} if gpu else {})})
    return MethodsTable(pd.DataFrame(rows))


@dataclass
class Built:
    model: nn.Module | None
    seconds: float = 0.0
    reason: str | None = None


def build(model: nn.Module, method: str, cfg: RunConfig, calibration) -> Built:
    """``model`` quantized by ``method`` on its device, timed; or why it cannot run there."""
    device = model_device(model)
    if method == QAT:
        if device.type == "cuda":
            return Built(None, reason="QAT converts to torch.ao's int8 CPU kernels")
        int8, run, convert_s = qat_model(cfg)
        return Built(int8, run.train_time_s + convert_s)
    spec = METHODS[method]
    reason = quantization.supported(method, device)
    if reason is None and device.type not in spec.devices:
        reason = f"{method} runs on {' and '.join(spec.devices)} only"
    if reason:
        return Built(None, reason=reason)
    start = time.perf_counter()
    try:
        built = quantization.quantize(model, method, calibration if spec.calibration else None)
        measure.synchronize(model_device(built))  # a GPU may still be packing weights: wait before reading the clock
        seconds = time.perf_counter() - start
        with torch.no_grad():  # a kernel this GPU lacks fails only when it runs: find out here, not in a timing loop
            built(example_batch(cfg, 2, device=model_device(built)))
    except UnsupportedError as exc:
        return Built(None, reason=exc.reason)
    except (RuntimeError, NotImplementedError) as exc:  # the table says so instead of stopping
        return Built(None, reason=f"failed here: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return Built(built, seconds)


def _timed(built: dict, reference: nn.Module, x: torch.Tensor, prof=None) -> tuple[dict, float]:
    """Latency of each built model, in turns, and the timing noise of the reference timed twice."""
    ran = [m for m in built if built[m].model is not None]
    if not ran:
        return {}, math.nan
    times = latencies([built[m].model for m in ran] + [reference], x, prof)
    first = times[ran.index("fp32")] if "fp32" in ran else math.nan
    return dict(zip(ran, times, strict=False)), timing_noise(first, times[-1])


def not_run_reason(cpu: Built, gpu: Built | None) -> str | None:
    """Why a method did not run: the CPU's reason without a GPU; with one, each failed device's, named."""
    if gpu is None:
        return cpu.reason if cpu.model is None else None
    failed = [(where, built.reason.split(";")[0]) for where, built in (("CPU", cpu), ("GPU", gpu))
              if built.model is None and built.reason]
    return "; ".join(f"{where}: {reason}" for where, reason in failed) or None


def _model_rows(name: str, cfg: RunConfig, methods: tuple, num_calibration: int, progress: bool,
                cpu_batch: int | None, eval_images: int | None) -> list[dict]:
    model = fine_tuned(cfg, progress=progress)[0].eval()
    cpu_model = copy.deepcopy(model).cpu()
    calibration = calibration_batches(cfg, num_calibration)
    cpu = {m: build(cpu_model, m, cfg, calibration) for m in methods}
    on_gpu = model_device(model).type == "cuda"
    gpu = {m: build(model, m, cfg, calibration) for m in methods if m != QAT} if on_gpu else {}
    # Beside a GPU the CPU is a cloud VM's few cores and the model the profile's large one: a smaller batch.
    batch, cpu_prof = cpu_batch or profile().latency_batch, None
    if gpu:
        batch = cpu_batch or CPU_BATCH_BESIDE_GPU
        cpu_prof = dataclasses.replace(profile(), repeats=2 * LATENCY_ROUNDS, warmup_steps=1)
    test_images = min(len(train.run_splits(cfg, training=False)["test"]), eval_images or EVAL_IMAGES)
    cpu_times, cpu_noise = _timed(cpu, cpu_model, example_batch(cfg, batch, torch.device("cpu")), cpu_prof)
    gpu_times, gpu_noise = _timed(gpu, model, example_batch(cfg, profile().latency_batch)) if gpu else ({}, math.nan)
    rows = []
    for m in methods:
        done = gpu[m] if m in gpu and gpu[m].model is not None else cpu[m]
        row = {"model": name, "method": m, "api": METHODS[m].api if m in METHODS else QAT_API,
               "ran": done.model is not None, "reason": not_run_reason(cpu[m], gpu.get(m)),
               "threads": torch.get_num_threads(), "cpu_batch": batch,
               "cpu_latency_s": cpu_times.get(m, math.nan), "cpu_noise": cpu_noise,
               "gpu_latency_s": gpu_times.get(m, math.nan), "gpu_noise": gpu_noise, "quantize_s": done.seconds,
               "linear_share": linear_share(cpu_model), "test_images": test_images}
        if done.model is not None:
            row.update(model_size_bytes=measure.model_size_bytes(done.model),
                       test_accuracy=eval_accuracy(done.model, cfg, test_images))
        rows.append(row)
    return rows


def method_comparison(cfgs: dict[str, RunConfig] | None = None, methods=TABLE_METHODS,
                      num_calibration: int = CALIBRATION_BATCHES, progress: bool = True, refresh: bool = False,
                      cpu_batch: int | None = None, eval_images: int | None = None) -> MethodComparison:
    """Every method (fp32 added) on every model of ``cfgs`` (default `workloads`): one row per (model, method),
    measured once, then cached; ``cpu_batch``/``eval_images`` override the latency batch and the test images."""
    cfgs = workloads() if cfgs is None else cfgs
    unknown = [m for m in methods if m not in TABLE_METHODS]
    if unknown:
        raise ConfigError("methods", unknown, f"names from {list(TABLE_METHODS)}")
    if not cfgs:
        raise ConfigError("cfgs", cfgs, "a non-empty dict of model name -> RunConfig (e.g. workloads())")
    methods = ("fp32", *(m for m in methods if m != "fp32"))  # the reference every ratio is taken against

    table = results.cached_frame("quant-compare", cfgs.values(),
                                 lambda: pd.DataFrame([row for name, cfg in cfgs.items() for row in _model_rows(
                                     name, cfg, methods, num_calibration, progress, cpu_batch, eval_images)]),
                                 refresh=refresh, models=list(cfgs), methods=methods, num_calibration=num_calibration,
                                 **({"cpu_batch": cpu_batch} if cpu_batch else {}),
                                 **({"eval_images": eval_images} if eval_images else {}))
    for column in ("model_size_bytes", "test_accuracy", "cpu_latency_s", "gpu_latency_s", "cpu_noise", "gpu_noise"):
        table[column] = pd.to_numeric(table[column]) if column in table else math.nan  # a cached None is NaN
    fp32 = table[table.method == "fp32"].set_index("model")
    table["size_vs_fp32"] = table.model_size_bytes / table.model.map(fp32.model_size_bytes)
    table["cpu_speedup"] = table.model.map(fp32.cpu_latency_s) / table.cpu_latency_s
    table["gpu_speedup"] = table.model.map(fp32.gpu_latency_s) / table.gpu_latency_s
    table["accuracy_drop"] = table.model.map(fp32.test_accuracy) - table.test_accuracy
    # the first clause of the reason; with a GPU, of each device's ("CPU: ...; GPU: ...")
    table["not run because"] = table.reason.map(lambda r: (r if r.startswith(("CPU: ", "GPU: "))
                                                           else r.split(";")[0]) if isinstance(r, str) else None)
    return MethodComparison(table)


@dataclass
class MethodComparison(LabResult):
    """`method_comparison`'s table: size, latencies and accuracy of every method on every model."""

    shown = ("model", "method", "model_size_bytes", "cpu_latency_s", "gpu_latency_s", "test_accuracy",
             "not run because")

    def show_columns(self) -> list:
        measured = self.frame.gpu_latency_s.notna().any()
        return self.columns or [c for c in self.shown if measured or c != "gpu_latency_s"]

    def metrics(self) -> list[str]:
        """The columns worth a chart: size and speed-ups against fp32 (the GPU's if measured), accuracy."""
        return ["size_vs_fp32", "cpu_speedup", "test_accuracy",
                *(["gpu_speedup"] if self.frame.gpu_speedup.notna().any() else [])]

    def row(self, model: str, method: str) -> pd.Series:
        return self.frame[(self.frame.model == model) & (self.frame.method == method)].iloc[0]

    def speed(self, model: str, method: str, device: str = "cpu"):
        """``method``'s speed-up over fp32 on ``model`` as a `Comparison` within the timing noise."""
        row = self.row(model, method)
        return speedup(self.row(model, "fp32")[f"{device}_latency_s"], row[f"{device}_latency_s"],
                       row[f"{device}_noise"])

    def own_size_numbers(self, model: str) -> dict:
        """Exercise 06.own_size's numbers from this table: ``model``'s Linear share and its int8 dynamic file."""
        dynamic = self.row(model, "int8_dynamic")
        return {"model": model, "linear_share_pct": round(float(dynamic.linear_share) * 100, 2),
                "measured_pct": round(float(dynamic.size_vs_fp32) * 100, 1)}

    @worded
    def finding(self) -> str:
        parts = []
        for name in self.frame.model.unique():
            rows = self.frame[(self.frame.model == name) & self.frame.ran & (self.frame.method != "fp32")]
            smallest = rows.loc[rows.model_size_bytes.idxmin()]
            fastest = rows.loc[rows.cpu_latency_s.idxmin()]
            fp32 = self.row(name, "fp32")
            verdicts = collections.Counter(accuracies(r.test_accuracy, fp32.test_accuracy, int(fp32.test_images))
                                           .verdict for r in rows.itertuples())
            parts.append(f"{name}: smallest file {smallest.method} ({smallest.size_vs_fp32:.0%} of fp32's), fastest "
                         f"on the CPU {fastest.method} at {self.speed(name, fastest.method)}, accuracy against "
                         f"fp32's: " + ", ".join(f"{n} {v}" for v, n in verdicts.items()))
        return "; ".join(parts) + "."

    @worded
    def api_finding(self, model: str = VIT) -> str:
        """torch.ao's ``quantize_dynamic`` against torchao's ``quantize_`` (int8 dynamic both)."""
        old, new = self.row(model, "int8_dynamic"), self.row(model, "int8_dynamic_torchao")
        if not (old.ran and new.ran):
            ran = "torch.ao" if old.ran else "torchao"
            return f"Only one of the two APIs ran here ({ran}): {new.reason or old.reason}."
        text = (f"{model} int8 dynamic on the CPU: torch.ao {display.number(old.cpu_latency_s * 1e3)} ms, torchao "
                f"{display.number(new.cpu_latency_s * 1e3)} ms; torchao against torch.ao: "
                f"{speedup(old.cpu_latency_s, new.cpu_latency_s, old.cpu_noise)}.")
        if not math.isnan(new.gpu_latency_s):
            text += f" On the GPU, torchao against fp32: {self.speed(model, new.method, 'gpu')}."
        return text

    @worded
    def size_finding(self, cnn: str | None = None) -> str:
        """What int8 dynamic (and static int8) kept of each model's file, beside its share of Linear weights."""
        cnn = cnn or next(m for m in self.frame.model.unique() if m != VIT)
        vit, conv, static = (self.row(m, method) for m, method in ((VIT, "int8_dynamic"), (cnn, "int8_dynamic"),
                                                                     (cnn, "int8_static")))
        text = (f"int8 dynamic kept {vit.size_vs_fp32:.0%} of {VIT}'s file ({vit.linear_share:.1%} of its parameters "
                f"in Linear layers) and {conv.size_vs_fp32:.0%} of {cnn}'s ({conv.linear_share:.1%})")
        return text + (f"; static int8 took {cnn} to {static.size_vs_fp32:.0%}." if static.ran else ".")

    @worded
    def fp16_finding(self, model: str = VIT) -> str:
        """fp16 and bf16 against fp32 on this CPU (and GPU), within the timing noise."""
        has = {True: "with", False: "without", None: "perhaps without"}[cpu_fp16_native()]
        text = (f"{model} on this CPU ({has} fp16 arithmetic): fp16 {self.speed(model, 'fp16')}; "
                f"bf16 {self.speed(model, 'bf16')}")
        if not math.isnan(self.row(model, "fp16").gpu_speedup):
            text += f". On the GPU: fp16 {self.speed(model, 'fp16', 'gpu')}; bf16 {self.speed(model, 'bf16', 'gpu')}"
        return text + "."


@dataclass
class Flows(LabResult):
    """fp32, FX and PT2E: size, test accuracy, the layers each stores in int8."""

    shown = ("flow", "model_size_bytes", "size_vs_fp32", "test_accuracy", "int8_layers", "same_layers")
    model: str = "the model"

    @worded
    def finding(self) -> str:
        fp32, fx, pt2e = (self.frame.iloc[i] for i in range(3))
        gap = accuracies(pt2e.test_accuracy, fx.test_accuracy, min(profile().test_size, EVAL_IMAGES))
        layers = (f"the same {fx.int8_layers} layers in int8" if pt2e.same_layers else
                  f"different layers in int8 ({fx.int8_layers} by FX, {pt2e.int8_layers} by PT2E)")
        return (f"{self.model}, static int8: PT2E {pt2e.test_accuracy:.1%} against FX {fx.test_accuracy:.1%} "
                f"({points(gap.difference)}, {gap.verdict}; fp32 {fp32.test_accuracy:.1%}); files "
                f"{pt2e.size_vs_fp32:.0%} and {fx.size_vs_fp32:.0%} of fp32's; {layers}.")


def flows(cfg: RunConfig, num_calibration: int = CALIBRATION_BATCHES, refresh: bool = False) -> Flows:
    """fp32, and static int8 by FX graph mode and by PT2E from the same calibration batches (measured once, cached)."""
    frame = results.cached_frame("quant-flows", [cfg], lambda: _flow_rows(cfg, num_calibration), refresh=refresh,
                                 num_calibration=num_calibration)
    frame["size_vs_fp32"] = frame.model_size_bytes / frame.model_size_bytes.iloc[0]
    frame["accuracy_drop"] = frame.test_accuracy.iloc[0] - frame.test_accuracy
    return Flows(frame, model=cfg.model)


def _flow_rows(cfg: RunConfig, num_calibration: int) -> pd.DataFrame:
    model = copy.deepcopy(fine_tuned(cfg, progress=False)[0]).cpu().eval()
    calibration = calibration_batches(cfg, num_calibration)
    rows = [{"flow": "fp32 (reference)", "method": "fp32", "model_size_bytes": measure.model_size_bytes(model),
             "test_accuracy": eval_accuracy(model, cfg), "layers": [], "quantize_s": 0.0}]
    for method, flow in FLOWS.items():
        start = time.perf_counter()
        int8 = quantization.quantize(model, method, calibration)
        seconds = time.perf_counter() - start
        rows.append({"flow": flow, "method": method, "model_size_bytes": measure.model_size_bytes(int8),
                     "test_accuracy": eval_accuracy(int8, cfg), "layers": quantization.int8_layers(int8),
                     "quantize_s": seconds})
    frame = pd.DataFrame(rows)
    frame["int8_layers"] = frame.layers.map(len)
    frame["same_layers"] = frame.layers.map(lambda names: names == frame.layers.iloc[1])
    return frame.drop(columns="layers")


@dataclass
class Stacking(LabResult):
    """The files of fp32, fp16, int8 dynamic and fp16 then int8 dynamic; the stacked model's forward errors."""

    shown = ("variant", "model_size_bytes", "size_vs_fp32")
    fp16_input_error: str | None = None
    fp32_input_error: str | None = None

    @worded
    def finding(self) -> str:
        fp16, fp32 = (f"failed: {e}" if e else "ran" for e in (self.fp16_input_error, self.fp32_input_error))
        return f"{STACKED}, fp16 inputs: {fp16}; fp32 inputs: {fp32}."


def _forward_error(model: nn.Module, x: torch.Tensor) -> str | None:
    try:
        with torch.no_grad():
            model(x)
    except (RuntimeError, TypeError) as exc:
        return str(exc).split("\n")[0]
    return None


def stacking(cfg: RunConfig) -> Stacking:
    """Cast the fine-tuned model to fp16, then int8 dynamic, and run it on fp16 and fp32 inputs."""
    model = copy.deepcopy(fine_tuned(cfg, progress=False)[0]).cpu().eval()
    x = example_batch(cfg, 8, device=torch.device("cpu"))
    half = copy.deepcopy(model).half()
    both = quantization.quantize(half, "int8_dynamic")
    variants = {"fp32": model, "fp16": half, "int8 dynamic": quantization.quantize(model, "int8_dynamic"),
                STACKED: both}
    frame = pd.DataFrame({"variant": list(variants),
                          "model_size_bytes": [measure.model_size_bytes(m) for m in variants.values()]})
    frame["size_vs_fp32"] = frame.model_size_bytes / frame.model_size_bytes.iloc[0]
    return Stacking(frame, fp16_input_error=_forward_error(both, x.half()),
                    fp32_input_error=_forward_error(both, x))


@dataclass
class QuantRun:
    """One panel run: one model quantized by one method, measured against its fp32 self."""

    config: dict
    model: str
    method: str
    calibration_batches: int
    model_size_bytes: int
    fp32_size_bytes: int
    cpu_latency_s: float
    fp32_cpu_latency_s: float
    test_accuracy: float
    fp32_test_accuracy: float
    threads: int
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k not in ("config", "warnings")}
        row["size_vs_fp32"] = self.model_size_bytes / self.fp32_size_bytes
        row["cpu_speedup"] = self.fp32_cpu_latency_s / self.cpu_latency_s
        return row

    def __str__(self) -> str:
        row, size = self.to_row(), display.quantity("model_size_bytes", self.model_size_bytes)
        return wrap(f"{self.model} {self.method}: file {size} ({row['size_vs_fp32']:.0%} of fp32), CPU latency "
                    f"{display.number(self.cpu_latency_s * 1e3)} ms ({row['cpu_speedup']:.2f}x fp32's speed, "
                    f"{self.threads} threads), test accuracy {self.test_accuracy:.1%} "
                    f"(fp32 {self.fp32_test_accuracy:.1%})")


def panel_run(cfg: RunConfig, model: str = VIT, method: str = "int8_dynamic", calibration: int = CALIBRATION_BATCHES,
              on_step=None, progress: bool = False) -> QuantRun:
    """``model`` (a key of `workloads`, seeded by ``cfg``) quantized by ``method`` on the CPU, against its fp32 self
    (``on_step``: the panel's hook, unused)."""
    choices = workloads()
    if model not in choices:
        raise ConfigError("model", model, f"one of {list(choices)}")
    if method not in TABLE_METHODS:
        raise ConfigError("method", method, f"one of {list(TABLE_METHODS)}")
    if not is_int(calibration) or calibration < 1:
        raise ConfigError("calibration", calibration, "a positive integer (calibration batches)")
    cfg = choices[model].replace(seed=cfg.seed)
    fp32, result = fine_tuned(cfg, progress=progress)
    fp32 = copy.deepcopy(fp32).cpu().eval()
    built = build(fp32, method, cfg, calibration_batches(cfg, calibration))
    if built.model is None:
        raise ConfigError("method", method, f"a method that runs on this machine's CPU: {built.reason}")
    x = example_batch(cfg, profile().latency_batch, device=torch.device("cpu"))
    fp32_s, quant_s = latencies([fp32, built.model], x)
    return QuantRun(config=cfg.to_dict(), model=cfg.model, method=method, calibration_batches=calibration,
                    model_size_bytes=measure.model_size_bytes(built.model),
                    fp32_size_bytes=measure.model_size_bytes(fp32), cpu_latency_s=quant_s, fp32_cpu_latency_s=fp32_s,
                    test_accuracy=accuracy(built.model, cfg, "test"), fp32_test_accuracy=accuracy(fp32, cfg, "test"),
                    threads=torch.get_num_threads(), warnings=list(result.warnings))


def panel_estimate(cfg: RunConfig) -> str:
    """The panel's time line (the fine-tunes are cached after the notebook's first run)."""
    return ("Estimated time: a few seconds once both fine-tunes are cached (the notebook's first run does that); "
            f"int8_qat fine-tunes {extra_steps()} more steps first, fp16 on a CPU without fp16 arithmetic is slow.")

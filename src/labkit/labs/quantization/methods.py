"""Notebook 06, section 2: every method of `labkit.techniques.quantization.METHODS`, and QAT, on both models.

File size, CPU latency (threads recorded), GPU latency where there is a GPU, test accuracy. Latencies are timed in
turns (`labkit.inference.latencies`), with the fp32 model timed twice: the gap between its two timings is the
run's timing noise, and a speed-up is called real only beyond it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ... import display, measure, results, train
from ...config import RunConfig
from ...env import cuda_usable, profile
from ...errors import ConfigError, UnsupportedError
from ...inference import LATENCY_ROUNDS, example_batch, latencies, model_device
from ...messages import worded
from ...techniques import quantization
from ...techniques.quantization import METHODS
from .workload import (
    CALIBRATION_BATCHES,
    EVAL_IMAGES,
    QAT,
    VIT,
    calibration_batches,
    eval_accuracy,
    fine_tuned,
    linear_share,
    qat_model,
    workloads,
)

# int8_pt2e is int8_static by another flow, compared in `flows`: eagerly its graph computes in float, so a latency
# beside the others would time quantize/dequantize steps, not int8 kernels.
TABLE_METHODS = (*(m for m in METHODS if m != "int8_pt2e"), QAT)
QAT_API = "torch.ao FX (deprecated)"
CPU_BATCH_BESIDE_GPU = 8  # CPU latency batch when the models live on a GPU (the profile's large workload)
TABLE_COLUMNS = ("model", "method", "model_size_bytes", "cpu_latency_s", "test_accuracy", "not run because")


def methods_table() -> pd.DataFrame:
    """`METHODS` and QAT as a table, with whether each runs here (on this CPU, and on this GPU if there is one)."""
    rows = []
    gpu = cuda_usable()
    for m in METHODS.values():
        row = {"method": m.name, "what it does": m.description, "library": m.api, "weight bits": m.weight_bits,
               "calibration": m.calibration, "Linear only": m.linear_only,
               "runs on this CPU": quantization.supported(m.name, "cpu") is None}
        if gpu:
            row["runs on this GPU"] = quantization.supported(m.name, "cuda") is None
        rows.append(row)
    rows.append({"method": QAT, "what it does": "fine-tuned with int8 rounding, then int8", "library": QAT_API,
                 "weight bits": 8, "calibration": False, "Linear only": False, "runs on this CPU": True,
                 **({"runs on this GPU": False} if gpu else {})})
    return pd.DataFrame(rows)


def methods_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of `methods_table` a learner reads (at most 7): the GPU's where there is one.

    Args:
        frame: `methods_table`'s frame.
    """
    return ["method", "what it does", "library", "weight bits", "calibration", "runs on this CPU",
            *(["runs on this GPU"] if "runs on this GPU" in frame else [])]


@dataclass
class _Built:
    model: nn.Module | None
    seconds: float = 0.0
    reason: str | None = None


def build(model: nn.Module, method: str, cfg: RunConfig, calibration) -> _Built:
    """``model`` quantized by ``method`` on its device, timed; or why it cannot run there.

    Args:
        model: the fine-tuned model. method: one of `TABLE_METHODS`. cfg: its fine-tune.
        calibration: batches for static int8.
    """
    device = model_device(model)
    if method == QAT:
        if device.type == "cuda":
            return _Built(None, reason="QAT converts to torch.ao's int8 CPU kernels")
        int8, run, convert_s = qat_model(cfg)
        return _Built(int8, run.train_time_s + convert_s)
    spec = METHODS[method]
    reason = quantization.supported(method, device)
    if reason is None and device.type not in spec.devices:
        reason = f"{method} runs on {' and '.join(spec.devices)} only"
    if reason:
        return _Built(None, reason=reason)
    start = time.perf_counter()
    try:
        built = quantization.quantize(model, method, calibration if spec.calibration else None)
        measure.synchronize(model_device(built))  # a GPU may still be packing weights: wait before reading the clock
        seconds = time.perf_counter() - start
        with torch.no_grad():  # a kernel this GPU lacks fails only when it runs: find out here, not in a timing loop
            built(example_batch(cfg, 2, device=model_device(built)))
    except UnsupportedError as exc:
        return _Built(None, reason=exc.reason)
    except (RuntimeError, NotImplementedError) as exc:  # the table says so instead of stopping
        return _Built(None, reason=f"failed here: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return _Built(built, seconds)


def _timed(built: dict, reference: nn.Module, x: torch.Tensor, prof=None) -> tuple[dict, float]:
    """Latency of each built model, in turns, and the noise: the relative gap of the reference timed twice."""
    ran = [m for m in built if built[m].model is not None]
    if not ran:
        return {}, math.nan
    times = latencies([built[m].model for m in ran] + [reference], x, prof)
    again, first = times[-1], times[ran.index("fp32")] if "fp32" in ran else math.nan
    return dict(zip(ran, times, strict=False)), abs(first - again) / min(first, again)


def not_run_reason(cpu: _Built, gpu: _Built | None) -> str | None:
    """Why a method did not run: the CPU's reason alone without a GPU; with one, each device's that failed, named.

    Args:
        cpu: the method built for the CPU. gpu: built for the GPU (None: no GPU here, or not tried there).
    """
    if gpu is None:
        return cpu.reason if cpu.model is None else None
    failed = [(where, built.reason.split(";")[0]) for where, built in (("CPU", cpu), ("GPU", gpu))
              if built.model is None and built.reason]
    return "; ".join(f"{where}: {reason}" for where, reason in failed) or None


def _compare_rows(cfgs: dict[str, RunConfig], methods: tuple, num_calibration: int, progress: bool,
                  cpu_batch: int | None = None, eval_images: int | None = None) -> pd.DataFrame:
    rows = []
    latency_batch = cpu_batch
    for name, cfg in cfgs.items():
        model = fine_tuned(cfg, progress=progress)[0].eval()
        cpu_model = copy.deepcopy(model).cpu()
        calibration = calibration_batches(cfg, num_calibration)
        cpu = {m: build(cpu_model, m, cfg, calibration) for m in methods}
        gpu = {}
        if model_device(model).type == "cuda":
            gpu = {m: build(model, m, cfg, calibration) for m in methods if m != QAT}
        # On a GPU machine the CPU is a cloud VM's few cores and the model is the profile's large one: time the
        # CPU copies on a smaller batch and fewer calls (the table records the batch).
        cpu_batch, cpu_prof = latency_batch or profile().latency_batch, None
        if gpu:
            cpu_batch = latency_batch or CPU_BATCH_BESIDE_GPU
            cpu_prof = dataclasses.replace(profile(), repeats=2 * LATENCY_ROUNDS, warmup_steps=1)
        test_images = min(len(train.run_splits(cfg, training=False)["test"]), eval_images or EVAL_IMAGES)
        cpu_times, cpu_noise = _timed(cpu, cpu_model, example_batch(cfg, cpu_batch, torch.device("cpu")), cpu_prof)
        gpu_x = example_batch(cfg, profile().latency_batch) if gpu else None
        gpu_times, gpu_noise = _timed(gpu, model, gpu_x) if gpu else ({}, math.nan)
        for m in methods:
            done = gpu[m] if m in gpu and gpu[m].model is not None else cpu[m]
            row = {"model": name, "method": m, "api": METHODS[m].api if m in METHODS else QAT_API,
                   "ran": done.model is not None, "reason": not_run_reason(cpu[m], gpu.get(m)),
                   "threads": torch.get_num_threads(), "cpu_batch": cpu_batch,
                   "cpu_latency_s": cpu_times.get(m, math.nan), "cpu_noise": cpu_noise,
                   "gpu_latency_s": gpu_times.get(m, math.nan), "gpu_noise": gpu_noise, "quantize_s": done.seconds,
                   "linear_share": linear_share(cpu_model), "test_images": test_images}
            if done.model is not None:
                row["model_size_bytes"] = measure.model_size_bytes(done.model)
                row["test_accuracy"] = eval_accuracy(done.model, cfg, test_images)
            rows.append(row)
    return pd.DataFrame(rows)


def compare(cfgs: dict[str, RunConfig] | None = None, methods=TABLE_METHODS,
            num_calibration: int = CALIBRATION_BATCHES, progress: bool = True, refresh: bool = False,
            cpu_batch: int | None = None, eval_images: int | None = None) -> pd.DataFrame:
    """Every method on every model: one row per (model, method), measured once, then read from the cache.

    Args:
        cfgs: model name -> fine-tune (default: `workloads`). methods: names from `TABLE_METHODS` (fp32 is added).
        num_calibration: calibration batches for static int8. refresh: measure again.
        cpu_batch: the CPU latency batch (default: the profile's ``latency_batch``; `CPU_BATCH_BESIDE_GPU` beside a
            GPU).
        eval_images: the first test images each accuracy is taken on (default: `EVAL_IMAGES`, at most the split).

    Returns:
        ``model``, ``method``, ``api``, ``ran`` (else ``reason``, its first clause in ``not run because``),
        ``model_size_bytes``, ``size_vs_fp32``, ``cpu_latency_s`` (batch ``cpu_batch``), ``cpu_speedup``,
        ``cpu_noise`` (fp32 timed twice: relative gap), ``threads``, and ``gpu_*`` alike (NaN without a GPU),
        ``test_accuracy`` (on ``test_images``), ``accuracy_drop`` (below fp32), ``quantize_s``, ``linear_share``.
    """
    cfgs = workloads() if cfgs is None else cfgs
    unknown = [m for m in methods if m not in TABLE_METHODS]
    if unknown:
        raise ConfigError("methods", unknown, f"names from {list(TABLE_METHODS)}")
    if not cfgs:
        raise ConfigError("cfgs", cfgs, "a non-empty dict of model name -> RunConfig (e.g. workloads())")
    methods = ("fp32", *(m for m in methods if m != "fp32"))  # the reference every ratio is taken against

    def rows() -> pd.DataFrame:
        return _compare_rows(cfgs, methods, num_calibration, progress, cpu_batch, eval_images)

    table = results.cached_frame("quant-compare", cfgs.values(), rows,
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
    table["not run because"] = table.reason.map(lambda r: (r if r.startswith("CPU: ") or r.startswith("GPU: ")
                                                           else r.split(";")[0]) if isinstance(r, str) else None)
    return table


def chart_metrics(table: pd.DataFrame) -> list[str]:
    """The columns worth a chart: size and CPU speed-up against fp32, accuracy; the GPU's speed-up if measured.

    Args:
        table: `compare`'s table.
    """
    metrics = ["size_vs_fp32", "cpu_speedup", "test_accuracy"]
    return metrics + (["gpu_speedup"] if table.gpu_speedup.notna().any() else [])


def table_columns(table: pd.DataFrame) -> list[str]:
    """The columns of `compare`'s table a learner reads (at most 7): the GPU's latency only where it was measured.

    Args:
        table: `compare`'s table.
    """
    columns = list(TABLE_COLUMNS)
    if table.gpu_latency_s.notna().any():
        columns.insert(4, "gpu_latency_s")
    return columns


def row(table: pd.DataFrame, model: str, method: str) -> pd.Series:
    """The row of ``model`` quantized by ``method``.

    Args:
        table: `compare`'s table. model: a model's name. method: a method's name.
    """
    return table[(table.model == model) & (table.method == method)].iloc[0]


def speed_verdict(speedup: float, noise: float) -> str:
    """"1.52x, faster" or "0.97x, the same within the 3% timing noise": real only beyond the noise.

    Args:
        speedup: the speed-up (old time / new time). noise: the timing noise, a fraction.
    """
    if math.isnan(speedup):
        return "not timed"
    if math.isnan(noise) or abs(math.log(speedup)) <= math.log1p(noise):
        return f"{speedup:.2f}x, the same within the {noise:.0%} timing noise"
    return f"{speedup:.2f}x, {'faster' if speedup > 1 else 'slower'}"


def own_size_numbers(table: pd.DataFrame, model: str) -> dict:
    """The numbers of exercise 06.own_size from the learner's table: ``model``'s Linear share, int8 dynamic size.

    Args:
        table: `compare`'s table. model: the model.
    """
    dynamic = row(table, model, "int8_dynamic")
    return {"model": model, "linear_share_pct": round(float(dynamic.linear_share) * 100, 2),
            "measured_pct": round(float(dynamic.size_vs_fp32) * 100, 1)}



def accuracy_noise(table: pd.DataFrame, model: str) -> float:
    """The smallest accuracy difference on ``model``'s test images that is not chance (`measure.accuracy_noise`).

    Args:
        table: `compare`'s table. model: the model.
    """
    fp32 = row(table, model, "fp32")
    images = fp32.test_images if "test_images" in table else min(profile().test_size, EVAL_IMAGES)  # older caches
    return measure.accuracy_noise(fp32.test_accuracy, int(images))


@worded
def compare_finding(table: pd.DataFrame) -> str:
    """One line: per model, the smallest file, the fastest on the CPU, and how many kept fp32's accuracy.

    Args:
        table: `compare`'s table.
    """
    parts = []
    for name in table.model.unique():
        rows = table[(table.model == name) & table.ran & (table.method != "fp32")]
        smallest = rows.loc[rows.model_size_bytes.idxmin()]
        fastest = rows.loc[rows.cpu_latency_s.idxmin()]
        noise = accuracy_noise(table, name)
        kept = int((rows.accuracy_drop <= noise).sum())
        parts.append(f"{name}: smallest file {smallest.method} ({smallest.size_vs_fp32:.0%} of fp32's), fastest on "
                     f"the CPU {fastest.method} ({speed_verdict(fastest.cpu_speedup, fastest.cpu_noise)}), {kept} of "
                     f"{len(rows)} within {noise * 100:.1f} points of fp32's accuracy")
    return "; ".join(parts) + "."


@worded
def api_finding(table: pd.DataFrame, model: str = VIT) -> str:
    """One line: torch.ao's ``quantize_dynamic`` against torchao's ``quantize_`` (int8 dynamic both), from the run.

    Args:
        table: `compare`'s table. model: the model compared.
    """
    old, new = row(table, model, "int8_dynamic"), row(table, model, "int8_dynamic_torchao")
    if not (old.ran and new.ran):
        ran = "torch.ao" if old.ran else "torchao"
        return f"Only one of the two APIs ran here ({ran}): {new.reason or old.reason}."
    text = (f"{model} int8 dynamic on the CPU: torch.ao {display.number(old.cpu_latency_s * 1e3)} ms, torchao "
            f"{display.number(new.cpu_latency_s * 1e3)} ms; torchao against torch.ao: "
            f"{speed_verdict(old.cpu_latency_s / new.cpu_latency_s, old.cpu_noise)}.")
    if not math.isnan(new.gpu_latency_s):
        text += f" On the GPU, torchao against fp32: {speed_verdict(new.gpu_speedup, new.gpu_noise)}."
    return text

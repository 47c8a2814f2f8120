"""Notebook 06 (quantization): its experiments and the findings worded from their live numbers.

- `workloads`, `fine_tuned`, `calibration_batches`: the two fine-tuned models (the Linear-heavy
  ``tiny_vit`` and the profile's CNN) and batches of training inputs for static quantization.
- `scheme_errors`: one weight quantized four ways (symmetric or not, per tensor or per channel), its error.
- `compare`, `compare_finding`, `api_finding`, `size_finding`, `fp16_finding`: every method of
  `labkit.techniques.quantization.METHODS` and QAT on both models: file size, CPU latency (threads
  recorded), GPU latency where there is a GPU, accuracy.
- `stacking`: fp16 and int8 dynamic do not stack, live.
- `sensitivity`: static int8 with everything quantized against keeping the first, last and LayerNorm
  layers in float.
- `qat_vs_ptq`: fine-tune then quantize against quantization-aware fine-tuning (and against as many
  more float steps), accuracy and time.
- `panel_run`: what the notebook's panel runs.

The mechanisms are in `labkit.techniques.quantization`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
from torch import nn

from ... import config, data, measure, results, train
from ...config import RunConfig
from ...env import Profile, cpu_fp16_native, cuda_usable, profile
from ...errors import ConfigError, UnsupportedError
from ...inference import LATENCY_BATCH, LATENCY_ROUNDS, accuracy, example_batch, latencies, model_device
from ...messages import worded, wrap
from ...techniques import quantization
from ...techniques.quantization import METHODS
from ...units import mib
from ...validate import is_int

VIT = "tiny_vit"
QAT = "int8_qat"  # the table's row for quantization-aware training (a fine-tune, not a post-training method)
TABLE_METHODS = (*METHODS, QAT)
CALIBRATION_BATCHES = 8
# Every row's accuracy is measured on the same first test images; at most this many, so that the CPU-only
# methods stay affordable on a cloud GPU machine's few CPU cores at the `full` profile.
EVAL_IMAGES = 2000
KEEP_FLOAT_CHOICES = {  # what stays in float: nothing; LayerNorm; the first and last layers; all three
    "all int8": (),
    "LayerNorm float": ("LayerNorm",),
    "first+last float": ("stem", "head"),
    "first+last+LN float": ("stem", "head", "LayerNorm"),
}
QAT_LR_FACTOR = 0.1
CPU_BATCH_BESIDE_GPU = 8  # CPU latency batch when the models live on a GPU (the profile's large workload)  # the quantized fine-tune continues from a trained model at a tenth of its learning rate


def workloads(prof: Profile | None = None) -> dict[str, RunConfig]:
    """The notebook's two fine-tunes: ``tiny_vit`` (Linear-heavy) and the profile's CNN, keyed by model name.

    Example:
        >>> cfgs = workloads(labkit.profile("ci")); list(cfgs)
        ['tiny_vit', 'small_cnn']
    """
    prof = prof or profile()
    cnn = config.baseline(prof)
    vit = config.baseline(prof, model=VIT, image_size=None)  # tiny_vit takes 32x32 images
    return {VIT: vit, cnn.model: cnn}


def fine_tuned(cfg: RunConfig, progress: bool = True) -> tuple[nn.Module, object]:
    """The model ``cfg`` fine-tunes and its `RunResult`: trained once, then read from the cache."""
    return results.cached_model(cfg, progress=progress)


def calibration_batches(cfg: RunConfig, num_batches: int = CALIBRATION_BATCHES) -> list[torch.Tensor]:
    """``num_batches`` batches of training inputs (``cfg.batch_size`` images each, on the CPU) for static quantization.

    Example:
        >>> int8 = quantization.quantize(model, "int8_static", calibration_batches(cfg, 8))
    """
    if not is_int(num_batches) or num_batches < 1:
        raise ConfigError("num_batches", num_batches, "a positive integer (calibration batches)")
    split = train.run_splits(cfg)["train"]
    loader = data.make_loader(split, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    batches = []
    for images, _ in loader:
        batches.append(data.to_model_input(images, split, "cpu", cfg.channels_last, cfg.image_size))
        if len(batches) == num_batches:
            break
    return batches


def library_versions() -> str:
    """The quantization libraries installed here, against the versions labkit was tested with."""
    parts = []
    for package, tested in (("torchao", quantization.TORCHAO_TESTED), ("bitsandbytes", "0.50.2")):
        version = quantization.installed_version(package)
        if version is None:
            parts.append(f"{package}: not installed (its rows will say so)")
        elif _version_tuple(version) < _version_tuple(tested):
            parts.append(f"{package} {version}: older than the {tested} this notebook was tested with; a method may "
                         "be missing or slower (pip install -U it, keeping torch, if a row fails)")
        else:
            parts.append(f"{package} {version} (tested: {tested})")
    return f"torch {torch.__version__}; " + "; ".join(parts)


def _version_tuple(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers)


def methods_table() -> pd.DataFrame:
    """`labkit.techniques.quantization.METHODS` as a table, with whether each runs here (CPU, and GPU if any)."""
    rows = []
    for m in METHODS.values():
        row = {"method": m.name, "what it does": m.description, "api": m.api, "weight bits": m.weight_bits,
               "calibration": m.calibration, "Linear layers only": m.linear_only,
               "runs on this CPU": quantization.supported(m.name, "cpu") is None}
        if cuda_usable():
            row["runs on this GPU"] = quantization.supported(m.name, "cuda") is None
        rows.append(row)
    rows.append({"method": QAT, "what it does": "fine-tuned with int8 rounding, then int8",
                 "api": "torch.ao FX (deprecated)", "weight bits": 8, "calibration": False, "Linear layers only": False,
                 "runs on this CPU": True, **({"runs on this GPU": False} if cuda_usable() else {})})
    return pd.DataFrame(rows)


# --- 1. the mechanism -----------------------------------------------------------------------------


def scheme_errors(weights, bits: int = 8) -> pd.DataFrame:
    """Each weight quantized and dequantized four ways (symmetric or not, per tensor or per channel).

    Args:
        weights: a tensor, or a dict name -> tensor.

    Returns:
        ``weight``, ``scheme``, ``granularity``, ``mean_abs_error``, ``max_abs_error``, ``relative_error`` (norm of
        the error / norm of the weight).
    """
    weights = weights if isinstance(weights, dict) else {"weight": weights}
    rows = []
    for name, weight in weights.items():
        w = weight.detach().float().cpu()
        for symmetric in (False, True):
            for dim in (None, 0):
                scale, zero_point = quantization.affine_qparams(w, bits, symmetric, dim)
                q = quantization.quantize_affine(w, scale, zero_point, bits, symmetric, dim)
                restored = quantization.dequantize_affine(q, scale, zero_point, dim)
                error = (restored - w).abs()
                rows.append({"weight": name, "scheme": "symmetric" if symmetric else "asymmetric",
                             "granularity": "per tensor" if dim is None else "per channel",
                             "mean_abs_error": float(error.mean()), "max_abs_error": float(error.max()),
                             "relative_error": float(torch.linalg.vector_norm(restored - w) / torch.linalg.vector_norm(w))})
    return pd.DataFrame(rows)


@worded
def scheme_finding(errors: pd.DataFrame) -> str:
    """Per weight: the scheme with the smallest relative error, and how much per channel bought."""
    lines = []
    for name, rows in errors.groupby("weight", sort=False):
        best = rows.loc[rows.relative_error.idxmin()]
        sym = rows[rows.scheme == "symmetric"].set_index("granularity").relative_error
        lines.append(f"{name}: smallest error {best.scheme} {best.granularity} ({best.relative_error:.2%} of the weight's "
                     f"norm); symmetric per channel {sym['per channel']:.2%} against per tensor {sym['per tensor']:.2%} "
                     f"({sym['per tensor'] / sym['per channel']:.1f}x the error)")
    return wrap("\n".join(lines))


# --- 2. every method on both models ---------------------------------------------------------------


def _accuracy(model: nn.Module, cfg: RunConfig, images: int | None = None) -> float:
    """Test accuracy of ``model`` on the first ``images`` test images (default: `EVAL_IMAGES`), on its device."""
    images = images or EVAL_IMAGES
    test = train.run_splits(cfg, training=False)["test"]
    if len(test) <= images:
        return accuracy(model, cfg, "test")
    device = model_device(model)
    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, images, 256):
            batch = slice(start, min(start + 256, images))
            x = data.to_model_input(test.images[batch], test, device, cfg.channels_last, cfg.image_size)
            correct += int((model(x).argmax(dim=1).cpu() == test.labels[batch]).sum())
    model.train(was_training)
    return correct / images


def _linear_share(model: nn.Module) -> float:
    """The share of the model's parameters that sit in Linear layers (what int8 dynamic quantizes)."""
    linear = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters())
    return linear / sum(p.numel() for p in model.parameters())


_QAT_MODELS: dict = {}


def qat_model(cfg: RunConfig, steps: int | None = None, progress: bool = False) -> tuple[nn.Module, object]:
    """The fine-tuned model of ``cfg`` fine-tuned ``steps`` more steps with fake quantization, converted to int8;
    and the QAT run's `RunResult` (its step time, its train time). Kept for the session once computed (QAT runs
    are not in labkit's disk cache: their int8 models are GraphModules, which a state_dict cannot rebuild)."""
    steps = extra_steps(steps)
    key = (repr(sorted(cfg.to_dict().items())), steps)
    if key not in _QAT_MODELS:
        model, _ = fine_tuned(cfg, progress=progress)
        prepared = quantization.prepare_qat(model, example_batch(cfg, 2, device=model_device(model)))
        run = train.fit(_continue(cfg, steps), model=prepared, progress=progress)
        start = time.perf_counter()
        int8 = quantization.convert_qat(prepared)
        _QAT_MODELS[key] = (int8, run, time.perf_counter() - start)
    return _QAT_MODELS[key][:2]


def _qat_convert_s(cfg: RunConfig, steps: int) -> float:
    return _QAT_MODELS[(repr(sorted(cfg.to_dict().items())), steps)][2]


def extra_steps(steps: int | None = None) -> int:
    """Steps of a continued fine-tune (QAT, or the float run it is compared with): half the profile's fine-tune."""
    prof = profile()
    least = prof.warmup_steps + train.PROFILING_STEPS + 2
    if steps is None:
        return max(prof.max_steps // 2, least)
    if not is_int(steps) or steps < least:
        raise ConfigError("steps", steps, f"an integer >= {least} (the run's untimed warm-up and profiling steps, "
                          "then at least two timed ones)")
    return steps


def _continue(cfg: RunConfig, steps: int) -> RunConfig:
    return cfg.replace(max_steps=steps, lr=cfg.lr * QAT_LR_FACTOR, lr_warmup_steps=0)


@dataclass
class _Built:
    model: nn.Module | None
    seconds: float = 0.0
    reason: str | None = None


def _build(model: nn.Module, method: str, cfg: RunConfig, calibration) -> _Built:
    """``model`` quantized by ``method`` on its device, timed; or why it cannot run there."""
    device = model_device(model)
    if method == QAT:
        if device.type == "cuda":
            return _Built(None, reason="QAT converts to torch.ao's int8 CPU kernels")
        int8, run = qat_model(cfg)
        return _Built(int8, run.train_time_s + _qat_convert_s(cfg, extra_steps()))
    spec = METHODS[method]
    reason = quantization.supported(method, device)
    if reason is None and device.type not in spec.devices:
        reason = f"{method} runs on {' and '.join(spec.devices)} only"
    if reason:
        return _Built(None, reason=reason)
    start = time.perf_counter()
    try:
        built = quantization.quantize(model, method, calibration if spec.calibration else None)
        seconds = time.perf_counter() - start
        with torch.no_grad():  # a kernel this GPU lacks fails only when it runs: find out here, not in a timing loop
            built(example_batch(cfg, 2, device=model_device(built)))
    except UnsupportedError as exc:
        return _Built(None, reason=exc.reason)
    except (RuntimeError, NotImplementedError) as exc:  # the table says so instead of stopping
        return _Built(None, reason=f"failed here: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return _Built(built, seconds)


def _compare_rows(cfgs: dict[str, RunConfig], methods: tuple, num_calibration: int, progress: bool) -> pd.DataFrame:
    rows = []
    for name, cfg in cfgs.items():
        model, _ = fine_tuned(cfg, progress=progress)
        model = model.eval()
        cpu_model = copy.deepcopy(model).cpu()
        calibration = calibration_batches(cfg, num_calibration)
        cpu = {m: _build(cpu_model, m, cfg, calibration) for m in methods}
        gpu = {}
        if model_device(model).type == "cuda":
            gpu = {m: _build(model, m, cfg, calibration) for m in methods if m != QAT}
        # On a GPU machine the CPU is a cloud VM's few cores and the model is the profile's large one: time the
        # CPU copies on a smaller batch and fewer calls (the table records the batch).
        cpu_batch, cpu_prof = LATENCY_BATCH, None
        if gpu:
            cpu_batch = CPU_BATCH_BESIDE_GPU
            cpu_prof = dataclasses.replace(profile(), repeats=2 * LATENCY_ROUNDS, warmup_steps=1)
        x_cpu = example_batch(cfg, cpu_batch, device=torch.device("cpu"))
        ran = [m for m in methods if cpu[m].model is not None]
        cpu_times = dict(zip(ran, latencies([cpu[m].model for m in ran], x_cpu, cpu_prof), strict=True))
        gpu_ran = [m for m in gpu if gpu[m].model is not None]
        gpu_times = {}
        if gpu_ran:
            x_gpu = example_batch(cfg, LATENCY_BATCH)
            gpu_times = dict(zip(gpu_ran, latencies([gpu[m].model for m in gpu_ran], x_gpu), strict=True))
        for m in methods:
            built = gpu.get(m) if gpu.get(m) and gpu[m].model is not None else cpu[m]
            row = {"model": name, "method": m, "api": METHODS[m].api if m in METHODS else "torch.ao FX (deprecated)",
                   "ran": built.model is not None, "reason": cpu[m].reason if cpu[m].model is None else None,
                   "threads": torch.get_num_threads(), "cpu_batch": cpu_batch, "cpu_latency_s": cpu_times.get(m, math.nan),
                   "gpu_latency_s": gpu_times.get(m, math.nan), "quantize_s": built.seconds,
                   "linear_share": _linear_share(cpu_model)}
            if built.model is not None:
                row["model_size_bytes"] = measure.model_size_bytes(built.model)
                row["test_accuracy"] = _accuracy(built.model, cfg)
            rows.append(row)
    return pd.DataFrame(rows)


def compare(cfgs: dict[str, RunConfig] | None = None, methods=TABLE_METHODS,
            num_calibration: int = CALIBRATION_BATCHES, progress: bool = True, refresh: bool = False) -> pd.DataFrame:
    """Every method on every model: one row per (model, method), measured once and then read from the cache
    (``refresh=True`` measures again).

    Columns: ``model``, ``method``, ``api``, ``ran`` (False: ``reason`` says why), ``model_size_bytes``,
    ``size_vs_fp32``, ``cpu_latency_s`` (batch ``cpu_batch``: 64, or `CPU_BATCH_BESIDE_GPU` when the models live
    on a GPU; timed in turns with the model's other methods),
    ``cpu_speedup``, ``threads``, ``gpu_latency_s`` and ``gpu_speedup`` (NaN without a GPU or where the
    method has no GPU kernel), ``test_accuracy`` (on the same first test images for every row, on the GPU
    where the method runs there), ``accuracy_drop`` (points below fp32), ``quantize_s``, ``linear_share``.

    Example:
        >>> table = compare(); table.pivot(index="method", columns="model", values="size_vs_fp32")
    """
    cfgs = workloads() if cfgs is None else cfgs
    unknown = [m for m in methods if m not in TABLE_METHODS]
    if unknown:
        raise ConfigError("methods", unknown, f"names from {list(TABLE_METHODS)}")
    if not cfgs:
        raise ConfigError("cfgs", cfgs, "a non-empty dict of model name -> RunConfig (e.g. workloads())")
    methods = ("fp32", *(m for m in methods if m != "fp32"))  # the reference every ratio is taken against
    table = results.cached_frame("quant-compare", cfgs.values(), lambda: _compare_rows(cfgs, methods, num_calibration,
                                                                                      progress),
                                 refresh=refresh, models=list(cfgs), methods=methods, num_calibration=num_calibration)
    for column in ("model_size_bytes", "test_accuracy", "cpu_latency_s", "gpu_latency_s"):
        table[column] = pd.to_numeric(table[column]) if column in table else math.nan  # a cached None is NaN
    fp32 = table[table.method == "fp32"].set_index("model")
    table["size_vs_fp32"] = table.model_size_bytes / table.model.map(fp32.model_size_bytes)
    table["cpu_speedup"] = table.model.map(fp32.cpu_latency_s) / table.cpu_latency_s
    table["gpu_speedup"] = table.model.map(fp32.gpu_latency_s) / table.gpu_latency_s
    table["accuracy_drop"] = table.model.map(fp32.test_accuracy) - table.test_accuracy
    return table


def chart_metrics(table: pd.DataFrame) -> list[str]:
    """The table's columns worth a chart: file size and CPU speed-up against fp32, accuracy, and the GPU
    speed-up when the run measured one (on a CPU-only machine that chart would be empty)."""
    metrics = ["size_vs_fp32", "cpu_speedup", "test_accuracy"]
    return metrics + (["gpu_speedup"] if table.gpu_speedup.notna().any() else [])


def table_view(table: pd.DataFrame) -> pd.DataFrame:
    """`compare`'s table as a learner reads it: sizes in MiB, latencies in ms, accuracy in %, one short line on
    why a method did not run; GPU columns only when a GPU was measured."""
    view = pd.DataFrame({
        "model": table.model, "method": table.method,
        "file (MiB)": (table.model_size_bytes / 2**20).round(2), "file vs fp32": table.size_vs_fp32.map(_percent),
        f"CPU (ms, batch {int(table.cpu_batch.max())})": (table.cpu_latency_s * 1e3).round(1),
        "CPU speed-up": table.cpu_speedup.round(2),
        "threads": table.threads})
    if table.gpu_latency_s.notna().any():
        view[f"GPU (ms, batch {LATENCY_BATCH})"] = (table.gpu_latency_s * 1e3).round(2)
        view["GPU speed-up"] = table.gpu_speedup.round(2)
    view["accuracy (%)"] = (table.test_accuracy * 100).round(1)
    view["points lost"] = (table.accuracy_drop * 100).round(1)
    view["not run because"] = table.reason.map(lambda r: "" if not isinstance(r, str) else r.split(";")[0])
    return view


def _percent(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.0%}"


def _row(table: pd.DataFrame, model: str, method: str) -> pd.Series:
    return table[(table.model == model) & (table.method == method)].iloc[0]


def _noise(table: pd.DataFrame, model: str) -> float:
    images = min(profile().test_size, EVAL_IMAGES)
    return measure.accuracy_noise(_row(table, model, "fp32").test_accuracy, images)


@worded
def compare_finding(table: pd.DataFrame) -> str:
    """Per model: the smallest file, the fastest on the CPU, and which methods kept accuracy within noise."""
    lines = []
    for name in table.model.unique():
        rows = table[(table.model == name) & table.ran]
        smallest = rows.loc[rows.model_size_bytes.idxmin()]
        fastest = rows.loc[rows.cpu_latency_s.idxmin()]
        noise = _noise(table, name)
        kept = [m for m, drop in zip(rows.method, rows.accuracy_drop, strict=True) if drop <= noise and m != "fp32"]
        skipped = table[(table.model == name) & ~table.ran].method.tolist()
        lines.append(
            f"{name}: smallest file {smallest.method} ({smallest.size_vs_fp32:.0%} of fp32, "
            f"{mib(smallest.model_size_bytes)}); fastest on this CPU ({int(fastest.threads)} threads) "
            f"{fastest.method} ({fastest.cpu_speedup:.2f}x fp32's speed); within the test noise of fp32's accuracy "
            f"({noise * 100:.1f} points): {', '.join(kept) or 'none'}"
            + (f"; not run here: {', '.join(skipped)}" if skipped else ""))
    return wrap("\n".join(lines))


@worded
def api_finding(table: pd.DataFrame, model: str = VIT) -> str:
    """torch.ao's ``quantize_dynamic`` against torchao's ``quantize_`` (int8 dynamic both), from the run."""
    old, new = _row(table, model, "int8_dynamic"), _row(table, model, "int8_dynamic_torchao")
    if not (old.ran and new.ran):
        return f"Only one of the two APIs ran here ({'torch.ao' if old.ran else 'torchao'}): {new.reason or old.reason}."
    faster = "torch.ao's quantize_dynamic" if old.cpu_latency_s < new.cpu_latency_s else "torchao's quantize_"
    ratio = max(old.cpu_latency_s, new.cpu_latency_s) / min(old.cpu_latency_s, new.cpu_latency_s)
    text = (f"On this CPU ({int(old.threads)} threads, batch {int(old.cpu_batch)}), {model} int8 dynamic took "
            f"{old.cpu_latency_s * 1e3:.1f} ms with torch.ao's quantize_dynamic and {new.cpu_latency_s * 1e3:.1f} ms with "
            f"torchao's quantize_ (fp32: {_row(table, model, 'fp32').cpu_latency_s * 1e3:.1f} ms): {faster} was "
            f"{ratio:.2f}x faster. Files: {mib(old.model_size_bytes)} and {mib(new.model_size_bytes)}.")
    if not math.isnan(new.gpu_latency_s):
        text += (f" On the GPU (torchao only; torch.ao's int8 kernels are CPU-only): {new.gpu_latency_s * 1e3:.2f} ms "
                 f"against fp32's {_row(table, model, 'fp32').gpu_latency_s * 1e3:.2f} ms.")
    return wrap(text)


@worded
def size_finding(table: pd.DataFrame, cnn: str | None = None) -> str:
    """The seeds' puzzle: int8 dynamic shrinks the ViT's file to about a quarter and the CNN's barely."""
    cnn = cnn or next(m for m in table.model.unique() if m != VIT)
    vit, conv = _row(table, VIT, "int8_dynamic"), _row(table, cnn, "int8_dynamic")
    static = _row(table, cnn, "int8_static")
    text = (f"int8 dynamic: {VIT}'s file went to {vit.size_vs_fp32:.0%} of fp32 ({vit.linear_share:.0%} of its "
            f"parameters are in Linear layers), {cnn}'s to {conv.size_vs_fp32:.0%} (only {conv.linear_share:.1%} are: "
            "its convolutions stayed float32).")
    if static.ran:
        text += f" Static int8, which quantizes convolutions too, took {cnn} to {static.size_vs_fp32:.0%}."
    return wrap(text)


@worded
def fp16_finding(table: pd.DataFrame, model: str = VIT) -> str:
    """fp16 "fastest"? Only where the hardware computes in fp16: the CPU's numbers, and the GPU's if there is one."""
    fp16, bf16 = _row(table, model, "fp16"), _row(table, model, "bf16")
    native = cpu_fp16_native()
    has = {True: "has", False: "has no", None: "may or may not have"}[native]
    text = (f"On this CPU, which {has} fp16 arithmetic (AVX512-FP16/AMX-FP16), {model} in fp16 ran at "
            f"{fp16.cpu_speedup:.2f}x fp32's speed and in bf16 at {bf16.cpu_speedup:.2f}x; both halve the file.")
    if not math.isnan(fp16.gpu_speedup):
        text += f" On the GPU: fp16 {fp16.gpu_speedup:.2f}x, bf16 {bf16.gpu_speedup:.2f}x fp32's speed."
    return wrap(text)


# --- 3. the puzzles ------------------------------------------------------------------------------


@dataclass
class Stacking:
    """fp16 then int8 dynamic: the sizes, and what happened when the result ran."""

    fp32_bytes: int
    fp16_bytes: int
    int8_bytes: int
    int8_from_fp16_bytes: int
    fp16_input_error: str | None
    fp32_input_error: str | None

    def __str__(self) -> str:
        ran = {None: "ran"}
        return wrap(
            f"fp32 {mib(self.fp32_bytes)}, fp16 {mib(self.fp16_bytes)}, int8 dynamic {mib(self.int8_bytes)}; int8 "
            f"dynamic applied to the fp16 model: {mib(self.int8_from_fp16_bytes)}, and in a forward with fp16 inputs it "
            f"{ran.get(self.fp16_input_error, 'failed: ' + str(self.fp16_input_error))}, with fp32 inputs it "
            f"{ran.get(self.fp32_input_error, 'failed: ' + str(self.fp32_input_error))}.")


def _forward_error(model: nn.Module, x: torch.Tensor) -> str | None:
    try:
        with torch.no_grad():
            model(x)
    except (RuntimeError, TypeError) as exc:
        return str(exc).split("\n")[0]
    return None


def stacking(cfg: RunConfig) -> Stacking:
    """Cast the fine-tuned model to fp16, then apply int8 dynamic quantization, and run it."""
    model, _ = fine_tuned(cfg, progress=False)
    model = copy.deepcopy(model).cpu().eval()
    x = example_batch(cfg, 8, device=torch.device("cpu"))
    half = copy.deepcopy(model).half()
    both = quantization.quantize(half, "int8_dynamic")
    return Stacking(measure.model_size_bytes(model), measure.model_size_bytes(half),
                    measure.model_size_bytes(quantization.quantize(model, "int8_dynamic")),
                    measure.model_size_bytes(both), _forward_error(both, x.half()), _forward_error(both, x))


SIMULATED_BITS = (4, 3)  # simulated weight widths of the sensitivity study: where rounding starts to hurt
SIMULATED_CHOICES = {"all rounded": (), "first float": ("stem",), "last float": ("head",),
                     "first+last float": ("stem", "head")}


def sensitivity(cfg: RunConfig, num_calibration: int = CALIBRATION_BATCHES,
                bits: tuple[int, ...] = SIMULATED_BITS, refresh: bool = False) -> pd.DataFrame:
    """Which layers are sensitive, on the validation split (measured once, then read from the cache).

    Two studies, one frame: static int8 (real kernels) with everything quantized and with the first, last and
    LayerNorm layers kept in float (`KEEP_FLOAT_CHOICES`); and each width in ``bits`` simulated on the weights
    (`fake_quantize_weights`, per tensor) with the first and last layers kept in float or not.

    Returns:
        ``study``, ``choice``, ``label`` (the choice, with the bit width for simulated rows), ``keep_float``,
        ``val_accuracy``, ``accuracy_drop`` (validation points below fp32),
        and for the int8 rows ``model_size_bytes`` and ``cpu_latency_s``. The fp32 model is the first row.
    """
    frame = results.cached_frame("quant-sensitivity", [cfg], lambda: _measure_sensitivity(cfg, num_calibration, bits),
                                 refresh=refresh, num_calibration=num_calibration, bits=list(bits))
    for column in ("model_size_bytes", "cpu_latency_s"):
        frame[column] = pd.to_numeric(frame[column])
    return frame


def _measure_sensitivity(cfg: RunConfig, num_calibration: int, bits: tuple[int, ...]) -> pd.DataFrame:
    model, _ = fine_tuned(cfg, progress=False)
    model = copy.deepcopy(model).cpu().eval()
    names = dict(model.named_modules())
    calibration = calibration_batches(cfg, num_calibration)
    variants = {("fp32", "fp32 (reference)"): ((), model)}
    for choice, keep in KEEP_FLOAT_CHOICES.items():
        if "LayerNorm" in keep and not any(isinstance(m, nn.LayerNorm) for m in model.modules()):
            continue  # a CNN has none: the choice would repeat another
        keep = tuple(k for k in keep if k == "LayerNorm" or k in names)
        variants[("int8 static", choice)] = (keep, quantization.quantize(model, "int8_static", calibration,
                                                                         keep_float=keep))
    x = example_batch(cfg, LATENCY_BATCH, device=torch.device("cpu"))
    times = dict(zip(variants, latencies([m for _, m in variants.values()], x), strict=True))
    for width in bits:
        for choice, keep in SIMULATED_CHOICES.items():
            keep = tuple(k for k in keep if k in names)
            variants[(f"{width}-bit weights (simulated)", choice)] = (
                keep, quantization.fake_quantize_weights(model, width, keep_float=keep))
    rows = []
    for (study, choice), (keep, m) in variants.items():
        label = f"{study.split()[0]} {choice}" if "simulated" in study else choice  # e.g. "3-bit first float"
        row = {"study": study, "choice": choice, "label": label, "keep_float": ", ".join(keep) or "-",
               "val_accuracy": accuracy(m, cfg, "val")}
        if (study, choice) in times:
            row.update(model_size_bytes=measure.model_size_bytes(m), cpu_latency_s=times[(study, choice)])
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["accuracy_drop"] = frame.val_accuracy.iloc[0] - frame.val_accuracy
    return frame


def _signed_points(difference: float) -> str:
    """+1.2 points; never "-0.0" for a difference that rounds to zero."""
    value = round(difference * 100, 1)
    return f"{value + 0.0:+.1f} points"


@worded
def sensitivity_finding(frame: pd.DataFrame, cfg: RunConfig) -> str:
    """Per study: how much accuracy quantizing everything lost, and how much each choice of float layers won back."""
    fp32 = frame.val_accuracy.iloc[0]
    noise = measure.accuracy_noise(fp32, profile().val_size)
    lines = [f"Validation accuracy of fp32: {fp32:.1%}; two runs differ by chance by up to about {noise * 100:.1f} points."]
    for study, rows in frame.iloc[1:].groupby("study", sort=False):
        rows = rows.set_index("choice")
        everything = rows.accuracy_drop.iloc[0]
        best = rows.accuracy_drop.idxmin()
        text = (f"{study}: " + "; ".join(f"{c} {r.val_accuracy:.1%}" for c, r in rows.iterrows()) + ". ")
        if everything <= noise:
            text += (f"Quantizing everything changed accuracy by {_signed_points(-everything)}, within the noise: "
                     "nothing to win back.")
        else:
            won = everything - rows.accuracy_drop[best]
            text += (f"Quantizing everything cost {everything * 100:.1f} points; {best} won back {won * 100:.1f} of them"
                     + (" (within the noise)." if won <= noise else "."))
        lines.append(text)
    return wrap("\n".join(lines))


def qat_vs_ptq(cfg: RunConfig, steps: int | None = None, num_calibration: int = CALIBRATION_BATCHES,
               progress: bool = False, refresh: bool = False) -> pd.DataFrame:
    """Three recipes from the same fine-tuned model: static int8 at once (PTQ); ``steps`` more float steps, then
    PTQ; ``steps`` quantization-aware steps, then int8 (the seed's recipe). Columns: ``recipe``, ``extra_steps``,
    ``extra_train_time_s``, ``step_time_s``, ``quantize_s`` (calibration and conversion, or conversion),
    ``float_accuracy`` (before int8), ``test_accuracy`` (int8), ``accuracy_drop`` (below the fine-tuned fp32 model).
    Measured once, then read from the cache (``refresh=True`` trains and measures again)."""
    steps = extra_steps(steps)
    frame = results.cached_frame("quant-qat", [cfg], lambda: _measure_qat_vs_ptq(cfg, steps, num_calibration, progress),
                                 refresh=refresh, steps=steps, num_calibration=num_calibration)
    frame["step_time_s"] = pd.to_numeric(frame.step_time_s)
    return frame


def _measure_qat_vs_ptq(cfg: RunConfig, steps: int, num_calibration: int, progress: bool) -> pd.DataFrame:
    model, base = fine_tuned(cfg, progress=progress)
    calibration = calibration_batches(cfg, num_calibration)

    def ptq(trained: nn.Module) -> tuple[nn.Module, float]:
        start = time.perf_counter()
        return quantization.quantize(trained, "int8_static", calibration), time.perf_counter() - start

    at_once, at_once_s = ptq(model)
    longer = copy.deepcopy(model)
    run = train.fit(_continue(cfg, steps), model=longer, progress=progress)
    longer_int8, longer_s = ptq(longer)
    qat, qat_run = qat_model(cfg, steps, progress=progress)
    rows = [
        {"recipe": "fine-tune, then int8 (PTQ)", "extra_steps": 0, "extra_train_time_s": 0.0, "step_time_s": math.nan,
         "quantize_s": at_once_s, "float_accuracy": base.accuracy, "test_accuracy": accuracy(at_once, cfg, "test")},
        {"recipe": f"+{steps} float steps, then int8 (PTQ)", "extra_steps": steps, "extra_train_time_s": run.train_time_s,
         "step_time_s": run.step_time_s, "quantize_s": longer_s, "float_accuracy": run.accuracy,
         "test_accuracy": accuracy(longer_int8, cfg, "test")},
        {"recipe": f"+{steps} QAT steps, then int8", "extra_steps": steps, "extra_train_time_s": qat_run.train_time_s,
         "step_time_s": qat_run.step_time_s, "quantize_s": _qat_convert_s(cfg, steps),
         "float_accuracy": qat_run.accuracy, "test_accuracy": accuracy(qat, cfg, "test")},
    ]
    frame = pd.DataFrame(rows)
    frame["accuracy_drop"] = base.accuracy - frame.test_accuracy
    return frame


@worded
def qat_finding(frame: pd.DataFrame) -> str:
    """Did QAT beat PTQ, and did it beat as many more float steps? Against the test noise; at what cost."""
    ptq, longer, qat = (frame.iloc[i] for i in range(3))
    noise = measure.accuracy_noise(ptq.test_accuracy, profile().test_size)
    def verdict(a, b):
        gap = a.test_accuracy - b.test_accuracy
        return f"{gap * 100:+.1f} points" + (", within the noise" if abs(gap) <= noise else "")
    return wrap(
        f"int8 test accuracy: PTQ at once {ptq.test_accuracy:.1%}, after {int(longer.extra_steps)} more float steps "
        f"{longer.test_accuracy:.1%}, after as many QAT steps {qat.test_accuracy:.1%}. QAT against PTQ at once: "
        f"{verdict(qat, ptq)}; against the same number of float steps: {verdict(qat, longer)} (the noise is "
        f"about {noise * 100:.1f} points). A QAT step took {qat.step_time_s / longer.step_time_s:.2f}x a float step "
        f"({qat.step_time_s * 1e3:.0f} ms against {longer.step_time_s * 1e3:.0f} ms): fake quantization adds work "
        "to every forward and backward.")


def own_size_numbers(table: pd.DataFrame, model: str) -> dict:
    """The numbers of exercise 06.own_size from the learner's table: ``model``'s Linear share and int8 dynamic size."""
    row = _row(table, model, "int8_dynamic")
    return {"model": model, "linear_share_pct": round(float(row.linear_share) * 100, 2),
            "measured_pct": round(float(row.size_vs_fp32) * 100, 1)}


# --- 4. the panel ---------------------------------------------------------------------------------


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
        return wrap(f"{self.model} {self.method}: file {mib(self.model_size_bytes)} ({self.model_size_bytes / self.fp32_size_bytes:.0%} "
                    f"of fp32), CPU latency {self.cpu_latency_s * 1e3:.3g} ms ({self.fp32_cpu_latency_s / self.cpu_latency_s:.2f}x "
                    f"fp32's speed, {self.threads} threads), test accuracy {self.test_accuracy:.1%} (fp32 "
                    f"{self.fp32_test_accuracy:.1%})")


def panel_run(cfg: RunConfig, model: str = VIT, method: str = "int8_dynamic", calibration: int = CALIBRATION_BATCHES,
              on_step=None, progress: bool = False) -> QuantRun:
    """Quantize the fine-tuned ``model`` (a key of `workloads`; ``cfg`` gives the seed) by ``method`` (one of
    `TABLE_METHODS`, ``calibration`` batches for static int8) on the CPU and measure it against its fp32 self:
    file size, CPU latency at batch 64, test accuracy."""
    choices = workloads()
    if model not in choices:
        raise ConfigError("model", model, f"one of {list(choices)}")
    if method not in TABLE_METHODS:
        raise ConfigError("method", method, f"one of {list(TABLE_METHODS)}")
    if not is_int(calibration) or calibration < 1:
        raise ConfigError("calibration", calibration, "a positive integer (calibration batches)")
    cfg = choices[model].replace(seed=cfg.seed)
    model, result = fine_tuned(cfg, progress=progress)
    model = copy.deepcopy(model).cpu().eval()
    built = _build(model, method, cfg, calibration_batches(cfg, calibration))
    if built.model is None:
        raise ConfigError("method", method, f"a method that runs on this machine's CPU: {built.reason}")
    x = example_batch(cfg, LATENCY_BATCH, device=torch.device("cpu"))
    fp32_s, quant_s = latencies([model, built.model], x)
    return QuantRun(config=cfg.to_dict(), model=cfg.model, method=method, calibration_batches=calibration,
                    model_size_bytes=measure.model_size_bytes(built.model), fp32_size_bytes=measure.model_size_bytes(model),
                    cpu_latency_s=quant_s, fp32_cpu_latency_s=fp32_s, test_accuracy=accuracy(built.model, cfg, "test"),
                    fp32_test_accuracy=accuracy(model, cfg, "test"), threads=torch.get_num_threads(),
                    warnings=list(result.warnings))



def panel_estimate(cfg: RunConfig) -> str:
    """The panel's time line (the fine-tunes are cached after the notebook's first run)."""
    return ("Estimated time: a few seconds once both fine-tunes are cached (the notebook's first run does that); "
            f"int8_qat fine-tunes {extra_steps()} more steps first, fp16 on a CPU without fp16 arithmetic is slow.")

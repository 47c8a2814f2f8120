"""Notebook 04 (pruning): its experiments and the findings worded from their live numbers.

- `fine_tuned`: the notebook's fine-tuned model (trained once, then from the cache).
- `puzzle`, `puzzle_finding`: the seeds' puzzle live: magnitude pruning at 20-80 % leaves the file size,
  the inference memory and the latency where they were (zeros are stored and multiplied densely), and the
  masks make the checkpoint grow.
- `sparse_storage`, `storage_finding`: the largest weight in COO and CSR against dense, in bytes and in
  matmul time, over sparsities: where sparse storage starts paying. `semi_structured`: 2:4 sparsity.
- `sensitivity_scan`, `choose_ratios`, `compare_ratios`: each layer pruned alone, accuracy on the
  validation split; per-layer ratios chosen from it against one uniform ratio.
- `structured`, `structured_finding`: channels removed and the layers rebuilt (a smaller dense model):
  parameters, FLOPs, size, latency, accuracy before and after a recovery fine-tune.
- `seed_repeats`, `rise_finding`: "accuracy rose after pruning", repeated over seeds, with its spread.
- `panel_run`, `panel_estimate`: what the notebook's panel runs.

The mechanisms are in `labkit.techniques.pruning`.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
from torch import nn

from ... import data, measure, results, train
from ...config import RunConfig
from ...env import Profile, env_report, profile, resolve_device
from ...errors import ConfigError
from ...inference import LATENCY_BATCH, LATENCY_ROUNDS, _splits, accuracy, example_batch, latencies  # noqa: F401 (04 uses them)
from ...messages import worded, wrap
from ...techniques import pruning
from ...units import change, mib
from ...validate import is_int

PUZZLE_AMOUNTS = (0.0, 0.2, 0.4, 0.6, 0.8)  # the seeds' range
SCAN_SPARSITIES = (0.3, 0.5, 0.7, 0.9)
STORAGE_SPARSITIES = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
METHODS = ("unstructured", "structured")
# A latency within this factor of the dense model's is "unchanged": CPU timings of the same work differ
# by several percent from one measurement to the next.
TIMING_NOISE = 0.10


def _points(difference: float, sign: bool = False, digits: int = 1) -> str:
    """An accuracy difference in percentage points: 0.012 -> "1.2 points"."""
    return f"{difference * 100:{'+' if sign else ''}.{digits}f} points"


def fine_tuned(cfg: RunConfig, progress: bool = True) -> tuple[nn.Module, object]:
    """The model ``cfg`` fine-tunes, and its `RunResult`: trained once, then read from the cache.

    Example:
        >>> model, result = fine_tuned(labkit.config.baseline())
    """
    return results.cached_model(cfg, progress=progress)


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward of ``x`` (matmuls and convolutions), as `labkit.measure.count_flops` counts them."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        flops = measure.count_flops(lambda: model(x))
    model.train(was_training)
    return flops


def _nonzero_params(model: nn.Module) -> int:
    return sum(int((p.detach() != 0).sum()) for p in model.parameters())


def per_layer_sparsity(model: nn.Module, amount: float = 0.8) -> pd.DataFrame:
    """Each prunable layer's share of zeros after layer-wise and after global pruning at ``amount`` (copies of the
    model are pruned): ``layer``, ``weights``, ``layer_scope``, ``global_scope``."""
    amount = pruning.check_amount(amount)
    scopes = {scope: pruning.sparsity(pruning.l1_unstructured(copy.deepcopy(model), amount, scope=scope))
              for scope in pruning.SCOPES}
    return pd.DataFrame([{"layer": name, "weights": m.weight.numel(), "layer_scope": scopes["layer"].per_layer[name],
                          "global_scope": scopes["global"].per_layer[name]}
                         for name, m in pruning.prunable_layers(model)])


# --- 1. the puzzle ---------------------------------------------------------------------------------


def puzzle(cfg: RunConfig, amounts: Iterable[float] = PUZZLE_AMOUNTS, scope: str = "global") -> pd.DataFrame:
    """The fine-tuned model pruned by magnitude at each amount: what moved and what did not.

    Rows: ``amount``, ``sparsity`` (zeros among the prunable weights), ``nonzero_params``,
    ``model_size_bytes`` (the saved state_dict after ``prune.remove``), ``size_with_masks_bytes`` (saved with
    the masks still attached), ``inference_peak_bytes`` (parameters plus the forward's peak, batch 64),
    ``latency_s`` (median, batch 64, on the run's device), ``val_accuracy``, ``test_accuracy``, and each
    ratio to the unpruned row (``size_ratio``, ``peak_ratio``, ``latency_ratio``).

    Example:
        >>> frame = puzzle(cfg)
        >>> frame[["amount", "model_size_bytes", "latency_s", "test_accuracy"]]
    """
    amounts = [pruning.check_amount(a) for a in amounts]
    if not amounts:
        raise ConfigError("amounts", amounts, "a non-empty list of fractions in [0, 1)")
    if 0.0 not in amounts:
        amounts = [0.0, *amounts]  # the reference every ratio is relative to
    model, _ = fine_tuned(cfg)
    prof = profile()
    x = example_batch(cfg)
    rows, pruned_models = [], []
    for amount in amounts:
        pruned = pruning.l1_unstructured(copy.deepcopy(model), amount, scope=scope, permanent=False)
        with_masks_bytes = measure.model_size_bytes(pruned)
        with_masks_peak = measure.inference_peak_bytes(pruned, x)
        pruning.make_permanent(pruned)
        rows.append({
            "amount": amount, "sparsity": pruning.sparsity(pruned).overall, "nonzero_params": _nonzero_params(pruned),
            "num_params": measure.count_parameters(pruned)[0],
            "model_size_bytes": measure.model_size_bytes(pruned), "size_with_masks_bytes": with_masks_bytes,
            "inference_peak_bytes": measure.inference_peak_bytes(pruned, x), "peak_with_masks_bytes": with_masks_peak,
            "val_accuracy": accuracy(pruned, cfg, "val"), "test_accuracy": accuracy(pruned, cfg, "test"),
        })
        pruned_models.append(pruned)
    frame = pd.DataFrame(rows)
    frame["latency_s"] = latencies(pruned_models, x, prof)
    base = frame[frame.amount == 0].iloc[0]
    for column, name in (("model_size_bytes", "size_ratio"), ("inference_peak_bytes", "peak_ratio"),
                         ("latency_s", "latency_ratio")):
        frame[name] = frame[column] / base[column]
    frame["masks_size_ratio"] = frame.size_with_masks_bytes / base.model_size_bytes
    return frame


@worded
def puzzle_finding(frame: pd.DataFrame) -> str:
    """The puzzle's numbers in words: what pruning moved (accuracy) and what it did not (size, memory, speed)."""
    base = frame[frame.amount == 0].iloc[0]
    top = frame.sort_values("amount").iloc[-1]
    latency_steady = frame.latency_ratio.sub(1).abs().max() <= TIMING_NOISE
    text = (f"Pruned to {top.sparsity:.0%} zeros, the saved model is {mib(top.model_size_bytes)} against "
            f"{mib(base.model_size_bytes)} dense ({change(top.size_ratio)}), and one forward of a batch of "
            f"{LATENCY_BATCH} peaks at {mib(top.inference_peak_bytes)} against {mib(base.inference_peak_bytes)} "
            f"({change(top.peak_ratio)}): the zeros are stored like any other number. ")
    if latency_steady:
        text += (f"Latency stayed within {TIMING_NOISE:.0%} of the dense model's at every amount "
                 f"({frame.latency_ratio.min():.2f}x to {frame.latency_ratio.max():.2f}x): a dense kernel multiplies "
                 "a zero as fast as any other number. ")
    else:
        text += (f"Latency ranged from {frame.latency_ratio.min():.2f}x to {frame.latency_ratio.max():.2f}x the dense "
                 f"model's, more than this machine's usual timing noise ({TIMING_NOISE:.0%}); dense kernels do not "
                 "skip zeros, so look for another cause (other load on the machine, CPU frequency changes) and rerun. ")
    text += (f"With the masks still attached (before prune.remove) the file is {mib(top.size_with_masks_bytes)}, "
             f"{top.masks_size_ratio:.2f}x the dense one: weight_orig and weight_mask are both saved. ")
    best = frame.loc[frame.test_accuracy.idxmax()]
    text += f"Test accuracy went from {base.test_accuracy:.1%} unpruned to {top.test_accuracy:.1%} at {top.amount:.0%}"
    if best.amount > 0 and best.test_accuracy > base.test_accuracy:
        text += (f", and was highest, {best.test_accuracy:.1%}, at {best.amount:.0%}: a rise, which section 6 tests "
                 "for being more than noise.")
    else:
        text += "; no amount scored above the unpruned model."
    return text


# --- 2. sparse storage and 2:4 ------------------------------------------------------------------------


def largest_layer(model: nn.Module) -> str:
    """The prunable layer with the most weights (where storage format matters most)."""
    return max(pruning.prunable_layers(model), key=lambda item: item[1].weight.numel())[0]


def sparse_storage(cfg: RunConfig, sparsities: Iterable[float] = STORAGE_SPARSITIES, layer: str | None = None,
                   batch_size: int = LATENCY_BATCH) -> pd.DataFrame:
    """The largest weight of the fine-tuned model, pruned to each sparsity and stored dense, as COO and as CSR.

    Rows: ``sparsity``, ``dense_bytes``, ``coo_bytes``, ``csr_bytes`` (each serialised with ``torch.save``),
    and the matmul of the weight (as a matrix, outputs x inputs) with ``batch_size`` x 16 input columns (the
    shape a conv's im2col product has at 4x4 pixels) on the CPU: ``dense_matmul_s``, ``csr_matmul_s``.

    Example:
        >>> sparse_storage(cfg)[["sparsity", "dense_bytes", "coo_bytes", "csr_bytes"]]
    """
    model, _ = fine_tuned(cfg)
    name = layer or largest_layer(model)
    layers = dict(pruning.prunable_layers(model))
    if name not in layers:
        raise ConfigError("layer", name, f"a prunable layer ({', '.join(layers)})")
    weight = layers[name].weight.detach().cpu()
    matrix_inputs = torch.randn(weight[0].numel(), batch_size * 16)
    prof = profile()
    rows = []
    for s in sparsities:
        s = pruning.check_amount(s, "sparsities")
        layer_copy = nn.Linear(1, 1)  # a holder for torch's own L1 rule on this weight
        layer_copy.weight = nn.Parameter(weight.clone())
        pruning.prune.l1_unstructured(layer_copy, "weight", amount=s)
        w = layer_copy.weight.detach()
        dense, csr = w.reshape(w.shape[0], -1).contiguous(), pruning.to_csr(w)
        dense_s, csr_s = _in_turns([lambda d=dense: d @ matrix_inputs, lambda c=csr: c @ matrix_inputs], prof)
        rows.append({"layer": name, "weight_shape": "x".join(map(str, weight.shape)), "sparsity": s,
                     "measured_sparsity": float((w == 0).float().mean()),
                     **{f"{layout}_bytes": pruning.sparse_bytes(w, layout) for layout in pruning.LAYOUTS},
                     **{f"{layout}_file_bytes": pruning.sparse_bytes(w, layout, saved=True) for layout in pruning.LAYOUTS},
                     "dense_matmul_s": dense_s, "csr_matmul_s": csr_s})
    return pd.DataFrame(rows)


def _in_turns(calls: list, prof: Profile) -> list[float]:
    """Median time of each CPU call, timed in turns (one call of each, round after round), warm-up excluded."""
    for call in calls:
        call()
    times: list[list[float]] = [[] for _ in calls]
    # A quarter of the profile's repeats, at least 5: at `full` the matrix is a ResNet's largest conv (2.4M weights),
    # and a dense CPU product of it takes a good fraction of a second.
    for _ in range(max(5, prof.repeats // 4)):
        for call, collected in zip(calls, times, strict=True):
            start = time.perf_counter()
            call()
            collected.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def break_even(frame: pd.DataFrame, column: str) -> float | None:
    """The lowest measured sparsity at which ``column`` (``coo_bytes``, ``csr_bytes``, ``csr_matmul_s``) beats dense."""
    dense = "dense_matmul_s" if column.endswith("_s") else "dense_bytes"
    if column.endswith("_file_bytes"):
        dense = "dense_file_bytes"
    wins = frame[frame[column] < frame[dense]]
    return float(wins.sparsity.min()) if len(wins) else None


def storage_numbers(frame: pd.DataFrame) -> dict:
    """The break-even sparsities a format's bytes per nonzero predict for the weight in ``frame`` (float32): COO
    keeps a 4-byte value and one 8-byte index per dimension for each nonzero, CSR (as a matrix) a value and an
    8-byte column index (plus one row pointer per row, which this leaves out)."""
    ndim = len(str(frame.weight_shape.iloc[0]).split("x"))
    return {"coo_predicted": 1 - 4 / (4 + 8 * ndim), "csr_predicted": 1 - 4 / (4 + 8), "ndim": ndim}


@worded
def storage_finding(frame: pd.DataFrame) -> str:
    """When sparse storage paid for this weight, measured, against what the bytes per nonzero predict."""
    predicted = storage_numbers(frame)
    parts = []
    for fmt, column in (("COO", "coo_bytes"), ("CSR", "csr_bytes")):
        measured, saved = break_even(frame, column), break_even(frame, column.replace("_bytes", "_file_bytes"))
        parts.append(f"in memory {fmt} took fewer bytes than dense from {measured:.0%} zeros on" if measured is not None
                     else f"in memory {fmt} never took fewer bytes than dense up to {frame.sparsity.max():.0%} zeros")
        parts[-1] += f" (its bytes per nonzero predict {predicted[f'{fmt.lower()}_predicted']:.0%}), saved with torch.save "
        parts[-1] += f"from {saved:.0%} on" if saved is not None else "never"
    speed = break_even(frame, "csr_matmul_s")
    top = frame.sort_values("sparsity").iloc[-1]
    layer = frame.layer.iloc[0]
    text = f"For {layer} ({frame.weight_shape.iloc[0]}): " + "; ".join(parts) + ". "
    if speed is None:
        text += (f"The CSR matmul was never faster than the dense one here, not even at {top.sparsity:.0%} zeros "
                 f"({top.csr_matmul_s / top.dense_matmul_s:.2f}x its time).")
    else:
        text += (f"The CSR matmul beat the dense one from {speed:.0%} zeros on ({top.csr_matmul_s / top.dense_matmul_s:.2f}x "
                 f"its time at {top.sparsity:.0%}); below that, the dense kernel's regular memory access wins.")
    return text


def storage_long(frame: pd.DataFrame, what: str = "bytes") -> pd.DataFrame:
    """`sparse_storage`'s frame with one row per layout, for one line per layout: ``what`` is ``bytes`` (in memory:
    dense, COO, CSR) or ``time`` (the matmul: dense, CSR)."""
    if what not in ("bytes", "time"):
        raise ConfigError("what", what, "'bytes' (storage in memory) or 'time' (matmul time)")
    layouts = pruning.LAYOUTS if what == "bytes" else ("dense", "csr")
    column = "weight_bytes" if what == "bytes" else "matmul_s"
    source = "{}_bytes" if what == "bytes" else "{}_matmul_s"
    return pd.DataFrame([{"sparsity": row.sparsity, "layout": layout, column: row[source.format(layout)]}
                         for _, row in frame.iterrows() for layout in layouts])


@dataclass
class SemiStructured:
    """2:4 sparsity on this machine: accuracy after the pattern is applied, and the GPU speed-up where it runs.

    Attributes:
        layers: the layers that got the 2:4 pattern. sparsity: zeros among all prunable weights.
        val_accuracy / test_accuracy: of the 2:4 model, without recovery; dense_test_accuracy: before.
        speedup: dense fp16 matmul time / 2:4 matmul time of a 4096x4096 Linear at batch 4096 (None where it
            cannot run). reason: why it did not run (None when it did).
    """

    layers: list
    sparsity: float
    val_accuracy: float
    test_accuracy: float
    dense_test_accuracy: float
    speedup: float | None = None
    reason: str | None = None

    def __str__(self) -> str:
        text = (f"2:4 pattern in {len(self.layers)} layers ({self.sparsity:.0%} of all prunable weights are zero): "
                f"test accuracy {self.dense_test_accuracy:.1%} -> {self.test_accuracy:.1%} without recovery. ")
        if self.speedup is not None:
            text += f"On this GPU a 4096x4096 fp16 Linear ran {self.speedup:.2f}x faster with 2:4 sparse weights."
        else:
            text += f"Speed not measured: {self.reason}."
        return wrap(text)


def semi_structured(cfg: RunConfig, size: int = 4096) -> SemiStructured:
    """Apply the 2:4 pattern to the fine-tuned model and, on an Ampere+ GPU, time a 2:4 Linear against a dense one."""
    model, _ = fine_tuned(cfg)
    dense_acc = accuracy(model, cfg, "test")
    sparse_model = copy.deepcopy(model)
    layers = pruning.apply_2to4(sparse_model)
    record = SemiStructured(layers, pruning.sparsity(sparse_model).overall, accuracy(sparse_model, cfg, "val"),
                            accuracy(sparse_model, cfg, "test"), dense_acc)
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        record.reason = ("2:4 kernels need a CUDA GPU of compute capability 8.0+ (sparse tensor cores); this run is on "
                         "the CPU, where the zeros are stored and multiplied densely like any others")
        return record
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 0):
        record.reason = (f"this GPU has compute capability {capability[0]}.{capability[1]}; 2:4 sparse tensor cores "
                         "need 8.0+ (A100, A10, L4, H100), a T4 or P100 has none")
        return record
    try:
        linear = nn.Linear(size, size, bias=False).half().to(device)
        with torch.no_grad():
            linear.weight.mul_(pruning.semi_structured_mask(linear.weight))
        x = torch.randn(size, size, dtype=torch.float16, device=device)
        dense_s = measure.measure_latency(linear, x, warmup=5, repeats=20).median_s
        pruning.to_semi_structured(linear)
        sparse_s = measure.measure_latency(linear, x, warmup=5, repeats=20).median_s
        record.speedup = dense_s / sparse_s
    except Exception as exc:  # noqa: BLE001 - a missing kernel (e.g. an older torch build): say so, keep the rest
        record.reason = f"torch's 2:4 kernels failed here ({type(exc).__name__}: {exc})"
    return record


# --- 3. sensitivity ----------------------------------------------------------------------------------


def sensitivity_scan(cfg: RunConfig, sparsities: Iterable[float] = SCAN_SPARSITIES) -> pd.DataFrame:
    """Each prunable layer pruned alone at each sparsity; accuracy on the validation split (never the test split).

    Rows: ``layer``, ``params`` (its weights), ``sparsity``, ``val_accuracy``, ``accuracy_drop`` (the unpruned
    model's validation accuracy minus this one's).

    Example:
        >>> scan = sensitivity_scan(cfg)
        >>> scan.pivot(index="layer", columns="sparsity", values="accuracy_drop")
    """
    sparsities = [pruning.check_amount(s, "sparsities") for s in sparsities]
    if not sparsities:
        raise ConfigError("sparsities", sparsities, "a non-empty list of fractions in [0, 1)")
    model, _ = fine_tuned(cfg)
    base = accuracy(model, cfg, "val")
    rows = []
    for name, module in pruning.prunable_layers(model):
        for s in sparsities:
            pruned = copy.deepcopy(model)
            pruning.l1_unstructured(pruned, {name: s})
            acc = accuracy(pruned, cfg, "val")
            rows.append({"layer": name, "params": module.weight.numel(), "sparsity": s, "val_accuracy": acc,
                         "accuracy_drop": base - acc, "base_val_accuracy": base})
    return pd.DataFrame(rows)


def choose_ratios(scan: pd.DataFrame, max_drop: float = 0.02) -> dict:
    """Per layer, the highest scanned sparsity whose validation accuracy fell by at most ``max_drop`` (0 if none)."""
    if not 0 <= max_drop < 1:
        raise ConfigError("max_drop", max_drop, "an accuracy drop in [0, 1), e.g. 0.02 for 2 points")
    chosen = {}
    for layer, rows in scan.groupby("layer", sort=False):
        ok = rows[rows.accuracy_drop <= max_drop]
        chosen[layer] = float(ok.sparsity.max()) if len(ok) else 0.0
    return chosen


def overall_sparsity(model: nn.Module, ratios: dict) -> float:
    """The share of all prunable weights that per-layer ``ratios`` remove."""
    layers = dict(pruning.prunable_layers(model))
    total = sum(m.weight.numel() for m in layers.values())
    return sum(round(r * layers[n].weight.numel()) for n, r in ratios.items()) / total


def compare_ratios(cfg: RunConfig, ratios: dict) -> pd.DataFrame:
    """Per-layer ratios against one uniform ratio (and global pruning) that remove the same share of weights.

    Rows: ``scheme`` (``per-layer (from the scan)``, ``uniform``, ``global``), ``sparsity``, ``val_accuracy``,
    ``test_accuracy``, plus the unpruned model's (``scheme="unpruned"``).
    """
    model, _ = fine_tuned(cfg)
    target = overall_sparsity(model, ratios)
    schemes = {"unpruned": lambda m: m, "per-layer (from the scan)": lambda m: pruning.l1_unstructured(m, ratios),
               "uniform": lambda m: pruning.l1_unstructured(m, target),
               "global": lambda m: pruning.l1_unstructured(m, target, scope="global")}
    rows = []
    for scheme, apply in schemes.items():
        pruned = apply(copy.deepcopy(model))
        rows.append({"scheme": scheme, "sparsity": pruning.sparsity(pruned).overall,
                     "val_accuracy": accuracy(pruned, cfg, "val"), "test_accuracy": accuracy(pruned, cfg, "test")})
    return pd.DataFrame(rows)


@worded
def ratios_finding(scan: pd.DataFrame, compared: pd.DataFrame, ratios: dict) -> str:
    """Which layers the scan found sensitive, and whether choosing ratios from it beat one uniform ratio."""
    top = scan[scan.sparsity == scan.sparsity.max()].sort_values("accuracy_drop")
    robust, fragile = top.iloc[0], top.iloc[-1]
    by = compared.set_index("scheme")
    per, uni = by.loc["per-layer (from the scan)"], by.loc["uniform"]
    text = (f"At {fragile.sparsity:.0%} sparsity alone, {fragile.layer} lost {_points(fragile.accuracy_drop)} of validation accuracy "
            f"and {robust.layer} {_points(robust.accuracy_drop)}: layers differ in how much they tolerate. Ratios chosen from the scan "
            f"remove {per.sparsity:.0%} of all weights; at that same sparsity, test accuracy was {per.test_accuracy:.1%} "
            f"with the chosen ratios, {uni.test_accuracy:.1%} with one uniform ratio and "
            f"{by.loc['global'].test_accuracy:.1%} with global pruning (unpruned: {by.loc['unpruned'].test_accuracy:.1%}). ")
    text += "Chosen: " + ", ".join(f"{layer} {r:.0%}" for layer, r in ratios.items()) + ". "
    noise = measure.accuracy_noise(per.test_accuracy, profile().test_size)
    diff = per.test_accuracy - uni.test_accuracy
    if abs(diff) <= noise:
        text += (f"The difference, {_points(diff, sign=True)}, is within the test split's noise (about {_points(noise)}): at this sparsity "
                 "the scan's choice did not measurably matter; it does at higher sparsity, where sensitive layers break.")
    elif diff > 0:
        text += f"The scan's choice was better by {_points(diff)}, more than the test split's noise (about {_points(noise)})."
    else:
        text += (f"The uniform ratio was better by {_points(-diff)} (noise about {_points(noise)}): layers pruned together "
                 "interact, which a one-layer-at-a-time scan cannot see.")
    glob = by.loc["global"].test_accuracy - per.test_accuracy
    if glob > noise:
        text += (f" Global pruning, which needs no scan, did better still, by {_points(glob)}: one threshold for all "
                 "layers takes more from layers whose weights are small, and the scan judged each layer alone.")
    return text


# --- 4. structured pruning ------------------------------------------------------------------------------


def _measure_model(model: nn.Module, cfg: RunConfig, x: torch.Tensor) -> dict:
    """Everything but latency (`latencies` times the models together)."""
    return {"num_params": measure.count_parameters(model)[0], "flops": forward_flops(model, x),
            "model_size_bytes": measure.model_size_bytes(model), "inference_peak_bytes": measure.inference_peak_bytes(model, x),
            "val_accuracy": accuracy(model, cfg, "val"), "test_accuracy": accuracy(model, cfg, "test")}


def recover(model: nn.Module, cfg: RunConfig, steps: int, progress: bool = False, on_step=None):
    """Fine-tune ``model`` (a pruned copy) in place for ``steps`` optimizer steps of ``cfg``; returns the `RunResult`."""
    if not is_int(steps) or steps < 1:
        raise ConfigError("recovery_steps", steps, "a positive number of fine-tuning steps")
    return train.fit(cfg.replace(max_steps=steps, epochs=1), model=model, progress=progress, on_step=on_step)


def default_recovery_steps(prof: Profile | None = None) -> int:
    """As many steps as the fine-tune itself had (the profile's), and always more than its untimed steps."""
    prof = prof or profile()
    return max(prof.max_steps, prof.warmup_steps + train.PROFILING_STEPS + 1)


RECALIBRATION_BATCHES = 8


def train_batches(cfg: RunConfig, count: int) -> list[torch.Tensor]:
    """The first ``count`` training batches of ``cfg`` (inputs only, on the run's device), e.g. to re-estimate
    BatchNorm statistics."""
    split = train.run_splits(cfg)["train"]
    device = resolve_device(cfg.device)
    loader = data.make_loader(split, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed, drop_last=True)
    batches = []
    for images, _ in loader:
        batches.append(data.to_model_input(images, split, device, cfg.channels_last, cfg.image_size))
        if len(batches) == count:
            break
    return batches


def structured(cfg: RunConfig, amount: float = 0.5, recovery_steps: int | None = None) -> pd.DataFrame:
    """Remove ``amount`` of the channels of every prunable conv of the fine-tuned model and measure before/after.

    Rows (``model``): ``dense``, ``pruned`` (no fine-tuning yet), ``pruned + BN re-estimated`` (BatchNorm
    statistics re-estimated from `RECALIBRATION_BATCHES` training batches, forward passes only) and ``pruned +
    recovery`` (after ``recovery_steps`` steps of ``cfg``, default `default_recovery_steps`); columns ``num_params``, ``flops``
    (one forward of a batch of 64), ``model_size_bytes``, ``inference_peak_bytes``, ``latency_s`` (run's device),
    ``cpu_latency_s``, ``val_accuracy``, ``test_accuracy`` and the ratios to the dense row.
    """
    amount = pruning.check_amount(amount)
    steps = default_recovery_steps() if recovery_steps is None else recovery_steps
    # Measured once, then read from the cache (notebook 09's summary reads it there too).
    return results.cached_frame("prune-structured", [cfg], lambda: _measure_structured(cfg, amount, steps),
                                amount=amount, recovery_steps=steps)


def _measure_structured(cfg: RunConfig, amount: float, steps: int) -> pd.DataFrame:
    model, _ = fine_tuned(cfg)
    prof = profile()
    x = example_batch(cfg)
    slim = pruning.prune_channels(model, amount, x[:2])
    before = copy.deepcopy(slim)
    recalibrated = pruning.recalibrate_batchnorm(copy.deepcopy(slim), train_batches(cfg, RECALIBRATION_BATCHES))
    rows = [{"model": "dense", **_measure_model(model, cfg, x)}, {"model": "pruned", **_measure_model(slim, cfg, x)},
            {"model": "pruned + BN re-estimated", **_measure_model(recalibrated, cfg, x)}]
    recover(slim, cfg, steps)
    rows.append({"model": "pruned + recovery", **_measure_model(slim, cfg, x)})
    frame = pd.DataFrame(rows)
    models_ = [model, before, recalibrated, slim]
    frame["latency_s"] = latencies(models_, x, prof)
    frame["cpu_latency_s"] = frame.latency_s if x.device.type == "cpu" else latencies(models_, x, prof, cpu=True)
    frame.insert(1, "amount", amount)
    frame["recovery_steps"] = [0, 0, 0, steps]
    dense = frame.iloc[0]
    for column in ("num_params", "flops", "model_size_bytes", "latency_s", "cpu_latency_s", "inference_peak_bytes"):
        frame[f"{column}_ratio"] = frame[column] / dense[column]
    return frame


@worded
def structured_finding(frame: pd.DataFrame) -> str:
    """What removing channels did, in words from `structured`'s frame."""
    by = frame.set_index("model")
    dense, pruned, rec = by.loc["dense"], by.loc["pruned"], by.loc["pruned + recovery"]
    recal = by.loc["pruned + BN re-estimated"]
    on_gpu = dense.latency_s != dense.cpu_latency_s
    text = (f"Removing {frame.amount.iloc[0]:.0%} of the channels of every prunable conv left a dense model with "
            f"{dense.num_params / pruned.num_params:.1f}x fewer parameters ({int(dense.num_params):,} -> "
            f"{int(pruned.num_params):,}), "
            f"{dense.flops / pruned.flops:.1f}x fewer FLOPs per forward, a {dense.model_size_bytes / pruned.model_size_bytes:.1f}x "
            f"smaller file and {dense.cpu_latency_s / pruned.cpu_latency_s:.1f}x lower CPU latency at batch {LATENCY_BATCH}")
    if on_gpu:
        text += f" ({dense.latency_s / pruned.latency_s:.1f}x on the GPU)"
    text += (". Parameters fall faster than the channels because a conv between two pruned layers loses both input and "
             "output channels. ")
    text += (f"Test accuracy: {dense.test_accuracy:.1%} dense, {pruned.test_accuracy:.1%} right after pruning, "
             f"{recal.test_accuracy:.1%} once the BatchNorm statistics were re-estimated ({RECALIBRATION_BATCHES} batches "
             f"of forward passes, no training), {rec.test_accuracy:.1%} after {int(rec.recovery_steps)} recovery steps")
    gap = dense.test_accuracy - rec.test_accuracy
    noise = measure.accuracy_noise(dense.test_accuracy, profile().test_size)
    if gap <= noise:
        text += f": back within the test split's noise (about {_points(noise)}) of the dense model."
    else:
        text += f": still {_points(gap)} below the dense model; more recovery steps, or a smaller amount, close the gap."
    return text


def flops_numbers(dense: nn.Module, slim: nn.Module, layer: str | None = None) -> dict:
    """The channel counts of conv ``layer`` before and after structured pruning, for exercise 04.own_flops.

    ``layer`` None takes the conv whose channels shrank most (in x out), the one that shows the effect best.
    """
    convs = [name for name, m in dense.named_modules() if isinstance(m, nn.Conv2d) and m.groups == 1]
    if layer is None:
        def kept(name):
            a, b = dense.get_submodule(name), slim.get_submodule(name)
            return (b.in_channels * b.out_channels) / (a.in_channels * a.out_channels)
        layer = min(convs, key=kept)
    elif layer not in convs:
        raise ConfigError("layer", layer, f"a conv of the model ({', '.join(convs)})")
    a, b = dense.get_submodule(layer), slim.get_submodule(layer)
    return {"layer": layer, "in_before": a.in_channels, "out_before": a.out_channels,
            "in_after": b.in_channels, "out_after": b.out_channels}


def layer_flops(model: nn.Module, layer: str, x: torch.Tensor) -> int:
    """FLOPs of conv ``layer`` alone in one forward of ``x`` (torch's FlopCounter, per module)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    counts = counter.get_flop_counts()
    key = next((k for k in counts if k.endswith(layer) or k.endswith(f".{layer}")), None)
    if key is None:
        raise ConfigError("layer", layer, f"a module the FLOP counter saw ({', '.join(list(counts)[:8])}, ...)")
    return int(sum(counts[key].values()))


@worded
def flops_finding(numbers: dict, dense: nn.Module, slim: nn.Module, x: torch.Tensor) -> str:
    """The measured FLOPs ratio of one conv after structured pruning, beside the channel arithmetic."""
    measured = layer_flops(slim, numbers["layer"], x) / layer_flops(dense, numbers["layer"], x)
    return (f"Measured by the FLOP counter: {numbers['layer']} does {measured:.3f}x the FLOPs it did before "
            f"({numbers['in_after']}/{numbers['in_before']} input channels x {numbers['out_after']}/{numbers['out_before']} "
            "output channels).")


# --- 5. did accuracy really rise? -----------------------------------------------------------------------


def _predictions(model: nn.Module, cfg: RunConfig) -> torch.Tensor:
    """Whether each test image is classified right (a bool per image)."""
    split = _splits(cfg)["test"]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    right = []
    with torch.no_grad():
        for images, labels in data.make_loader(split, batch_size=256, shuffle=False):
            x = data.to_model_input(images, split, device, cfg.channels_last, cfg.image_size)
            right.append(model(x).argmax(dim=1).cpu() == labels)
    model.train(was_training)
    return torch.cat(right)


def seed_repeats(cfg: RunConfig, seeds: Iterable[int] = (0, 1, 2), amounts: Iterable[float] = (0.2, 0.4, 0.6, 0.8),
                 scope: str = "global") -> pd.DataFrame:
    """Fine-tune once per seed, prune each at every amount, and compare with that seed's unpruned model.

    Rows: ``seed``, ``amount``, ``test_accuracy``, ``delta`` (pruned - unpruned, same seed), ``gained`` / ``lost``
    (test images the pruned model gets right / wrong that the unpruned one got wrong / right).
    """
    seeds = list(seeds)
    if len(seeds) < 2 or not all(is_int(s) and s >= 0 for s in seeds):
        raise ConfigError("seeds", seeds, "at least two different seeds (integers >= 0): a spread needs repeats")
    amounts = [pruning.check_amount(a, "amounts") for a in amounts]  # before any fine-tune runs
    rows = []
    for seed in seeds:
        model, _ = fine_tuned(cfg.replace(seed=seed))
        right = _predictions(model, cfg)
        for amount in amounts:
            pruned = pruning.l1_unstructured(copy.deepcopy(model), amount, scope=scope)
            now = _predictions(pruned, cfg)
            rows.append({"seed": seed, "amount": amount, "test_accuracy": float(now.float().mean()),
                         "unpruned_accuracy": float(right.float().mean()),
                         "delta": float(now.float().mean() - right.float().mean()),
                         "gained": int((now & ~right).sum()), "lost": int((~now & right).sum())})
    return pd.DataFrame(rows)


def rise_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per amount: the mean change in test accuracy over seeds, its standard deviation, and the rises counted."""
    rows = []
    for amount, group in frame.groupby("amount"):
        deltas = list(group.delta)
        rows.append({"amount": amount, "mean_delta": statistics.mean(deltas),
                     "std_delta": statistics.stdev(deltas) if len(deltas) > 1 else 0.0,
                     "rose": int((group.delta > 0).sum()), "seeds": len(group),
                     "gained": int(group.gained.sum()), "lost": int(group.lost.sum())})
    return pd.DataFrame(rows)


@worded
def rise_finding(frame: pd.DataFrame) -> str:
    """Whether "accuracy rose after pruning" holds up over seeds, from `seed_repeats`'s frame."""
    summary = rise_summary(frame)
    test_size = profile().test_size
    noise = measure.accuracy_noise(frame.unpruned_accuracy.mean(), test_size)
    rises = int((frame.delta > 0).sum())
    text = (f"Over {frame.seed.nunique()} seeds x {len(summary)} amounts, pruning raised test accuracy in {rises} of "
            f"{len(frame)} cases. ")
    real = summary[(summary.mean_delta > 2 * summary.std_delta / math.sqrt(frame.seed.nunique()))
                   & (summary.mean_delta > noise / 2)]
    best = summary.loc[summary.mean_delta.idxmax()]
    text += (f"The best amount, {best.amount:.0%}, changed it by {_points(best.mean_delta, sign=True, digits=2)} on average "
             f"(standard deviation {_points(best.std_delta, digits=2)} over seeds; {int(best.gained)} images gained, {int(best.lost)} lost). ")
    if real.empty:
        text += (f"No mean rise stands out from the seed-to-seed spread and the test split's noise (about {_points(noise)} for "
                 f"{test_size} images): a rise seen once is chance, as the seeds' was. Light pruning barely changes the "
                 "model; heavy pruning costs accuracy.")
    else:
        amounts = ", ".join(f"{a:.0%}" for a in real.amount)
        text += (f"At {amounts} the mean rise exceeds twice its standard error and half the test noise (about {_points(noise)}):"
                 " a small regularising effect is possible here; confirm it on more seeds before believing it.")
    return text


# --- 6. the panel ----------------------------------------------------------------------------------------


@dataclass
class PruneRun:
    """One panel run: a pruned (and maybe recovered) copy of the fine-tuned model, measured."""

    config: dict
    method: str
    amount: float
    recovery_steps: int
    sparsity: float
    num_params: int
    nonzero_params: int
    latency_s: float
    test_accuracy: float
    model_size_bytes: int
    dense_params: int
    warnings: list = field(default_factory=list)

    def to_row(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k not in ("config", "warnings")}
        row["seed"] = self.config.get("seed")
        # Params removed: channels removed (structured) or weights zeroed (unstructured), as one axis.
        row["params_removed"] = 1 - self.nonzero_params / self.dense_params
        return row

    def __str__(self) -> str:
        return wrap(f"{self.method} at {self.amount:.0%}, {self.recovery_steps} recovery steps: {self.sparsity:.0%} "
                    f"zeros, {self.nonzero_params:,} nonzero of {self.num_params:,} parameters, latency "
                    f"{self.latency_s * 1e3:.3g} ms, test accuracy {self.test_accuracy:.1%}")


def panel_run(cfg: RunConfig, method: str = "unstructured", amount: float = 0.5, recovery_steps: int = 0,
              on_step=None, progress: bool = False) -> PruneRun:
    """Prune the fine-tuned model of ``cfg`` by ``method`` at ``amount``, fine-tune ``recovery_steps`` steps (0: none)
    with the masks kept (unstructured) or on the smaller model (structured), and measure it."""
    if method not in METHODS:
        raise ConfigError("method", method, f"one of {list(METHODS)}")
    amount = pruning.check_amount(amount)
    if not is_int(recovery_steps) or recovery_steps < 0:
        raise ConfigError("recovery_steps", recovery_steps, "an integer >= 0 (0: no recovery fine-tune)")
    if 0 < recovery_steps <= profile().warmup_steps + train.PROFILING_STEPS:
        raise ConfigError("recovery_steps", recovery_steps,
                          f"0 or more than {profile().warmup_steps + train.PROFILING_STEPS} (the run's untimed warm-up "
                          "and profiling steps)")
    model, result = fine_tuned(cfg, progress=progress)
    x = example_batch(cfg)
    if method == "structured":
        pruned = pruning.prune_channels(model, amount, x[:2])
    else:
        pruned = pruning.l1_unstructured(copy.deepcopy(model), amount, permanent=False)
    warnings = list(result.warnings)
    if recovery_steps:
        warnings += recover(pruned, cfg, recovery_steps, on_step=on_step).warnings
    pruning.make_permanent(pruned)
    return PruneRun(config=cfg.to_dict(), method=method, amount=amount, recovery_steps=recovery_steps,
                    sparsity=pruning.sparsity(pruned).overall, num_params=measure.count_parameters(pruned)[0],
                    nonzero_params=_nonzero_params(pruned), latency_s=latencies([pruned], x)[0],
                    test_accuracy=accuracy(pruned, cfg, "test"), model_size_bytes=measure.model_size_bytes(pruned),
                    warnings=sorted(set(warnings)), dense_params=measure.count_parameters(model)[0])


def panel_estimate(cfg: RunConfig) -> str | None:
    """The panel's time line: from the cached fine-tune of ``cfg`` (None, "no estimate", when it is not cached)."""
    key = results.cache_key(cfg, env_report(cfg.device))
    path = results.results_dir() / f"{key}.json"
    if not path.exists() or not (results.results_dir() / f"{key}.pt").exists():
        return None
    cached = results.RunResult.from_dict(json.loads(path.read_text()))
    return (f"Estimated time: a few seconds to prune and measure, plus about {cached.step_time_s * 1e3:.0f} ms per "
            f"recovery step (the cached fine-tune's step time on this machine).")

"""`labkit.doctor(cfg)`: short probes that turn DESIGN.md's troubleshooting table into a diagnosis of one config.

Each probe runs the config (or a short piece of it), looks for one symptom, and when it shows names the likely
cause and a remedy as config changes, then tries the remedy where a run can tell whether it works:

- loss becomes NaN (or explodes). Probe: the run's losses. Remedy tried: a safer precision, lr / 10, gradient
  clipping.
- AMP slower than fp32. Probe: a few timed steps in the config's precision and in fp32. Remedy (named, not tried):
  fp32 here, a larger batch, channels_last.
- accuracy drops a lot after quantization. Probe: float against quantized accuracy (``quantize``). Remedy tried: the
  first/last layers (or LayerNorm) kept in float.
- memory not reduced after pruning. Probe: the pruned copy's size against the dense one (``prune_amount``). Remedy
  tried: structured pruning.
- distributed run hangs. Probe: the job under torchrun with a short process-group timeout (``nproc``). Remedy (named,
  not tried): the rank, timeouts, backend.

The distributed probe launches its job with `labkit.launcher.launch`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from . import config, evaluation, machine, measure, models, text, train
from .capacity.lm_memory import lm_training_memory
from .config import RunConfig
from .configfile import load_config
from .env import profile, resolve_device
from .errors import ConfigError, DistributedError, NonFiniteLossError, UnsupportedError
from .launcher import VIT, launch
from .messages import wrap
from .results import cached_fit, cached_model
from .techniques.precision import resolve_precision
from .units import mib

SYMPTOMS = {  # DESIGN.md's troubleshooting table, in its words
    "nan_loss": "loss becomes NaN",
    "amp_slower": "AMP slower than fp32",
    "quantization_drop": "accuracy drops a lot after quantization",
    "pruning_memory": "memory not reduced after pruning",
    "distributed_hang": "distributed run hangs",
}
# Errors a learner's own loop raises, which `explain` names; not probed by `doctor` (labkit's loop never hits them)
ERROR_SYMPTOMS = {"fp16_weights": "training fails with \"Attempting to unscale FP16 gradients\"",
                  "lm_out_of_memory": "a language model runs out of memory (often only at long sequences)"}
KNOWN_ERRORS = {
    "Attempting to unscale FP16 gradients": (
        "fp16_weights",
        "the trainable weights are fp16 (a model loaded with torch_dtype=torch.float16), so their gradients are fp16 "
        "too, and the GradScaler refuses to unscale them: fp16 gradients would lose the small values it protects",
        "keep the trainable weights in float32 under fp16 autocast (model.float(), or LoRA adapters in float32 over an "
        "fp16 base: autocast computes in fp16 anyway), or use bf16 where it is native (no scaler)"),
}
STATUSES = ("problem", "ok", "not probed")
TAME = 1.5  # a remedy whose final loss stays under this many times the first one no longer explodes
EXPLODED = 10.0  # a final loss this many times the first one counts as exploding: on its way to inf and NaN
SLOWER = 1.10  # AMP this much slower than fp32 a step (beyond timing noise) counts as slower
AMP_TIMED_STEPS = 4  # timed steps of each of the AMP probe's two short runs
MIN_DROP = 0.02  # an accuracy drop under 2 points (or under the test set's noise) is not "a lot"
PROBE_TIMEOUT_S = 10.0  # the distributed probe's process-group timeout: a hang is an error in seconds
DEFAULT_LR = RunConfig.lr  # the NaN probe tries learning rates down to this one
SMALL_BATCH = 32  # below this many samples a step, a GPU's kernels are too small for AMP to pay


@dataclass(frozen=True)
class Finding:
    """One probe's verdict.

    Attributes:
        symptom: a key of `SYMPTOMS`. status: ``problem`` (the symptom showed), ``ok`` or ``not probed`` (the
            config does not do what the symptom needs, e.g. no ``quantize``).
        observed: what the probe measured. cause: the likely cause. remedy: what to change.
        fix: the remedy as `RunConfig` changes ({} when it is not a config change).
        checked: what the doctor measured with ``fix`` applied (None: not tried).
        numbers: the probe's measurements by name (e.g. ``ratio`` of the AMP probe), for checks and exercises.
    """

    symptom: str
    status: str
    observed: str
    cause: str = ""
    remedy: str = ""
    fix: dict = field(default_factory=dict)
    checked: str | None = None
    numbers: dict = field(default_factory=dict)

    @property
    def title(self) -> str:
        return SYMPTOMS.get(self.symptom) or ERROR_SYMPTOMS[self.symptom]

    @property
    def problem(self) -> bool:
        return self.status == "problem"

    def __str__(self) -> str:
        lines = [f"[{self.status}] {self.title}: {self.observed}"]
        if self.cause:
            lines.append(f"  likely cause: {self.cause}")
        if self.remedy:
            lines.append(f"  remedy: {self.remedy}")
        if self.checked:
            lines.append(f"  checked: {self.checked}")
        return "\n".join(wrap(line) if len(line) > 100 else line for line in lines)


@dataclass
class Diagnosis:
    """What `doctor` found for ``config``: one `Finding` per symptom, in `SYMPTOMS`' order."""

    config: RunConfig
    findings: list[Finding]
    seconds: float = math.nan

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]

    def __getitem__(self, symptom: str) -> Finding:
        for finding in self.findings:
            if finding.symptom == symptom:
                return finding
        raise ConfigError("symptom", symptom, f"one of {list(SYMPTOMS)}")

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"symptom": f.title, "status": f.status, "observed": f.observed, "likely cause": f.cause,
                              "remedy": f.remedy, "checked": f.checked or ""} for f in self.findings])

    def __str__(self) -> str:
        found = len(self.problems)
        head = (f"labkit doctor: {found} problem{'s' if found != 1 else ''} found in {self.seconds:.0f} s"
                if found else f"labkit doctor: no problem found in {self.seconds:.0f} s")
        return "\n".join([head, *map(str, self.findings)])


def _losses_text(losses: list[float]) -> str:
    return f"{losses[0]:.3g} at step 1 to {losses[-1]:.3g} at step {len(losses)}"


def _exploded(losses: list[float]) -> bool:
    finite = [x for x in losses if math.isfinite(x)]
    return len(finite) < len(losses) or losses[-1] > EXPLODED * losses[0]


def _pct(share: float) -> str:
    return f"{share:.0%}"


def _losses(cfg: RunConfig) -> tuple[list[float] | None, str]:
    """The run's losses (None when one was not finite) and what they did, in words."""
    try:
        result = cached_fit(cfg.replace(evaluate=False, prune_amount=None, prune_structured=False, quantize=None,
                                        quantize_keep_float=()), progress=False)
    except NonFiniteLossError as error:
        return None, f"the loss became {error.loss} at step {error.step}"
    return result.losses, f"the loss went from {_losses_text(result.losses)}"


def _said(changes: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in changes.items())


def probe_nan(cfg: RunConfig) -> tuple[Finding, bool]:
    """Probe the run's losses for non-finite or exploding (`EXPLODED`) ones; return the finding and if it trained.

    Tries a safer precision, then lr / 10, gradient clipping and a far smaller lr, and names the first with which
    the loss falls (else the first that keeps it under `TAME` times its start).
    """
    losses, text = _losses(cfg)
    numbers = {"first_loss": losses[0], "last_loss": losses[-1]} if losses else {"first_loss": math.nan,
                                                                                 "last_loss": math.nan}
    if losses is not None and not _exploded(losses):
        return Finding("nan_loss", "ok", f"no: {text}", numbers=numbers), True
    precision = resolve_precision(cfg.precision, resolve_device(cfg.device)).name
    candidates = []
    if precision == "fp16":
        safer = "bf16" if _native_bf16(cfg) else "fp32"
        candidates.append(({"precision": safer}, "fp16 overflow: activations or gradients above 65,504 become inf, "
                           "then NaN", f"{safer}, which has float32's range (GradScaler only rescales gradients)"))
    cause = f"exploding gradients: lr={cfg.lr:g} takes steps so large that the loss grows instead of falling"
    clip = cfg.grad_clip or 1.0
    lowest = DEFAULT_LR if cfg.lr > 100 * DEFAULT_LR else cfg.lr / 100  # down to labkit's default, at most
    for changes in ({"lr": cfg.lr / 10}, {"lr": cfg.lr / 10, "grad_clip": clip}, {"lr": lowest, "grad_clip": clip}):
        candidates.append((changes, cause, "a smaller learning rate" + (
            "; clipping caps each step's gradient norm" if "grad_clip" in changes else "")))
    tried, tame = [], None
    for changes, cause, why in candidates:
        fixed, fixed_text = _losses(cfg.replace(**changes))
        tried.append(f"{_said(changes)}: {fixed_text}")
        if fixed is not None and fixed[-1] < fixed[0]:  # the loss falls: the first such remedy is the one
            return Finding("nan_loss", "problem", text, cause, f"set {_said(changes)} ({why})", changes,
                           "; ".join(tried), numbers), False
        if fixed is not None and fixed[-1] <= TAME * fixed[0] and tame is None:
            tame = changes, cause, why
    if tame is not None:  # finite and no longer growing, though too short a run (or too small an lr) to fall
        changes, cause, why = tame
        return Finding("nan_loss", "problem", text, cause, f"set {_said(changes)} ({why})", changes,
                       "; ".join(tried), numbers), False
    return Finding("nan_loss", "problem", text, "neither the precision nor the learning rate: look at the data "
                   "(NaN or huge inputs) and the loss function",
                   "check the inputs with torch.isfinite; lower lr further",
                   {}, "; ".join(tried), numbers), False


def _native_bf16(cfg: RunConfig) -> bool:
    return not resolve_precision("bf16", resolve_device(cfg.device)).emulated


def probe_amp(cfg: RunConfig) -> Finding:
    """A few timed steps in the config's precision and in fp32, one after the other in this process."""
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.precision, device)
    if precision.name == "fp32":
        said = f"precision={cfg.precision}" + (" (fp32 on this device)" if cfg.precision == "auto" else "")
        return Finding("amp_slower", "not probed", f"the run does not use mixed precision ({said})")
    prof = profile()
    steps = prof.warmup_steps + train.PROFILING_STEPS + AMP_TIMED_STEPS
    short = {"max_steps": steps, "epochs": 1, "evaluate": False, "prune_amount": None, "prune_structured": False,
             "quantize": None, "quantize_keep_float": (), "lr_warmup_steps": 0}
    amp = cached_fit(cfg.replace(**short), progress=False)
    fp32 = cached_fit(cfg.replace(precision="fp32", **short), progress=False)
    ratio = amp.step_time_s / fp32.step_time_s
    observed = (f"{precision.name} {amp.step_time_s * 1e3:.1f} ms a step, fp32 {fp32.step_time_s * 1e3:.1f} ms "
                f"({ratio:.2f}x fp32's time; batch {cfg.batch_size}, {AMP_TIMED_STEPS} timed steps each)")
    numbers = {"amp_step_s": amp.step_time_s, "fp32_step_s": fp32.step_time_s, "ratio": ratio}
    if ratio <= SLOWER:
        return Finding("amp_slower", "ok", f"no: {observed}", numbers=numbers)
    capability = machine.here().capability if device.type == "cuda" else None
    finding = amp_slower_finding(observed, precision.name, precision.emulated, capability, cfg.batch_size)
    return dataclasses.replace(finding, numbers=numbers)


def amp_slower_finding(observed: str, precision: str, emulated: bool, capability: tuple[int, int] | None,
                       batch_size: int) -> Finding:
    """Why mixed precision was slower, from what the device is (``capability`` None: a CPU) and the batch."""
    if capability is None:
        kind = "emulated: autocast converts around float32 arithmetic" if emulated else \
            "natively, but its float32 kernels are better tuned for this model"
        return Finding("amp_slower", "problem", observed, f"no tensor cores: a CPU runs {precision} {kind}",
                       "train in fp32 on this CPU (precision: auto picks fp32 on CPUs); mixed precision pays on "
                       "tensor-core GPUs", {"precision": "auto"})
    if capability < (7, 0):
        return Finding("amp_slower", "problem", observed, f"no tensor cores (compute capability "
                       f"{capability[0]}.{capability[1]}, as on a P100)", "train in fp32 here (precision: auto)",
                       {"precision": "auto"})
    if batch_size < SMALL_BATCH:
        return Finding("amp_slower", "problem", observed, f"a tiny batch ({batch_size}): kernel launches and "
                       "the casts cost more than the faster matmuls save", "a larger batch (see notebook 02)",
                       {"batch_size": SMALL_BATCH * 2})
    return Finding("amp_slower", "problem", observed, "the model is too small to keep the tensor cores busy, or a "
                   "CNN runs in channels-first layout", "channels_last for a CNN, a larger batch or model",
                   {"channels_last": True})


def _keep_choices(model: torch.nn.Module) -> list[tuple[str, ...]]:
    stages = [name for name, _ in models.named_stages(model)]
    choices = [(stages[0],), (stages[-1],), (stages[0], stages[-1])]
    if any(isinstance(m, torch.nn.LayerNorm) for m in model.modules()):
        choices.append(("LayerNorm",))
    return choices


def probe_quantization(cfg: RunConfig, model: torch.nn.Module, result) -> Finding:
    """Float against quantized test accuracy; if it dropped, which layers to keep in float.

    The layers are chosen on the validation split and checked on the test split.
    """
    if cfg.quantize is None:
        return Finding("quantization_drop", "not probed", "the run quantizes nothing (quantize: null)")
    splits = train.run_splits(cfg)
    unquantized = cfg.replace(quantize=None, quantize_keep_float=())
    # Against the same model unquantized: pruned too when the config prunes, so pruning's own loss is not counted.
    float_acc = result.accuracy if cfg.prune_amount is None else \
        evaluation.score_inference(model, unquantized, splits)["accuracy"]
    quant_acc = result.inference["accuracy"]
    noise = measure.accuracy_noise(float_acc, len(splits["test"]))
    drop = float_acc - quant_acc
    observed = (f"{result.inference['method']}: test accuracy {quant_acc:.1%} against {float_acc:.1%} in float "
                f"({drop * 100:.1f} points lost; test-set noise about {noise * 100:.1f})")
    numbers = {"float_accuracy": float_acc, "quantized_accuracy": quant_acc, "drop": drop, "noise": noise}
    if drop <= max(MIN_DROP, noise):
        return Finding("quantization_drop", "ok", f"no: {observed}", numbers=numbers)
    device = next(model.parameters()).device
    fp32 = resolve_precision("fp32", device)
    scores = []
    for keep in _keep_choices(model):
        trial = cfg.replace(quantize_keep_float=tuple(dict.fromkeys((*cfg.quantize_keep_float, *keep))))
        try:
            deployed = evaluation.inference_model(model, trial, splits["train"])
        except ConfigError:  # nothing left to quantize (e.g. int8 dynamic with the only Linear kept in float)
            continue
        where = next(iter(deployed.parameters()), torch.empty(0)).device
        scores.append((evaluation.evaluate(deployed, splits["val"], trial, where, resolve_precision("fp32", where),
                                      shard=False), -len(keep), trial.quantize_keep_float))
    if not scores:
        return Finding("quantization_drop", "problem", observed, "the quantized layers themselves: every one of them "
                       "is needed", "a gentler method (int8 instead of fewer bits) or quantization-aware training "
                       "(notebook 06)")
    best_val, _, keep = max(scores)
    val_float = evaluation.evaluate(evaluation.inference_model(model, unquantized, splits["train"]), splits["val"], cfg,
                               device, fp32, shard=False)
    checked = evaluation.score_inference(model, cfg.replace(quantize_keep_float=keep), splits)
    tried = ", ".join(f"{'+'.join(k)} {a:.1%}" for a, _, k in scores)
    return Finding("quantization_drop", "problem", observed,
                   "sensitive layers quantized: the first layer sees raw pixels and the last one decides the class, "
                   "so their rounding errors cost the most",
                   f"keep them in float: quantize_keep_float: {list(keep)}", {"quantize_keep_float": list(keep)},
                   f"validation accuracy {val_float:.1%} in float, with each kept in float: {tried}; with "
                   f"{list(keep)} in float the test accuracy is {checked['accuracy']:.1%} and the file "
                   f"{checked['size_bytes'] / 2**20:.2f} MiB", {**numbers, "fixed_accuracy": checked["accuracy"]})


def probe_pruning(cfg: RunConfig, model: torch.nn.Module, result) -> Finding:
    """The pruned copy's serialised size against the same copy unpruned."""
    if cfg.prune_amount is None:
        return Finding("pruning_memory", "not probed", "the run prunes nothing (prune_amount: null)")
    splits = train.run_splits(cfg)
    dense = evaluation.score_inference(model, cfg.replace(prune_amount=None, prune_structured=False), splits) \
        if cfg.quantize is not None else {"size_bytes": result.model_size_bytes}
    info = result.inference
    ratio = info["size_bytes"] / dense["size_bytes"]
    observed = (f"{info['method']}: {_pct(1 - info['nonzero_share'])} of the weights are zero and the file is "
                f"{info['size_bytes'] / 2**20:.2f} MiB, {_pct(ratio)} of the unpruned "
                f"{dense['size_bytes'] / 2**20:.2f} MiB")
    numbers = {"size_ratio": ratio, "nonzero_share": info["nonzero_share"]}
    if ratio < 0.9:
        return Finding("pruning_memory", "ok", f"no: {observed}", numbers=numbers)
    if cfg.prune_structured:
        return Finding("pruning_memory", "problem", observed, "the pruned channels feed residual additions or "
                       "concatenations, which keep them", "prune the convolutions that are free to shrink "
                       "(labkit.techniques.pruning.channel_chains)", numbers=numbers)
    structured = evaluation.score_inference(model, cfg.replace(prune_structured=True), splits)
    return Finding("pruning_memory", "problem", observed,
                   "zeros are still stored densely: unstructured pruning zeroes weights but keeps every one of "
                   "them, as a float32 like any other", "remove whole channels (prune_structured: true) so the "
                   "layers are rebuilt smaller, then fine-tune to recover accuracy; or store very sparse weights "
                   "as CSR (notebook 04 measures where it pays)", {"prune_structured": True},
                   f"with prune_structured: true the file is {structured['size_bytes'] / 2**20:.2f} MiB "
                   f"({_pct(structured['size_bytes'] / dense['size_bytes'])} of unpruned), test accuracy "
                   f"{structured['accuracy']:.1%} before any recovery fine-tune (float: {result.accuracy:.1%})",
                   {**numbers, "fixed_size_ratio": structured["size_bytes"] / dense["size_bytes"]})


def probe_distributed(cfg: RunConfig, nproc: int | None, backend: str | None = None, timeout_s: float | None = None,
                      fail_rank: int | None = None, fail_step: int | None = None, fail_how: str = "raise") -> Finding:
    """The job under torchrun with a process-group timeout of at most `PROBE_TIMEOUT_S`.

    A hang then ends, in seconds, as an error naming the rank. ``fail_*`` make a rank fail on purpose (see
    `launch`).
    """
    if nproc is None:
        return Finding("distributed_hang", "not probed", "no distributed job asked for (nproc)")
    cfg, where = probe_config(cfg, nproc)
    if cfg is None:
        return Finding("distributed_hang", "not probed", where)
    timeout = PROBE_TIMEOUT_S if timeout_s is None else min(float(timeout_s), PROBE_TIMEOUT_S)
    start = time.perf_counter()
    try:
        job = launch(cfg, nproc=nproc, fail_rank=fail_rank, fail_step=fail_step, fail_how=fail_how, backend=backend,
                     timeout_s=timeout, progress=False)
    except (ConfigError, UnsupportedError) as error:
        allowed = error.allowed if isinstance(error, ConfigError) else str(error).split("What runs here: ")[-1]
        return Finding("distributed_hang", "problem", f"the job cannot start: {error}", "a setting the ranks cannot "
                       "agree on or the machine cannot give (devices, backend, batch split)",
                       f"set {error.field} to {allowed}")
    except DistributedError as error:
        elapsed = error.elapsed_s or time.perf_counter() - start  # the job's own time (a cached failure is instant)
        hung = "waited" in str(error) or "timeout" in str(error).lower()
        rank = f"rank {error.rank}" if error.rank is not None else "a rank"
        cause = (f"{rank} stopped taking part (hung) while the others waited in an all-reduce" if hung else
                 f"{rank} died or never joined, and the job stopped")
        return Finding("distributed_hang", "problem", f"{error} (found in {elapsed:.0f} s{where})", cause,
                       f"read {rank}'s own error first; keep a process-group timeout (timeout_s: {timeout:g} s here, "
                       "torch's default is 30 minutes for gloo and 10 for NCCL) so a hang fails instead of waiting; "
                       "gloo on CPUs, nccl on GPUs (NCCL_P2P_DISABLE=1 where GPUs cannot talk directly)",
                       numbers={"elapsed_s": elapsed, "rank": error.rank, "timeout_s": timeout})
    sha = set(job.distributed["weights_sha256"])
    return Finding("distributed_hang", "ok", f"no: {nproc} ranks on {job.distributed['backend']} finished "
                   f"{job.steps} steps in {time.perf_counter() - start:.0f} s with "
                   f"{'identical' if len(sha) == 1 else 'DIFFERENT'} weights on every rank{where}")


def probe_config(cfg: RunConfig, nproc: int) -> tuple[RunConfig | None, str]:
    """The config the hang probe launches, and where it runs (words for the finding); None when it cannot run.

    A job takes one process per GPU: with fewer GPUs than ``nproc`` (one Colab T4), the probe runs ``nproc``
    CPU processes over gloo on the small offline workload instead, as notebook 07 does; a hang is found alike.

    Args:
        cfg: the config asked about. nproc: the processes asked for.
    """
    cfg = cfg.replace(prune_amount=None, prune_structured=False, quantize=None, quantize_keep_float=())
    here = machine.here()
    if resolve_device(cfg.device).type != "cuda" or here.gpu_count >= nproc:
        return cfg, ""
    if here.cpu_cores < nproc:
        return None, (f"{nproc} processes asked for, and this machine has {here.gpu_count} GPU(s) and "
                      f"{here.cpu_cores} CPU core(s): a job takes one process per device")
    small = {**config.SMALL_WORKLOAD, "batch_size": cfg.batch_size, "model": VIT}
    return (cfg.replace(device="cpu", **small),
            f"; on {nproc} CPU processes over gloo with {VIT}: {here.gpu_count} GPU here, one process per GPU")


def _lm_memory_finding(message: str, cfg: RunConfig) -> Finding:
    """Out of memory on a language model: the formula's largest parts at the run's shape, and what shrinks each."""
    vocab = train.run_splits(cfg, training=False)["train"].tokenizer.vocab_size
    seq_len = text.resolve_seq_len(cfg.dataset, cfg.seq_len)
    precision = cfg.precision if cfg.precision in ("fp32", "bf16", "fp16") else "fp32"
    rows = cfg.batch_size // cfg.grad_accum
    parts = lm_training_memory(cfg.model, "lora" if cfg.lora_rank else "full", seq_len, rows, precision,
                               lora_rank=cfg.lora_rank or 8,
                               lora_targets="all" if cfg.lora_targets == "all-linear" else tuple(cfg.lora_targets),
                               checkpointing=cfg.checkpointing is True, attn_implementation=cfg.attn_implementation,
                               vocab_size=vocab if models.is_language_model(cfg.model) and cfg.model not in
                               models.HUB_MODELS else None)
    shape = f"{rows} rows x {seq_len} tokens a micro-batch"
    remedies = []
    if parts["logits"] > 0.25 * parts["total"] and cfg.loss_chunks is None:
        remedies.append("chunked loss (loss_chunks=8: the logits a slice at a time)")
    if cfg.attn_implementation == "eager":
        remedies.append("attn_implementation='sdpa' (no L x L probabilities kept)")
    if cfg.checkpointing is not True:
        remedies.append("checkpointing=True (each decoder layer recomputed in the backward pass)")
    remedies.append("a smaller micro-batch with grad_accum (the same tokens a step)")
    cause = (f"at {shape} the formula puts activations at {mib(parts['activations'], '.3g')} and the logits at "
             f"{mib(parts['logits'], '.3g')} (rows x length x {vocab:,} vocabulary, in float32) of a "
             f"{mib(parts['total'], '.3g')} peak: both grow with the sequence length, eager attention's with its "
             "square")
    return Finding("lm_out_of_memory", "problem", message.strip()[:200], cause, "; ".join(remedies),
                   numbers={k: parts[k] for k in ("activations", "logits", "total")})


def explain(error: BaseException | str, cfg: RunConfig | None = None) -> Finding | None:
    """The likely cause and remedy of an error a training loop raised, where it is a known one (`KNOWN_ERRORS`, and
    running out of memory with a language model's ``cfg``).

    Args:
        error: the exception (or its message).
        cfg: the run that raised it; for a language model out of memory, its numbers name the cause.

    Example:
        >>> try:
        ...     scaler.step(optimizer)
        ... except ValueError as exc:
        ...     print(labkit.troubleshoot.explain(exc))
    """
    message = str(error)
    for pattern, (symptom, cause, remedy) in KNOWN_ERRORS.items():
        if pattern in message:
            return Finding(symptom, "problem", "raised by this run", cause, remedy)
    out_of_memory = isinstance(error, torch.OutOfMemoryError) or "out of memory" in message.lower()
    if out_of_memory and cfg is not None and models.is_language_model(cfg.model):
        return _lm_memory_finding(message, cfg)
    return None


def doctor(cfg: RunConfig | str | Path, nproc: int | None = None, backend: str | None = None,
           timeout_s: float | None = None, fail_rank: int | None = None, fail_step: int | None = None,
           fail_how: str = "raise") -> Diagnosis:
    """Probe ``cfg`` for each symptom of `SYMPTOMS`; the `Diagnosis` (print it) names each one's cause and remedy.

    Args:
        cfg: a `RunConfig`, or the path of a YAML config (`labkit.load_config`).
        nproc: also run it data parallel over this many processes (the hang probe); None skips that probe.
        backend: the distributed job's backend (None: the device's).
        timeout_s: the distributed job's process-group timeout (at most `PROBE_TIMEOUT_S`).
        fail_rank: make this rank fail on purpose (a demo).
        fail_step: the step after which it fails.
        fail_how: how it fails: ``"raise"`` (the default), ``"exit"`` or ``"hang"``.

    Example:
        >>> print(labkit.doctor(labkit.RunConfig(optimizer="sgd", lr=50.0)))
        labkit doctor: 1 problem found ...
    """
    start = time.perf_counter()
    cfg = load_config(cfg) if isinstance(cfg, (str, Path)) else cfg
    if not isinstance(cfg, RunConfig):
        raise ConfigError("cfg", type(cfg).__name__, "a labkit.RunConfig or the path of a YAML config")
    nan, trained = probe_nan(cfg)
    findings = [nan, probe_amp(cfg)]
    if trained and (cfg.quantize is not None or cfg.prune_amount is not None):
        model, result = cached_model(cfg, progress=False)
        findings += [probe_quantization(cfg, model, result), probe_pruning(cfg, model, result)]
    else:
        why = "the run does not train (see the first finding)" if not trained else None
        findings += [Finding("quantization_drop", "not probed", why or "the run quantizes nothing (quantize: null)"),
                     Finding("pruning_memory", "not probed", why or "the run prunes nothing (prune_amount: null)")]
    findings.append(probe_distributed(cfg, nproc, backend, timeout_s, fail_rank, fail_step, fail_how))
    return Diagnosis(cfg, findings, time.perf_counter() - start)

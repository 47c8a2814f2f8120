"""One function per reference file: each calls its notebook's lab and returns a `Part` (no measuring code here).

`labkit.bench.notebooks` (``labkit bench``) and `labkit.bench.suite` (``labkit bench --suite gpu``) both take their
parts from here, so a part measures the same thing whichever command ran it.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from ..capacity import batch_search
from ..config import RunConfig
from ..env import env_report, profile, resolve_device
from ..labs import (
    batch_size,
    distributed,
    freezing,
    language,
    lora,
    memory_savers,
    mixed_precision,
    pruning,
    quantization,
    recipe,
)
from ..labs.language.attention import IMPLEMENTATIONS
from ..labs.language.throughput import lm_config
from ..labs.start_here import timing_demo
from ..models import max_positions
from ..results import run_configs, to_frame
from ..techniques.precision import low_precision_for
from ..techniques.quantization import METHODS
from ..train import fit
from .common import CPU_BUDGET_BYTES, EMULATED_GPU_BYTES, SUITE_STEPS, Part, memory_cap, records

# Notebook 06's methods with a kernel on a CUDA GPU: the CPU-only ones (torch.ao's int8) and QAT (a fine-tune) are
# the CPU's story, told by the notebook itself.
GPU_QUANT_METHODS = tuple(name for name, method in METHODS.items() if "cuda" in method.devices)
STORAGE_SPARSITIES = (0.0, 0.7, 0.9, 0.99)  # of notebook 04's seven: dense, the CSR break-even region, the tail
ATTENTION_ROWS = 2  # notebook 10's section 3: rows of each attention run
ATTENTION_LONGEST = 512  # tokens: eager's probabilities on SmolLM2-135M's shape, 2 rows in fp32: 0.53 GiB
LADDER_SHAPE = {"batch_size": 8, "seq_len": 64}  # notebook 10's section 9: the ladder's rows and their width
LM_FIELDS = ("batch_size", "seq_len", "train_size", "max_steps", "device")  # what `lm_01` keeps of its workload


def _low(cfg: RunConfig) -> str:
    """This device's 16-bit training precision: bf16 where native, fp16 on other GPUs."""
    return low_precision_for(env_report(cfg.device))


def baseline_00(cfg: RunConfig) -> Part:
    """Notebook 00: the baseline fine-tune and the timing pitfalls (a timer without synchronise, no warm-up)."""
    pitfalls = timing_demo(cfg, repeats=profile().repeats).pitfalls
    return Part("baseline", [fit(cfg)], extras={"timing_pitfalls": dataclasses.asdict(pitfalls)})


def compare_01(cfg: RunConfig) -> Part:
    """Notebook 01: the same fine-tune in fp32, fp32 + TF32, fp16 + GradScaler and bf16."""
    return Part("compare", list(mixed_precision.compare(cfg, progress=False).runs.values()))


def memory_batch_sizes(cfg: RunConfig) -> list[int]:
    """The profile's batch sizes from a quarter to twice the workload's: 32-256 at ``full``, where a GPU's memory is.

    The workload's own batch where none of the profile's is in that range.
    """
    sizes = [b for b in profile().batch_sizes if cfg.batch_size / 4 <= b <= 2 * cfg.batch_size]
    return sizes or [cfg.batch_size]


def memory_01(cfg: RunConfig) -> Part:
    """Notebook 01: peak memory in fp32 and 16 bits at `memory_batch_sizes`, a few steps each."""
    memory_cfg = cfg.replace(max_steps=profile().warmup_steps + 4, evaluate=False)
    return Part("memory", run_configs([memory_cfg.replace(precision=p, batch_size=b) for p in ("fp32", _low(cfg))
                                       for b in memory_batch_sizes(cfg)], progress=False))


def layouts_01(cfg: RunConfig) -> Part:
    """Notebook 01: channels_last against the default layout, in fp32 and in 16 bits."""
    layouts = [cfg.replace(precision=p, channels_last=c) for p in ("fp32", _low(cfg)) for c in (False, True)]
    return Part("layouts", run_configs(layouts, progress=False))


def scaler_01(cfg: RunConfig) -> Part:
    """Notebook 01: the GradScaler's scale step by step, and what fp16 zeroes with and without loss scaling."""
    trace = mixed_precision.scaler_trace(cfg, steps=profile().max_steps // 2, init_scale=2.0**20, growth_interval=4)
    return Part("scaler", rows=trace.frame,
                extras={"underflow": records(mixed_precision.gradient_underflow(cfg, (1.0, 1e-3)))})


def lm_01(lm: RunConfig) -> Part:
    """Notebook 01, section 9: fp32 against fp16 + GradScaler (a T4's) and this device's low precision (bf16 where
    native) on the language model of ``lm`` (`labkit.workloads.lm_speed_config`), its steps kept."""
    lows = list(dict.fromkeys(["fp16", _low(lm)]))
    fields = {name: getattr(lm, name) for name in LM_FIELDS}
    arms = [mixed_precision.lm_compare(low, **fields) for low in lows]
    frame = pd.concat([arm.frame for arm in arms], ignore_index=True).drop_duplicates("setup", ignore_index=True)
    return Part("lm", rows=frame, extras={"finding": " ".join(str(arm.finding()) for arm in arms)})


def sweep_02(cfg: RunConfig) -> Part:
    """Notebook 02: the batch sweep with the learning rate kept, scaled, and scaled with a warm-up."""
    prof = profile()
    warmup = prof.train_size // max(prof.batch_sizes) * prof.sweep_epochs // 4
    return Part("sweep", rows=batch_size.compare_lr_scaling(cfg, warmup_steps=max(1, warmup)))


def accumulation_02(cfg: RunConfig) -> Part:
    """Notebook 02: gradient accumulation over 1-8 micro-batches, and its gap to the whole batch."""
    accum = run_configs([cfg.replace(grad_accum=k) for k in (1, 2, 4, 8)], progress=False)
    return Part("accumulation", rows=to_frame(accum), extras={"gaps": records(batch_size.accumulation_table(cfg, 4))})


def search_02(cfg: RunConfig) -> Part:
    """Notebook 02: the largest batch that fits; on a GPU without a budget, under a T4's 15 GiB (real OOM back-off)."""
    device = resolve_device(cfg.device)
    budget = None if device.type == "cuda" else CPU_BUDGET_BYTES
    with memory_cap(device, EMULATED_GPU_BYTES):
        search = batch_search(cfg, budget_bytes=budget)
    return Part("search", extras={"best": search.best, "budget_bytes": search.budget_bytes,
                                  "elapsed_s": search.elapsed_s, "limit": search.limit,
                                  "limit_reason": search.limit_reason,
                                  "emulated_gpu_bytes": EMULATED_GPU_BYTES if budget is None else None,
                                  "tried": records(search.to_frame())})


def prediction_02(cfg: RunConfig) -> Part:
    """Notebook 02: memory predicted from two batch sizes, checked against measured steps."""
    frame = batch_size.prediction_table(cfg, fit_sizes=(16, 32), check_sizes=(64, 128, 256, 512))
    return Part("prediction", rows=frame)


def tradeoff_03(cfg: RunConfig) -> Part:
    """Notebook 03: gradient checkpointing over the number of segments, memory against time."""
    return Part("tradeoff", rows=memory_savers.checkpoint_tradeoff(cfg, progress=False))


def staged_03(cfg: RunConfig) -> Part:
    """Notebook 03: baseline, +AMP, +checkpointing, +8-bit AdamW, all together."""
    return Part("staged", rows=memory_savers.staged_runs(cfg, progress=False).frame)


def optimizers_03(cfg: RunConfig) -> Part:
    """Notebook 03: AdamW, 8-bit AdamW and, on a CUDA GPU, paged 8-bit AdamW; the calculator beside them."""
    names = ["adamw", "adamw8bit"] + (["paged_adamw8bit"] if resolve_device(cfg.device).type == "cuda" else [])
    return Part("optimizers", run_configs([cfg.replace(optimizer=name) for name in names], progress=False),
                extras={"calculator": records(memory_savers.calculator_check(cfg.replace(optimizer="adamw8bit")))})


def semi_structured_04(cfg: RunConfig) -> Part:
    """Notebook 04: the 2:4 pattern's accuracy, and a 2:4 Linear's speed-up on an Ampere+ GPU (else why not).

    Named ``2to4``: notebook 04 reads ``04_pruning-semi*`` as published figures only.
    """
    record = pruning.semi_structured(cfg)
    return Part("2to4", extras={**dataclasses.asdict(record), "finding": str(record)})


def storage_04(cfg: RunConfig) -> Part:
    """Notebook 04: the largest weight dense, as COO and as CSR: bytes and matmul time."""
    storage = pruning.sparse_storage(cfg, sparsities=STORAGE_SPARSITIES)
    return Part("storage", rows=storage.frame, extras={"finding": str(storage.finding())})


def levels_05(cfg: RunConfig) -> Part:
    """Notebook 05: one fine-tune per freezing level: step time, memory by category, backward FLOPs."""
    levels = freezing.level_sweep(cfg, progress=False)
    return Part("levels", rows=levels.frame, extras={"finding": str(levels.finding())})


def methods_06(cnn: RunConfig, vit: RunConfig) -> Part:
    """Notebook 06: the methods with GPU kernels on both models: size, CPU and GPU latency, accuracy."""
    table = quantization.method_comparison({vit.model: vit, cnn.model: cnn}, methods=GPU_QUANT_METHODS,
                                           progress=False)
    return Part("methods", rows=table.frame, extras={"versions": quantization.library_versions()})


def dp_vs_ddp_07(vit: RunConfig) -> Part:
    """Notebook 07: DataParallel against DDP over NCCL on every GPU here; with fewer than two, why not."""
    comparison = distributed.dp_vs_ddp(vit, progress=False)
    if comparison.frame is None:
        return Part("dp-vs-ddp", not_run=f"needs 2+ CUDA GPUs: {comparison.finding()}")
    return Part("dp-vs-ddp", rows=comparison.frame, extras={"finding": str(comparison.finding())})


def qlora_08(lm: RunConfig) -> Part:
    """Notebook 08: LoRA on an NF4 base (QLoRA) against a 16-bit base: memory and step time."""
    result = lora.qlora_comparison(lm, rank=8)
    return Part("qlora", rows=result.frame, extras={"versions": lora.library_versions(),
                                                    "finding": str(result.finding())})


def profiler_09(cfg: RunConfig) -> Part:
    """Notebook 09: one step under torch.profiler in fp32 and in 16 bits (CUDA activity on a GPU)."""
    pair = recipe.profile_pair(cfg)
    steps = {step.precision: {"step_time_s": step.step_time_s, "device": step.device, "ops": records(step.ops)}
             for step in (pair.before, pair.after)}
    return Part("profiler", rows=pair.frame, extras={"steps": steps, "finding": str(pair.finding())})


def attention_lengths(model: str) -> tuple[int, int, int]:
    """Three doubling row widths up to `ATTENTION_LONGEST` tokens or half the model's longest: 128-512 on a hub
    model's shape, notebook 10's 32-128 on ``tiny_llama`` (256 positions).

    Example:
        >>> attention_lengths("smollm2_135m")
        (128, 256, 512)
    """
    top = min(ATTENTION_LONGEST, max_positions(model) // 2)
    return top // 4, top // 2, top


def attention_10(lm: RunConfig) -> Part:
    """Notebook 10, section 3: eager attention against SDPA at `attention_lengths`, `ATTENTION_ROWS` rows padded to
    each (its `lm_config` runs, SDPA then eager per length), on ``lm``'s model with its steps.

    The runs themselves, not `attention_memory`'s frame: that sizes the attention probabilities for labkit's own
    Llamas only.
    """
    lengths = attention_lengths(lm.model)
    cfgs = [lm_config(n, ATTENTION_ROWS, impl, model=lm.model, max_steps=lm.max_steps, device=lm.device)
            for n in lengths for impl in IMPLEMENTATIONS]
    return Part("attention", run_configs(cfgs, progress=False), extras={"seq_lens": list(lengths),
                                                                         "rows": ATTENTION_ROWS})


def optimizers_10(lm: RunConfig) -> Part:
    """Notebook 10, section 7: AdamW's step alone with the for-loop, foreach and fused kernels on ``lm``'s model,
    timed interleaved over at most `SUITE_STEPS` rounds."""
    kernels = language.optimizer_kernels(lm.model, repeats=min(2 * profile().repeats, SUITE_STEPS))
    return Part("optimizers", rows=kernels.frame, extras={"finding": str(kernels.finding())})


def ladder_10(lm: RunConfig) -> Part:
    """Notebook 10, section 9: the speed ladder (precision, SDPA, packing, fused AdamW, compile, then checkpointing
    and chunked loss on twice the batch) at the notebook's `LADDER_SHAPE`, on ``lm``'s model with its steps."""
    ladder = language.speed_ladder(lm.replace(**LADDER_SHAPE), progress=False)
    return Part("ladder", rows=ladder.frame, extras={"finding": str(ladder.finding())})

"""int8 dynamic quantization of `tiny_vit` (notebook 06's Linear-heavy model) on the CPU: smaller, faster, as accurate?

Targets (issue 12), at batch 64 on the CPU: the int8 dynamic file at most 30 % of fp32's, faster than fp32,
accuracy within 1 point of fp32's. The model is fine-tuned at the `quick` profile first (from labkit's cache when
it ran before). Latencies are ratios measured in one process, the models timed in turns
(`labkit.inference.latencies`). Also reports torchao's `quantize_` for the same method, static int8, and the share
of fp32 time spent in Linear layers (from torch.profiler), which bounds the whole model's speed-up.
Prints the CPU's instruction sets: int8 matmuls are far faster with AVX512-VNNI or AMX than with AVX2 alone.

Usage: python benchmarks/quantization.py [--repeats 60] [--profile quick]
Do not run it while other work loads the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch

import labkit
from labkit import inference, measure
from labkit.labs import quantization as lab
from labkit.techniques import quantization

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16")


def cpu_flags() -> str:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    present = set(next((line for line in text.splitlines() if line.startswith("flags")), "").split())
    return ", ".join(f for f in FLAGS if f in present) or "none of " + ", ".join(FLAGS)


def linear_share(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Share of the fp32 forward's CPU time spent in Linear layers' matmuls (torch.profiler, self time)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        model(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                model(x)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return sum(e.self_cpu_time_total for e in events if e.key in ("aten::addmm", "aten::mm", "aten::bmm")) / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--profile", default="quick")
    args = parser.parse_args()
    os.environ["LABKIT_PROFILE"] = args.profile
    prof = dataclasses.replace(labkit.profile(args.profile), repeats=args.repeats)
    cfg = lab.workloads(prof)["tiny_vit"]
    model, result = lab.fine_tuned(cfg)
    model = model.cpu().eval()
    x = inference.example_batch(cfg, 64, device=torch.device("cpu"))
    variants = {"fp32": model, "int8_dynamic (torch.ao)": quantization.quantize(model, "int8_dynamic"),
                "int8_dynamic_torchao": quantization.quantize(model, "int8_dynamic_torchao"),
                "int8_static": quantization.quantize(model, "int8_static", lab.calibration_batches(cfg, 8))}
    times = dict(zip(variants, inference.latencies(list(variants.values()), x, prof), strict=True))
    sizes = {name: measure.model_size_bytes(m) for name, m in variants.items()}
    accuracy = {name: inference.accuracy(m, cfg, "test") for name, m in variants.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, engine {torch.backends.quantized.engine}, "
          f"CPU flags: {cpu_flags()}")
    print(f"tiny_vit fine-tuned {result.steps} steps at '{args.profile}', batch 64, {args.repeats} timed calls each")
    print(f"fp32 time in Linear matmuls: {linear_share(model, x):.0%} (the most int8 Linear layers can speed up)")
    for name in variants:
        print(f"{name:26s} file {sizes[name] / sizes['fp32']:6.1%} of fp32   latency {times[name] * 1e3:7.2f} ms "
              f"({times['fp32'] / times[name]:.2f}x fp32's speed)   accuracy {accuracy[name]:.1%} "
              f"({(accuracy[name] - accuracy['fp32']) * 100:+.1f} points)")
    dyn = "int8_dynamic (torch.ao)"
    print(f"targets: file <= 30 %: {sizes[dyn] / sizes['fp32']:.1%}; faster than fp32: "
          f"{times['fp32'] / times[dyn]:.2f}x; within 1 point: {(accuracy[dyn] - accuracy['fp32']) * 100:+.1f}")


if __name__ == "__main__":
    main()

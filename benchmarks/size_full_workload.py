"""How long the `full` profile's notebooks take on a T4, from FLOP counts and NVIDIA's published T4 figures.

No T4 is needed: labkit's FLOP counter (the one `labkit.fit` uses) counts one training step of the full
workload on the CPU. A T4's achieved rate comes from NVIDIA's published ResNet-50 v1.5 throughput on a T4
at batch 128 (DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Inference
performance: NVIDIA T4": 426 img/s in FP32, 1,190 img/s with mixed precision), times ResNet-50's FLOPs
per image counted the same way: the FLOP/s a T4 sustains on ResNet convolutions. Training kernels are
assumed to run at the same rate (a step is a forward and about twice its FLOPs backward).

Each notebook's plan (its runs, steps and batch sizes at `full`) is written out below from the notebooks;
the estimate is train FLOPs / rate plus evaluation, ignoring data loading and Python overhead (a floor).

Usage: python benchmarks/size_full_workload.py
"""

from __future__ import annotations

import torch
import torchvision

import labkit
from labkit import measure, models

T4_RESNET50_IMG_PER_S = {"fp32": 426.0, "fp16": 1190.0}  # batch 128, 224x224, NVIDIA DeepLearningExamples
BUDGET_MIN = 15.0


def forward_flops_per_image(model: torch.nn.Module, size: int) -> float:
    x = torch.randn(2, 3, size, size)
    model.eval()
    with torch.no_grad():
        return measure.count_flops(lambda: model(x)) / 2


def main() -> None:
    prof = labkit.profile("full")
    resnet50 = torchvision.models.resnet50(weights=None)
    rate = {p: img_s * forward_flops_per_image(resnet50, 224) for p, img_s in T4_RESNET50_IMG_PER_S.items()}
    model, _ = models.build(prof.model, 10, pretrained=False)
    forward = forward_flops_per_image(model, prof.image_size)
    train_per_image = 3 * forward  # forward + backward (about twice the forward)
    print(f"T4 sustained rate on ResNet convolutions: fp32 {rate['fp32'] / 1e12:.2f} TFLOP/s, "
          f"mixed precision {rate['fp16'] / 1e12:.2f} TFLOP/s (from NVIDIA's published ResNet-50 throughput)")
    print(f"{prof.model} at {prof.image_size}x{prof.image_size}: {forward / 1e9:.2f} GFLOP forward, "
          f"{train_per_image / 1e9:.2f} GFLOP per training image; batch {prof.batch_size}: "
          f"{train_per_image * prof.batch_size / rate['fp32']:.3f} s per step in fp32, "
          f"{train_per_image * prof.batch_size / rate['fp16']:.3f} s in fp16")

    steps, batch, test = prof.max_steps, prof.batch_size, prof.test_size
    sweep_samples = prof.sweep_epochs * prof.train_size * len(prof.batch_sizes)
    # (precision, training images, test images evaluated) per notebook, from the notebooks' cells
    plans = {
        "00_start_here": [("fp32", (prof.warmup_steps + prof.repeats) * batch, 0),
                          ("fp32", 2 * steps * batch, 2 * test)],                      # baseline, from scratch
        "01_mixed_precision": [("fp32", 2 * steps * batch, 2 * test),                  # fp32, fp32 + TF32
                               ("fp16", steps * batch, test),                           # fp16 + GradScaler
                               ("fp32", prof.emulated_steps * batch, test),             # bf16, emulated on a T4
                               ("fp16", 11 * 2 * sum(prof.batch_sizes), 0),             # memory sweep
                               ("fp16", steps * batch, 0),                              # scaler trace
                               ("fp32", 2 * steps * batch, 2 * test),                   # channels_last, fp32
                               ("fp16", 2 * steps * batch, 2 * test)],                  # channels_last, fp16
        "02_batch_size": [("fp32", sweep_samples, len(prof.batch_sizes) * test),       # the batch sweep
                          ("fp32", 2 * sweep_samples, 2 * len(prof.batch_sizes) * test),  # lr scaled, + warm-up
                          ("fp32", 4 * steps * batch, 4 * test)],                      # grad_accum 1, 2, 4, 8
        "03_memory_savers": [("fp32", 1.3 * 6 * steps * batch, 6 * test),              # checkpoint trade-off
                             ("fp32", 2 * steps * batch, 2 * test),                     # 8-bit vs AdamW
                             ("fp32", 2.3 * steps * batch, 3 * test),                   # staged: fp32 stages
                             ("fp16", 2.3 * steps * batch, 2 * test)],                  # staged: AMP stages
    }
    for name, plan in plans.items():
        seconds = sum((images * train_per_image + tests * forward) / rate[p] for p, images, tests in plan)
        verdict = "within" if seconds / 60 <= BUDGET_MIN else "OVER"
        print(f"{name}: about {seconds / 60:.1f} min of T4 compute ({verdict} the {BUDGET_MIN:.0f}-minute budget)")


if __name__ == "__main__":
    main()

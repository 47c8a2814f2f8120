"""Structured pruning of half the channels of `small_cnn`: how much smaller and faster is the result?

Targets (issue 11): at least 1.9x fewer parameters and at least 1.6x lower CPU inference latency at batch
64. Latency is a ratio measured in one process, the two models timed in turns (`labkit.labs.pruning.latencies`),
so that machine noise hits both alike. Also reports FLOPs and the saved file's size, and the same for
unstructured pruning at 50 % (zeros stored densely: no change expected).

Usage: python benchmarks/pruning.py [--amount 0.5] [--batch 64] [--repeats 60]
Do not run it while other work loads the machine.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

import torch

import labkit
from labkit import measure, models
from labkit.labs import pruning as lab
from labkit.techniques import pruning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--amount", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = models.build("small_cnn", 10)[0].eval()  # labkit's pretrained weights (offline checkpoint)
    x = torch.randn(args.batch, 3, 32, 32)
    slim = pruning.prune_channels(model, args.amount, x[:2]).eval()
    zeros = pruning.l1_unstructured(copy.deepcopy(model), args.amount, scope="global").eval()
    prof = dataclasses.replace(labkit.profile("quick"), repeats=args.repeats)
    dense_s, slim_s, zeros_s = lab.latencies([model, slim, zeros], x, prof)
    params = [measure.count_parameters(m)[0] for m in (model, slim)]
    flops = [lab.forward_flops(m, x) for m in (model, slim)]
    size = [measure.model_size_bytes(m) for m in (model, slim, zeros)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, amount {args.amount}")
    print(f"structured:   parameters {params[0]:,} -> {params[1]:,} "
          f"({params[0] / params[1]:.2f}x fewer; target >= 1.9x)")
    print(f"              FLOPs per forward {flops[0] / flops[1]:.2f}x fewer, file {size[0] / size[1]:.2f}x smaller")
    print(f"              CPU latency {dense_s * 1e3:.2f} ms -> {slim_s * 1e3:.2f} ms "
          f"({dense_s / slim_s:.2f}x lower; target >= 1.6x)")
    print(f"unstructured: {pruning.sparsity(zeros).overall:.0%} zeros, file {size[2] / size[0]:.2f}x the dense one, "
          f"latency {zeros_s / dense_s:.2f}x the dense one")


if __name__ == "__main__":
    main()

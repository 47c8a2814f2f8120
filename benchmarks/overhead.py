"""How much does labkit's loop cost over a plain hand-written PyTorch loop?

Same model (pretrained small_cnn), same in-memory data and batches, same number of steps, in one
process, alternating labkit and plain runs so that machine noise hits both alike. Prints the ratio
of wall-clock times (target: within 3 % on CPU) and compares labkit's reported median step time
with the plain loop's own per-step median.

Usage: LABKIT_PROFILE=quick python benchmarks/overhead.py [--steps 200] [--rounds 5]
Do not run it while other work loads the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import labkit
from labkit import data, models, train


def plain_loop(cfg: labkit.RunConfig) -> tuple[float, float]:
    """The loop a careful person writes by hand: (wall seconds, median step seconds)."""
    start = time.perf_counter()
    prof = labkit.profile()
    splits = train.run_splits(cfg, prof)
    torch.manual_seed(cfg.seed)
    model, _ = models.build(cfg.model, splits["train"].num_classes, pretrained=cfg.pretrained)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loader = data.make_loader(splits["train"], batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed,
                              drop_last=True)
    step_times, step = [], 0
    while step < cfg.max_steps:
        for images, labels in loader:
            t0 = time.perf_counter()
            x = data.to_model_input(images, splits["train"], "cpu")
            loss = F.cross_entropy(model(x), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_times.append(time.perf_counter() - t0)
            step += 1
            if step == cfg.max_steps:
                break
    if not torch.isfinite(loss):
        raise FloatingPointError("plain loop diverged")
    return time.perf_counter() - start, statistics.median(step_times[prof.warmup_steps + 2:])


def labkit_loop(cfg: labkit.RunConfig) -> tuple[float, float]:
    start = time.perf_counter()
    res = labkit.fit(cfg, progress=False)
    return time.perf_counter() - start, res.step_time_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cfg = labkit.RunConfig(model="small_cnn", dataset="shapes10", batch_size=64, max_steps=args.steps,
                           evaluate=False, device="cpu")
    plain_loop(cfg), labkit_loop(cfg)  # warm both paths (data generation, allocator, threads)
    walls, steps, cpus = {"plain": [], "labkit": []}, {"plain": [], "labkit": []}, {"plain": [], "labkit": []}
    loops = [("plain", plain_loop), ("labkit", labkit_loop)]
    for round_index in range(args.rounds):
        # Alternate which goes first (ABBA...), so that drift in the machine's speed hits both alike.
        for name, loop in loops if round_index % 2 == 0 else loops[::-1]:
            cpu_start = time.process_time()
            wall, step = loop(cfg)
            cpus[name].append(time.process_time() - cpu_start)  # CPU time: blind to time stolen by neighbours
            walls[name].append(wall)
            steps[name].append(step)
    # Noise only ever adds time, so the fastest round is the best estimate of each loop's own cost;
    # the median is printed too, to show how noisy the machine was.
    ratio = min(walls["labkit"]) / min(walls["plain"])
    median_ratio = statistics.median(walls["labkit"]) / statistics.median(walls["plain"])
    step_ratio = statistics.median(steps["labkit"]) / statistics.median(steps["plain"])
    print(f"{args.steps} steps x {args.rounds} rounds, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for name in walls:
        print(f"  {name:>6}: wall min {min(walls[name]):.2f} s, median {statistics.median(walls[name]):.2f} s, "
              f"spread {max(walls[name]) / min(walls[name]) - 1:.0%}; "
              f"step median {statistics.median(steps[name]) * 1e3:.2f} ms")
    print(f"wall-clock ratio labkit/plain (fastest rounds): {ratio:.3f} "
          f"({(ratio - 1) * 100:+.1f} %; target within 3 %)")
    print(f"wall-clock ratio labkit/plain (median rounds): {median_ratio:.3f}")
    print(f"reported step time ratio labkit/plain: {step_ratio:.3f}")
    cpu_ratio = statistics.median(cpus["labkit"]) / statistics.median(cpus["plain"])
    print(f"process CPU-time ratio labkit/plain (median rounds): {cpu_ratio:.3f}")


if __name__ == "__main__":
    main()

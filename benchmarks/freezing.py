"""What does head-only freezing save against full fine-tuning? Optimizer state and step time, as ratios.

Target (notebook 05's issue): head-only optimizer state at most 10 % of full fine-tuning's, and a lower
step time. Same model, data and steps; the two runs alternate for ``--rounds`` rounds, so that machine
noise hits both alike, and the ratio of their median step times is reported with its spread. Runs are
not cached (every round trains). Optimizer state is the persistent state labkit counts
(`labkit.measure.optimizer_state_bytes`, in the run's memory breakdown); it does not depend on timing.

Usage: LABKIT_PROFILE=quick python benchmarks/freezing.py [--model small_cnn] [--steps 100] [--rounds 3]
Do not run it while other work loads the machine.
"""

from __future__ import annotations

import argparse
import statistics

import labkit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a labkit model name (default: the profile's)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the profile's)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    overrides = {"evaluate": False}
    if args.model:
        overrides["model"] = args.model
    if args.steps:
        overrides["max_steps"] = args.steps
    cfg = labkit.config.baseline(**overrides)
    env = labkit.env_report(cfg.device)
    print(f"{cfg.model} on {cfg.dataset}, batch {cfg.batch_size}, {cfg.max_steps} steps, {env['device']} "
          f"({env.get('gpu') or env.get('cpu')}), torch {env['torch']}, profile {env['profile']}")
    time_ratios, state_ratios = [], []
    for round_ in range(args.rounds):
        full = labkit.fit(cfg, progress=False)
        head = labkit.fit(cfg.replace(freeze="head_only"), progress=False)
        time_ratios.append(head.step_time_s / full.step_time_s)
        state_ratios.append(head.memory["optimizer_state"] / full.memory["optimizer_state"])
        print(f"round {round_ + 1}: step {full.step_time_s * 1e3:.2f} ms -> {head.step_time_s * 1e3:.2f} ms "
              f"({time_ratios[-1]:.3f}x); optimizer state {full.memory['optimizer_state']:,} B -> "
              f"{head.memory['optimizer_state']:,} B ({state_ratios[-1]:.4f}x); trainable parameters "
              f"{full.num_trainable_params:,} -> {head.num_trainable_params:,}")
    state, step = statistics.median(state_ratios), statistics.median(time_ratios)
    print(f"head_only / full: optimizer state {state:.4f}x (target <= 0.10: {'met' if state <= 0.10 else 'MISSED'}), "
          f"step time {step:.3f}x (median of {args.rounds}, range {min(time_ratios):.3f}-{max(time_ratios):.3f}; "
          f"target < 1: {'met' if step < 1 else 'MISSED'})")


if __name__ == "__main__":
    main()

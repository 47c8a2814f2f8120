"""One process against N on notebook 07's fine-tune: throughput, efficiency, launch cost, communication share.

Runs `labkit.labs.distributed.launch` for 1 and N processes, in turns, ``--repeats`` times each (``refresh``: no
cached job), at the same global batch, and prints the medians: step time, throughput, speed-up, efficiency
T1 / (N x TN), the all-reduce share of a profiled step and the seconds each job spends starting up
(torchrun, imports, the rendezvous). On a CPU one process uses every core through its threads and N
processes get cores / N threads each, so this measures how the cores are best used, not DDP's scaling
across devices; on N GPUs it measures that.

Usage: python benchmarks/distributed.py [--nproc 2] [--repeats 3] [--profile quick]
Do not run it while other work loads the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", default="quick")
    args = parser.parse_args()
    os.environ["LABKIT_PROFILE"] = args.profile
    import labkit  # after the profile is set
    from labkit.labs import distributed as lab

    cfg = lab.workload(labkit.profile())
    jobs = {1: [], args.nproc: []}
    for _ in range(args.repeats):
        for n in jobs:  # in turns, so that a slow spell of the machine hits both
            jobs[n].append(lab.launch(cfg, nproc=n, refresh=True, progress=False))
    rows = {}
    for n, runs in jobs.items():
        rows[n] = {
            "step_time_s": statistics.median(r.step_time_s for r in runs),
            "throughput": statistics.median(r.throughput for r in runs),
            "comm_share": statistics.median(r.distributed["communication"]["share"] for r in runs),
            "startup_s": statistics.median(r.distributed["launch_time_s"] - r.train_time_s for r in runs),
            "threads": runs[0].distributed["threads_per_rank"],
            "identical": all(len(set(r.distributed["weights_sha256"])) == 1 for r in runs),
        }
    one, many = rows[1], rows[args.nproc]
    env = labkit.env_report()
    print(f"{cfg.model} on {cfg.dataset}, global batch {cfg.batch_size}, {cfg.max_steps} steps, profile "
          f"{args.profile}; {env['device']} {env.get('gpu') or env.get('cpu_capability')}, torch {env['torch']}; "
          f"medians of {args.repeats} jobs each")
    for n, row in rows.items():
        print(f"  {n} process(es), {row['threads']} thread(s) each: {row['step_time_s'] * 1e3:.1f} ms a step, "
              f"{row['throughput']:.0f} samples/s, all-reduce share {row['comm_share']:.1%}, start-up "
              f"{row['startup_s']:.1f} s, identical weights on every rank: {row['identical']}")
    speedup = many["throughput"] / one["throughput"]
    print(f"  speed-up {speedup:.2f}x, efficiency {one['step_time_s'] / (args.nproc * many['step_time_s']):.0%}")


if __name__ == "__main__":
    main()

"""Notebook 07's exercises, with their checkers and worked solutions."""

from __future__ import annotations

import math

import torch
from torch.utils.data.distributed import DistributedSampler

from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, percent_not_fraction

EXERCISES = Exercises()


def _speedup_not_efficiency(value: float, expected: float) -> str | None:
    for n in (2, 4, 8):
        if math.isclose(value, expected * n, rel_tol=0.02):
            return f"that is the speed-up T1 / TN; the efficiency divides it by N ({n} here)"
    return percent_not_fraction(value, expected)


EXERCISES.add(Exercise(
    name="07.own_efficiency",
    template=("In your scaling run, one process took {t1_ms} ms per step of the global batch and {world_size} "
              "processes took {tn_ms} ms for the same batch. What is the scaling efficiency T1 / (N x TN), as a "
              "fraction (0..1)?"),
    numbers={"world_size": 2, "t1_ms": 176.0, "tn_ms": 134.0},
    solution="t1_ms / (world_size * tn_ms)",
    hint="efficiency = T1 / (N x TN): 1 means N processes did the step N times faster",
    rel_tol=0.02,
    diagnose=_speedup_not_efficiency,
    from_run=("world_size", "t1_ms", "tn_ms"),
))


def _ring_hint(value: float, expected: float) -> str | None:
    if math.isclose(value, expected / 2, rel_tol=0.02):
        return "that is one phase; a ring all-reduce is a reduce-scatter and then an all-gather, each (N-1)/N"
    if math.isclose(value, expected * 8 / 7, rel_tol=0.02):
        return "each phase sends (N-1)/N of the gradient, not all of it"
    return None


EXERCISES.add(Exercise(
    name="07.ring_bytes",
    template=("DDP all-reduces a model's gradients with a ring: each of N GPUs sends 2 (N-1) / N times the "
              "gradient's bytes per step. For a {millions}M-parameter model with float32 gradients on N = {n} "
              "GPUs, how many GB (1e9 bytes) does each GPU send per optimizer step?"),
    numbers={"millions": 124, "n": 8},
    solution="2 * (n - 1) / n * millions * 1e6 * 4 / 1e9",
    hint="gradient bytes = parameters x 4; times 2 (N-1) / N; divide by 1e9",
    rel_tol=0.01,
    diagnose=_ring_hint,
))


def shard_solution(num_samples: int, world_size: int, rank: int, seed: int, epoch: int) -> list[int]:
    """What DistributedSampler(shuffle=True, drop_last=True) gives ``rank`` in ``epoch``."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    used = num_samples // world_size * world_size  # drop_last: every rank gets as many
    return order[rank:used:world_size]


_SHARD_CASES = ((10, 2, 0, 0, 0), (10, 2, 1, 0, 0), (10, 2, 1, 0, 1), (13, 4, 3, 5, 2), (64, 3, 2, 1, 0))


def _check_shard(shard) -> str:
    for n, world, rank, seed, epoch in _SHARD_CASES:
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        sampler.set_epoch(epoch)
        expected = list(sampler)
        got = [int(i) for i in shard(n, world, rank, seed, epoch)]
        if got == expected:
            continue
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        block = n // world
        if got == order[rank * block:(rank + 1) * block]:
            raise WrongAnswer("07.shard: you gave each rank a contiguous block; DistributedSampler interleaves: rank r "
                              "takes positions r, r + N, r + 2N, ... of the epoch's permutation")
        if got == shard_solution(n, world, rank, seed, 0) and epoch:
            raise WrongAnswer("07.shard: the same order in every epoch. Hint: the permutation's generator is seeded "
                              "with seed + epoch (what set_epoch changes)")
        if sorted(got) == got:
            raise WrongAnswer("07.shard: your indices are in order; with shuffle=True they come from "
                              "torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))")
        if len(got) != len(expected):
            raise WrongAnswer(f"07.shard: {len(got)} indices for rank {rank} of {world} with {n} samples; expected "
                              f"{len(expected)}: drop_last keeps n // N x N of them, the same number per rank")
        raise WrongAnswer(f"07.shard: for n={n}, world_size={world}, rank={rank}, seed={seed}, epoch={epoch} you gave "
                          f"{got[:6]}..., DistributedSampler gives {expected[:6]}...")
    return ("Your shards equal DistributedSampler's on five cases: interleaved positions of one permutation per "
            "epoch (seed + epoch), the tail dropped so that every rank gets as many.")


EXERCISES.add(CodeExercise(
    name="07.shard",
    task=("Complete my_shard(num_samples, world_size, rank, seed, epoch) below: the sample indices this rank trains "
          "on in this epoch, as torch's DistributedSampler(shuffle=True, drop_last=True) gives them after "
          "set_epoch(epoch). Every rank draws the same permutation (same seed), so the ranks' shares never overlap."),
    checker=_check_shard,
    reference=shard_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

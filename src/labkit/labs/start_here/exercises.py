"""Notebook 00's exercises on start here, with their checkers and worked solutions (`Exercises`)."""

from __future__ import annotations

import time

from ...exercises import CodeExercise, Exercise, Exercises, WrongAnswer, percent_not_fraction

EXERCISES = Exercises()


EXERCISES.add(Exercise(
    name="00.throughput",
    template=("A training step on a batch of {batch_size} images takes a median of {step_time_ms} ms. "
              "What is the throughput in samples/s?"),
    numbers={"batch_size": 256, "step_time_ms": 80},
    solution="batch_size / (step_time_ms / 1e3)",
    hint="throughput = batch size / step time in seconds (convert the milliseconds first)",
))

EXERCISES.add(Exercise(
    name="00.mfu",
    template=("A step performs {flops_per_step} FLOPs and takes {step_time_s} s on a GPU whose datasheet "
              "peak for that precision is {peak_flops} FLOP/s. What fraction of the peak (0..1) is "
              "achieved? (Two significant digits are enough.)"),
    numbers={"flops_per_step": 3.0e12, "step_time_s": 0.25, "peak_flops": 65e12},
    solution="flops_per_step / step_time_s / peak_flops",
    hint=("achieved FLOP/s = FLOPs per step / step time; the fraction of the peak is achieved FLOP/s / "
          "peak FLOP/s"),
    rel_tol=0.03,
    diagnose=percent_not_fraction,
))


EXERCISES.add(Exercise(
    name="00.warmup_error",
    template=("Your own timing run: the very first call of a training step took {first_call_s} s, a warm step "
              "takes a median of {warm_median_s} s. Had you timed {steps} steps starting with the first call and "
              "reported their mean, how many times the warm median would your step time be?"),
    numbers={"first_call_s": 0.5, "warm_median_s": 0.05, "steps": 10},
    solution="(first_call_s + (steps - 1) * warm_median_s) / steps / warm_median_s",
    hint="the mean of the steps = (first call + (steps - 1) x warm step) / steps; divide it by the warm median",
    rel_tol=0.02,
    from_run=("first_call_s", "warm_median_s", "steps"),
))


def time_steps_solution(step, sync, warmup=3, repeats=10):
    import time

    for _ in range(warmup):
        step()
    sync()  # the warm-up's queued work must not land in the first timed step
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync()  # wait for the queued work before reading the clock
        times.append(time.perf_counter() - start)
    return times


class FakeAsyncDevice:
    """A pretend GPU: ``step()`` queues work (the first ``warmup`` steps slow), ``sync()`` waits for it;
    ``warmup_pending``: the first timed step was queued behind the warm-up's work (the call order, not the clock)."""

    def __init__(self, warmup: int, step_s: float = 0.01, first_s: float = 0.1):
        self.warmup, self.step_s, self.first_s = warmup, step_s, first_s
        self.calls = 0
        self.queued_s = 0.0
        self.warmup_pending = False

    def step(self) -> None:
        if self.calls == self.warmup:
            self.warmup_pending = self.queued_s > 0
        self.queued_s += self.first_s if self.calls < self.warmup else self.step_s
        self.calls += 1

    def sync(self) -> None:
        time.sleep(self.queued_s)
        self.queued_s = 0.0


def _check_timer(time_steps) -> str:
    warmup, repeats = 3, 8
    device = FakeAsyncDevice(warmup)
    times = time_steps(device.step, device.sync, warmup, repeats)
    try:
        times = [float(t) for t in times]
    except TypeError:
        raise WrongAnswer("00.timer: return a list with one time in seconds per timed step") from None
    if len(times) != repeats:
        raise WrongAnswer(f"00.timer: {len(times)} times returned for repeats={repeats}: one per timed step")
    if device.calls != warmup + repeats:
        raise WrongAnswer(f"00.timer: step() was called {device.calls} times; expected warmup + repeats = "
                          f"{warmup + repeats}")
    too_short = [t for t in times if t < 0.7 * device.step_s]
    if too_short:
        raise WrongAnswer(f"00.timer: a step of {device.step_s * 1e3:.0f} ms was timed as {min(too_short) * 1e3:.2f} "
                          "ms: the clock was read before the queued work finished. Hint: sync() before reading it")
    # Decided by the call order, not by the clock (a busy machine stretches any step, never shortens one).
    if device.warmup_pending:
        raise WrongAnswer(f"00.timer: your first timed step took {times[0] * 1e3:.0f} ms for a "
                          f"{device.step_s * 1e3:.0f} ms step: the warm-up's queued work landed in it. Hint: sync() "
                          "once after the warm-up loop")
    median = sorted(times)[len(times) // 2]
    return (f"On a pretend GPU, your timer measured a median of {median * 1e3:.1f} ms for a {device.step_s * 1e3:.0f} "
            "ms step, warm-up excluded, as labkit's StepTimer does.")


EXERCISES.add(CodeExercise(
    name="00.timer",
    task=("Complete the timer below: call step() `warmup` times untimed, then time `repeats` calls with "
          "time.perf_counter() and return the list of their durations in seconds. step() may return before its "
          "work is done (as on a GPU) and sync() waits until it is: no warm-up work may land in a timed step, and "
          "every timed step's work must be done before the clock is read."),
    checker=_check_timer,
    reference=time_steps_solution,
))

question, check, solution = EXERCISES.question, EXERCISES.check, EXERCISES.solution

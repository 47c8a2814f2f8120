"""labkit.labs.start_here: the timing demo and the sentences worded from a run's numbers."""

import pandas as pd
import torch

from labkit import measure
from labkit.labs import start_here
from labkit.labs.start_here.experiments import FromScratch, TimingDemo
from labkit.measure import TimingPitfalls
from labkit.result import RunResult


def test_timing_demo_times_both_warm_readings_with_their_spread(tiny_cfg):
    demo = start_here.timing_demo(tiny_cfg, warmup=1, repeats=3)
    assert list(demo.frame.method) == ["first call", "warm, synchronised", "warm, not synchronised"]
    tp = demo.pitfalls
    assert tp.repeats == 3 and tp.warm_median_s > 0 and tp.first_call_s > 0 and tp.device == "cpu"
    assert tp.warm_p10_s <= tp.warm_median_s <= tp.warm_p90_s
    assert tp.unsynced_p10_s <= tp.unsynced_median_s <= tp.unsynced_p90_s


def test_the_warm_readings_are_taken_alternately():
    calls = []
    tp = measure.timing_pitfalls(lambda: calls.append(len(calls)), torch.device("cpu"), warmup=2, repeats=4)
    assert len(calls) == 1 + 2 + 2 * 4 and tp.repeats == 4
    assert tp.warm_p10_s <= tp.warm_median_s <= tp.warm_p90_s


def _demo(first, warm, unsynced, device="cpu", spread=(0.9, 1.1)):
    tp = TimingPitfalls(first, warm, unsynced, device, 10, warm * spread[0], warm * spread[1], unsynced * spread[0],
                        unsynced * spread[1])
    return TimingDemo(tp.to_frame(), pitfalls=tp)


def _finding(*args, **kwargs) -> str:
    return " ".join(str(_demo(*args, **kwargs).finding()).split())  # unwrapped


def test_timing_on_gpu_flags_an_unsynchronised_clock():
    first, plain = str(_demo(0.5, 0.010, 0.001, "cuda").finding()).split("\n", 1)
    assert first == "First call 500 ms, 50.0x the warm median of 10 ms (slower): it paid one-off costs."
    assert " ".join(plain.split()) == ("Not synchronised: 1 ms, 0.10x the synchronised median (shorter): the clock "
                                       "stopped before the GPU had finished.")


def test_timing_on_gpu_when_cpu_bound_says_so():
    assert "(within the noise): launching the kernels (the CPU side) was the bottleneck" in _finding(0.5, 0.010,
                                                                                                      0.0095, "cuda")


def test_timing_on_cpu_calls_the_readings_the_same_within_their_spread():
    text = _finding(0.05, 0.010, 0.011)
    assert "1.10x the synchronised median (within the noise): as on any CPU, there is nothing to wait for" in text
    apart = _finding(0.05, 0.010, 0.015)  # spreads 9-11 ms and 13.5-16.5 ms do not overlap
    assert "(longer): the machine's load alone." in apart and "GPU" not in apart


def test_bare_pitfalls_have_no_spread_to_call_a_difference_by():
    tp = TimingPitfalls(first_call_s=0.5, warm_median_s=0.010, unsynced_median_s=0.001, device="cuda", repeats=10)
    text = str(TimingDemo(tp.to_frame(), pitfalls=tp).finding())
    assert "50.0x the warm median of 10 ms (no spread measured)." in text and "stopped" not in text


def _result(**overrides):
    values = dict(config={"model": "small_cnn", "dataset": "shapes10"}, steps=20, timed_steps=16,
                  step_time_s=0.04, step_time_p10_s=0.035, step_time_p90_s=0.05, throughput=1600.0,
                  peak_memory_bytes=31 * 2**20, accuracy=0.695, model_size_bytes=2**20, num_params=295490,
                  num_trainable_params=295490, flops_per_step=4.47e9, achieved_flops=1.1e11,
                  memory={"parameters": 2**20, "gradients": 2**20, "optimizer_state": 2 * 2**20,
                          "activations": 26 * 2**20, "other": 12 * 2**20})
    values.update(overrides)
    return RunResult(**values)


def test_headline_states_the_measured_numbers():
    text = start_here.headline(_result())
    assert "median 40.00 ms" in text and "16 timed steps; 4 warm-up" in text and "1600 samples/s" in text
    assert "31.00 MiB" in text and "69.5%" in text and "295,490 parameters" in text
    assert "no datasheet peak" in text
    text = start_here.headline(_result(reserved_memory_bytes=40 * 2**20, mfu=0.012, precision_used="bf16"))
    assert "max_memory_allocated" in text and "1.2% of this GPU's bf16 datasheet peak" in text


def test_memory_reports_reserved_gap_on_gpu_and_largest_category():
    text = start_here.memory(_result(reserved_memory_bytes=40 * 2**20))
    assert text.splitlines()[0] == ("Allocated peak 31.00 MiB, reserved 40.00 MiB: the cache held 9.00 MiB that no "
                                    "tensor used.")
    assert "The largest category is activations (26.00 MiB)" in text
    assert "a CPU has no cache" in start_here.memory(_result())


def _scratch(a, b) -> str:
    runs = {"pretrained": a, "scratch": b}
    return " ".join(str(FromScratch(pd.DataFrame({"run": list(runs)}), runs=runs).finding()).split())


def test_from_scratch_calls_an_accuracy_difference_real_beyond_the_test_sets_noise():
    a, b = _result(accuracy=0.98, env={"profile": "quick"}), _result(accuracy=0.5)
    assert _scratch(a, b) == (
        "pretrained: 98.0% vs scratch: 50.0% after the same 20 steps (+48.0 percentage points): pretrained is "
        "better beyond the test set's noise.")
    assert _scratch(_result(accuracy=0.52, env={"profile": "quick"}), b).endswith("(+2.0 percentage points): within "
                                                                                   "the noise.")


def test_memory_explains_why_category_peaks_exceed_the_total():
    at_peak = {"parameters": 2**20, "gradients": 2**20, "optimizer_state": 2 * 2**20, "activations": 20 * 2**20,
               "other": 0}
    text = start_here.memory(_result(memory_at_peak=at_peak))
    assert "add up to 42.00 MiB, more than the 24.00 MiB held at the peak" in text
    gpu = start_here.memory(_result(memory_at_peak=at_peak, reserved_memory_bytes=40 * 2**20))
    assert "7.00 MiB above the tracked tensors" in gpu


def test_flops_against_peaks_puts_the_run_beside_published_peaks_and_measured_runs():
    res = RunResult(config={"model": "small_cnn"}, precision_used="fp32", achieved_flops=81e9,
                    env={"device": "cpu", "gpu": None})
    result = start_here.flops_against_peaks(res, gpus=(("T4", "fp32"), ("T4", "fp16")))
    live, peaks = result.live, result.reference
    assert live.to_dict("records") == [{"setup": "your run (cpu, fp32)", "achieved_flops": 81e9, "source": "live"}]
    assert list(peaks.setup) == ["T4 fp32 peak", "T4 fp16 peak"]
    assert list(peaks.achieved_flops) == [8.1e12, 65e12]
    assert set(peaks.source) == {"published: NVIDIA datasheet peaks"}  # never presented as measured
    text = result.finding()
    assert text == "Your run achieved 0.081 TFLOP/s: 1.00% of the T4 fp32 peak, 0.12% of the T4 fp16 peak."

    measured = pd.DataFrame([{"gpu": "Tesla T4", "device": "cuda", "precision_used": "fp16",
                              "achieved_flops": 2e12, "source": "reference: Tesla T4 2026-11-01"}])
    with_runs = start_here.flops_against_peaks(res, measured, gpus=(("T4", "fp16"),))
    assert list(with_runs.reference.setup) == ["Tesla T4 run (fp16)", "T4 fp16 peak"]
    assert "of the T4 fp16 peak" in with_runs.finding()
    assert "Tesla T4 run" not in with_runs.finding()  # a measured run is no peak


def test_timing_says_when_the_first_call_was_already_warm():
    text = _finding(0.0105, 0.010, 0.010)  # 9.45-11.55 ms against the warm steps' 9-11 ms
    assert "1.1x the warm median of 10 ms (within the noise): this process was already warm" in text
    assert "one-off" not in text


def test_warmup_numbers_are_the_timing_demos_own_rounded():
    tp = TimingPitfalls(first_call_s=0.123456, warm_median_s=0.0456789, unsynced_median_s=0.04, device="cpu",
                        repeats=10)
    demo = TimingDemo(tp.to_frame(), pitfalls=tp)
    assert demo.warmup_numbers() == {"first_call_s": 0.123, "warm_median_s": 0.0457, "steps": 10}


def test_activation_share_is_the_activations_peak_over_the_step_peak():
    assert start_here.activation_share(_result()) == 26 / 31

"""labkit.labs.start_here: the timing demo and the sentences worded from a run's numbers."""

import pandas as pd
import torch

from labkit import measure
from labkit.labs import start_here
from labkit.measure import TimingPitfalls
from labkit.result import RunResult


def test_timing_demo_times_both_warm_readings_with_their_spread(tiny_cfg):
    tp = start_here.timing_demo(tiny_cfg, warmup=1, repeats=3)
    assert tp.repeats == 3 and tp.warm_median_s > 0 and tp.first_call_s > 0 and tp.device == "cpu"
    assert tp.warm_p10_s <= tp.warm_median_s <= tp.warm_p90_s
    assert tp.unsynced_p10_s <= tp.unsynced_median_s <= tp.unsynced_p90_s


def test_the_warm_readings_are_taken_alternately():
    calls = []
    tp = measure.timing_pitfalls(lambda: calls.append(len(calls)), torch.device("cpu"), warmup=2, repeats=4)
    assert len(calls) == 1 + 2 + 2 * 4 and tp.repeats == 4
    assert tp.warm_p10_s <= tp.warm_median_s <= tp.warm_p90_s


def _demo(first, warm, unsynced, device="cpu", warm_spread=(0.9, 1.1), unsynced_spread=(0.9, 1.1)):
    return TimingPitfalls(first, warm, unsynced, device, 10, warm * warm_spread[0], warm * warm_spread[1],
                                 unsynced * unsynced_spread[0], unsynced * unsynced_spread[1])


def test_timing_on_gpu_flags_an_unsynchronised_clock():
    text = start_here.timing(_demo(0.5, 0.010, 0.001, "cuda")).splitlines()
    assert text[0] == ("First call 500 ms, 50.0x the warm median of 10 ms (warm steps 9 ms-11 ms): it paid "
                       "one-off costs.")
    assert text[1] == ("Not synchronised: 1 ms, 0.10x the synchronised median: too small, the clock stopped before "
                       "the GPU had finished.")


def test_timing_on_gpu_when_cpu_bound_says_so():
    assert "the CPU side) was the bottleneck" in start_here.timing(_demo(0.5, 0.010, 0.0095, "cuda"))


def test_timing_on_cpu_calls_the_readings_the_same_within_their_spread():
    text = start_here.timing(_demo(0.05, 0.010, 0.011))
    assert "1.10x the synchronised median: the same within the noise, as on any CPU" in text
    apart = start_here.timing(_demo(0.05, 0.010, 0.015))  # spreads 9-11 ms and 13.5-16.5 ms do not overlap
    assert "apart by the machine's load alone" in apart and "GPU" not in apart


def test_timing_of_bare_pitfalls_uses_the_medians():
    tp = TimingPitfalls(first_call_s=0.5, warm_median_s=0.010, unsynced_median_s=0.001, device="cuda", repeats=10)
    text = start_here.timing(tp)
    assert "50.0x the warm median of 10 ms: it paid" in text and "too small" in text


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


def test_compare_accuracy_calls_a_difference_real_beyond_the_test_sets_noise():
    a, b = _result(accuracy=0.98, env={"profile": "quick"}), _result(accuracy=0.5)
    assert start_here.compare("pretrained", a, "scratch", b) == (
        "pretrained: 98.0% vs scratch: 50.0% after the same 20 steps (+48.0 percentage points, noise 3.9): "
        "pretrained is better, beyond the test set's noise.")
    close = start_here.compare("pretrained", _result(accuracy=0.52, env={"profile": "quick"}), "scratch", b)
    assert close.endswith("within the test set's noise.")


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
    live, peaks = start_here.flops_against_peaks(res, gpus=(("T4", "fp32"), ("T4", "fp16")))
    assert live.to_dict("records") == [{"setup": "your run (cpu, fp32)", "achieved_flops": 81e9, "source": "live"}]
    assert list(peaks.setup) == ["T4 fp32 peak", "T4 fp16 peak"]
    assert list(peaks.achieved_flops) == [8.1e12, 65e12]
    assert set(peaks.source) == {"published: NVIDIA datasheet peaks"}  # never presented as measured
    text = start_here.peaks_finding(live, peaks)
    assert text == "Your run achieved 0.081 TFLOP/s: 1.00% of the T4 fp32 peak, 0.12% of the T4 fp16 peak."

    measured = pd.DataFrame([{"gpu": "Tesla T4", "device": "cuda", "precision_used": "fp16",
                              "achieved_flops": 2e12, "source": "reference: Tesla T4 2026-11-01"}])
    _, rows = start_here.flops_against_peaks(res, measured, gpus=(("T4", "fp16"),))
    assert list(rows.setup) == ["Tesla T4 run (fp16)", "T4 fp16 peak"]
    assert "of the T4 fp16 peak" in start_here.peaks_finding(live, rows)
    assert "Tesla T4 run" not in start_here.peaks_finding(live, rows)  # a measured run is no peak


def test_timing_says_when_the_first_call_was_already_warm():
    text = start_here.timing(_demo(0.0105, 0.010, 0.010))  # inside the warm steps' 9-11 ms
    assert "1.1x the warm median" in text and "already warm" in text and "one-off" not in text


def test_warmup_numbers_are_the_timing_demos_own_rounded():
    tp = TimingPitfalls(first_call_s=0.123456, warm_median_s=0.0456789, unsynced_median_s=0.04, device="cpu",
                        repeats=10)
    assert start_here.warmup_numbers(tp) == {"first_call_s": 0.123, "warm_median_s": 0.0457, "steps": 10}


def test_activation_share_is_the_activations_peak_over_the_step_peak():
    assert start_here.activation_share(_result()) == 26 / 31

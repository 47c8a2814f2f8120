"""labkit.labs.start_here: the timing demo and the sentences worded from a run's numbers."""

import pandas as pd

from labkit.labs import start_here
from labkit.measure import TimingPitfalls
from labkit.result import RunResult


def test_timing_demo(tiny_cfg):
    tp = start_here.timing_demo(tiny_cfg, warmup=1, repeats=3)
    assert tp.repeats == 3 and tp.warm_median_s > 0 and tp.first_call_s > 0 and tp.device == "cpu"


def test_timing_on_gpu_flags_an_unsynchronised_clock():
    tp = TimingPitfalls(first_call_s=0.5, warm_median_s=0.010, unsynced_median_s=0.001, device="cuda", repeats=10)
    text = start_here.timing(tp)
    assert "50.0x the warm median of 10.00 ms" in text and "only 0.10x the real time" in text
    assert "cuBLAS/cuDNN handles" in text


def test_timing_on_gpu_when_cpu_bound_says_so():
    tp = TimingPitfalls(first_call_s=0.5, warm_median_s=0.010, unsynced_median_s=0.0095, device="cuda", repeats=10)
    assert "the CPU side was the bottleneck" in start_here.timing(tp)


def test_timing_on_cpu_explains_there_is_nothing_to_synchronise():
    tp = TimingPitfalls(first_call_s=0.05, warm_median_s=0.010, unsynced_median_s=0.011, device="cpu", repeats=10)
    text = start_here.timing(tp)
    assert "nothing to synchronise" in text and "1.10x" in text and "CUDA" not in text


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
    assert "reserved 40.00 MiB" in text and "held 9.00 MiB" in text and "The largest is activations" in text
    assert "no caching allocator" in start_here.memory(_result())


def test_compare_accuracy():
    a, b = _result(accuracy=0.98), _result(accuracy=0.5)
    assert start_here.compare("pretrained", a, "scratch", b) == (
        "pretrained: 98.0% vs scratch: 50.0% after the same 20 steps (+48.0 percentage points).")


def test_memory_explains_why_category_peaks_exceed_the_total():
    at_peak = {"parameters": 2**20, "gradients": 2**20, "optimizer_state": 2 * 2**20, "activations": 20 * 2**20,
               "other": 0}
    text = start_here.memory(_result(memory_at_peak=at_peak))
    assert "add up to 42.00 MiB, more than the 24.00 MiB held at the moment of the total peak" in text
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
    assert text.startswith("Your run achieved 0.081 TFLOP/s: 1.00% of the T4 fp32 peak, 0.12% of the T4 fp16 peak.")

    measured = pd.DataFrame([{"gpu": "Tesla T4", "device": "cuda", "precision_used": "fp16",
                              "achieved_flops": 2e12, "source": "reference: Tesla T4 2026-11-01"}])
    _, rows = start_here.flops_against_peaks(res, measured, gpus=(("T4", "fp16"),))
    assert list(rows.setup) == ["Tesla T4 run (fp16)", "T4 fp16 peak"]
    assert "of the T4 fp16 peak" in start_here.peaks_finding(live, rows)
    assert "Tesla T4 run" not in start_here.peaks_finding(live, rows)  # a measured run is no peak


def test_timing_says_when_the_first_call_was_already_warm():
    tp = TimingPitfalls(first_call_s=0.009, warm_median_s=0.010, unsynced_median_s=0.010, device="cpu", repeats=10)
    text = start_here.timing(tp)
    assert "0.9x the warm median" in text and "hardly slower" in text and "would overstate" not in text


def test_warmup_numbers_are_the_timing_demos_own_rounded():
    tp = TimingPitfalls(first_call_s=0.123456, warm_median_s=0.0456789, unsynced_median_s=0.04, device="cpu",
                        repeats=10)
    assert start_here.warmup_numbers(tp) == {"first_call_s": 0.123, "warm_median_s": 0.0457, "steps": 10}


def test_activation_share_is_the_activations_peak_over_the_step_peak():
    assert start_here.activation_share(_result()) == 26 / 31

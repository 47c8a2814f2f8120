"""labkit.labs.mixed_precision: notebook 01's experiments and the findings worded from them."""


import pandas as pd
import pytest

import labkit
from labkit import results
from labkit.errors import ConfigError
from labkit.labs import mixed_precision
from labkit.labs import mixed_precision as lab
from labkit.labs.mixed_precision.comparison import (
    Layouts,
    MemorySavings,
    Precisions,
    setup_label,
    speed_phrase,
    speedup,
)
from labkit.labs.mixed_precision.numerics import FP16_SMALLEST_SUBNORMAL, ScalerTrace


def test_gradient_underflow_counts_what_fp16_zeroes_and_scaling_keeps(tiny_cfg):
    df = mixed_precision.gradient_underflow(tiny_cfg.replace(batch_size=8), loss_multipliers=1e-3).set_index("run")
    assert list(df.index) == ["fp32", "fp16, no scaling", "fp16, loss scaled by 65536"]
    assert df.loc["fp32", "zeroed_gradients"] == 0 and df.loc["fp32", "max_rel_error"] == 0
    unscaled, scaled = df.loc["fp16, no scaling"], df.loc["fp16, loss scaled by 65536"]
    assert unscaled.zeroed_gradients > 100  # measured: thousands on small_cnn
    assert scaled.zeroed_gradients < unscaled.zeroed_gradients / 10
    assert scaled.max_rel_error < unscaled.max_rel_error
    assert unscaled.zeroed_fraction == pytest.approx(unscaled.zeroed_gradients / unscaled.num_gradients)
    assert df.fp32_below_fp16_subnormal.nunique() == 1 and df.fp32_below_fp16_subnormal.iloc[0] > 0


def test_smaller_losses_underflow_more(tiny_cfg):
    df = mixed_precision.gradient_underflow(tiny_cfg.replace(batch_size=8), loss_multipliers=(1.0, 1e-4))
    unscaled = df[df.run == "fp16, no scaling"].set_index("loss_multiplier").zeroed_gradients
    assert list(df.loss_multiplier) == [1.0] * 3 + [1e-4] * 3
    assert unscaled[1e-4] > unscaled[1.0]


def test_scaler_trace_halves_on_overflow_and_grows_after_clean_steps(tiny_cfg):
    # 8 steps: the ci profile's most for an emulated fp16 run; batch 8, as fp16 is emulated on most CPUs
    trace = mixed_precision.scaler_trace(tiny_cfg.replace(batch_size=8), steps=8, init_scale=2.0**19,
                                         growth_interval=2)
    assert list(trace.step) == list(range(1, 9))
    assert trace.skipped.iloc[0], "a 2**19 scale overflows fp16 (max 65504) at once"
    scales, skipped = trace.scale.tolist(), trace.skipped.tolist()
    clean_run = 0
    for i in range(len(scales) - 1):
        if skipped[i]:
            assert scales[i + 1] == scales[i] / 2  # backoff
            clean_run = 0
        else:
            clean_run += 1
            expected = scales[i] * 2 if clean_run == 2 else scales[i]  # growth after 2 clean steps
            assert scales[i + 1] == expected
            clean_run %= 2
    assert not all(skipped) and min(scales) < 2.0**19


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_autocast_policies_are_probed(dtype):
    df = mixed_precision.autocast_dtypes("cpu", dtype).set_index("op")
    low = {"fp16": "float16", "bf16": "bfloat16"}[dtype]
    assert df.loc["linear (matmul)", "autocast policy"] == "low precision"
    assert df.loc["linear (matmul)", "from float32"] == low
    assert df.loc["cross_entropy (loss)", "autocast policy"] == "float32"
    assert df.loc["relu", "autocast policy"] == "follows its input"
    assert df.loc["relu", "from low precision"] == low


def _frame(rows, env=None):
    return Precisions(mixed_precision.table(pd.DataFrame(rows)) if rows and "tf32" in rows[0] else pd.DataFrame(rows),
                      env=env or {})


def _unwrapped(text) -> str:
    return " ".join(str(text).split())


def _row(setup, step_time_s, peak, accuracy=0.5, spread=0.1, **extra):
    precision_name, tf32 = mixed_precision.SETUPS[setup]["precision"], mixed_precision.SETUPS[setup]["tf32"]
    return {"precision": precision_name, "precision_used": precision_name, "tf32": tf32, "step_time_s": step_time_s,
            "step_time_p10_s": step_time_s * (1 - spread), "step_time_p90_s": step_time_s * (1 + spread),
            "peak_memory_bytes": peak, "accuracy": accuracy, "error": None, "profile": "quick", **extra}


def test_table_labels_live_and_reference_rows_alike(tiny_cfg):
    two = {k: mixed_precision.SETUPS[k] for k in ("fp32", "bf16")}
    result = mixed_precision.compare(tiny_cfg.replace(batch_size=8, evaluate=False), setups=two, progress=False)
    df = result.frame
    assert list(df.setup) == ["fp32", "bf16"] and list(result.runs) == ["fp32", "bf16"]
    assert list(mixed_precision.table(df.drop(columns="setup")).setup) == ["fp32", "bf16"]
    assert list(mixed_precision.table(result.runs).setup) == ["fp32", "bf16"]
    assert setup_label("fp32", True) == "fp32 + TF32"
    assert setup_label("fp16", False) == "fp16 + GradScaler"


def test_summary_states_ratios_and_savings():
    MiB = 2**20
    df = _frame([_row("fp32", 0.040, 40 * MiB, 0.70), _row("bf16", 0.020, 30 * MiB, 0.69),
                 _row("fp16 + GradScaler", 0.080, 30 * MiB), _row("fp32 + TF32", 0.030, 40 * MiB)])
    text = _unwrapped(df.finding())
    assert text == ("fp16 + GradScaler: 0.50x fp32's speed (slower), peak memory 25% less, accuracy 50.0% vs 70.0% "
                    "(lower). bf16: 2.00x fp32's speed (faster), peak memory 25% less, accuracy 69.0% vs 70.0% "
                    "(within the noise). TF32: 1.33x fp32's speed (faster): a CPU has no TF32, both runs did the same "
                    "work.")
    assert _frame([_row("bf16", 0.02, MiB)]).finding() == "No successful fp32 run to compare against."


def test_a_speed_difference_is_real_only_outside_the_measured_spread():
    base = _row("fp32", 0.040, 1)
    assert speedup(_row("bf16", 0.030, 1), base).direction == 1  # 27-33 ms vs 36-44 ms
    assert speedup(_row("bf16", 0.034, 1, spread=0.2), base).direction == 0  # 27-41 ms overlaps
    assert speedup(_row("bf16", 0.050, 1), base).direction == -1
    assert speed_phrase(_row("bf16", 0.038, 1), base) == "1.05x fp32's speed (within the noise)"
    no_spread = {"step_time_s": 0.039}  # a reference row without the spread columns: nothing to call real by
    assert speed_phrase(no_spread, {"step_time_s": 0.040}) == "1.03x fp32's speed (no spread measured)"


def test_summary_says_when_an_emulated_runs_accuracy_comes_from_fewer_steps():
    MiB = 2**20
    df = _frame([_row("fp32", 0.040, 40 * MiB, 0.70, steps=160, planned_steps=None),
                 _row("fp16 + GradScaler", 0.600, 30 * MiB, 0.41, steps=40, planned_steps=160)])
    assert _unwrapped(df.finding()).endswith("accuracy 41.0% vs 70.0% (after 40 of 160 steps: emulated).")


def test_tf32_finding_depends_on_the_device():
    rows = [_row("fp32", 0.040, 1), _row("fp32 + TF32", 0.020, 1)]
    assert _unwrapped(_frame(rows, {"device": "cpu"}).finding()) == (
        "TF32: 2.00x fp32's speed (faster): a CPU has no TF32, both runs did the same work.")
    t4 = {"device": "cuda", "capability": "7.5"}
    assert "this GPU (capability 7.5) has no TF32" in _unwrapped(_frame(rows, t4).finding())
    a100 = {"device": "cuda", "capability": "8.0"}
    assert _frame(rows, a100).finding() == "TF32: 2.00x fp32's speed (faster)."
    assert "TF32" not in _frame([_row("fp32", 0.04, 1)], a100).finding()
    assert "no TF32" not in _unwrapped(_frame(rows, {"device": "cuda", "capability": "9.0"}).finding())


@pytest.mark.parametrize("env, expected", [
    ({"device": "cuda", "gpu": "Tesla P100-PCIE-16GB", "capability": "6.0"}, "no tensor cores"),
    ({"device": "cuda", "gpu": "Tesla T4", "capability": "7.5"}, "Here: fp16 + GradScaler (capability 7.5"),
    ({"device": "cuda", "gpu": "NVIDIA A100", "capability": "8.0"}, "Here: bf16 (capability 8.0: native bf16"),
    ({"device": "cpu", "bf16": True, "fp16_native": False}, "Here: bf16 (this CPU has bf16 instructions)"),
    ({"device": "cpu", "bf16": None, "fp16_native": None}, "Here: fp32 (bf16 support unknown)"),
])
def test_advice_by_capability(env, expected):
    assert expected in _unwrapped(Precisions(pd.DataFrame(), env=env).advice())


def test_advice_quotes_the_measured_ratios_and_follows_them_on_a_cpu():
    df = _frame([_row("fp32", 0.040, 1), _row("bf16", 0.020, 1), _row("fp16 + GradScaler", 0.400, 1)])
    cpu = {"device": "cpu", "bf16": True, "fp16_native": False}
    df.env = cpu
    assert _unwrapped(df.advice()) == (
        "Here: bf16 (this CPU has bf16 instructions). Measured: fp16 + GradScaler 0.10x, bf16 2.00x fp32's speed.")
    slow = _frame([_row("fp32", 0.040, 1), _row("bf16", 0.060, 1)], cpu)
    assert slow.advice().startswith("Here: fp32 (bf16 was not faster here).")


def test_memory_savings_grow_with_the_batch():
    MiB = 2**20

    def row(p, b, act):
        return {"precision": p, "batch_size": b, "error": None, "peak_memory_bytes": (5 + act) * MiB,
                "mem_activations_bytes": act * MiB, "mem_parameters_bytes": MiB, "mem_gradients_bytes": MiB,
                "mem_optimizer_state_bytes": 2 * MiB}

    df = _frame([row("fp32", 16, 8), row("bf16", 16, 4), row("fp32", 32, 16), row("bf16", 32, 8),
                 row("fp32", 64, 32), row("bf16", 64, 16)])
    assert _unwrapped(MemorySavings(df.frame, low="bf16").finding()) == (
        "bf16 saved 4.0 MiB (31% less) at batch 16 and 16.0 MiB (43% less) at batch 64; parameters, gradients and "
        "optimizer state unchanged: the saving grows with the batch.")


def test_channels_last_finding():
    df = _frame([{"precision": "fp32", "channels_last": False, "step_time_s": 0.04, "error": None},
                 {"precision": "fp32", "channels_last": True, "step_time_s": 0.02, "error": None}])
    df = df.frame.assign(step_time_p10_s=[0.035, 0.018], step_time_p90_s=[0.045, 0.022])
    assert Layouts(df).finding() == "channels_last, speed against the default layout: fp32 2.00x (faster)."
    df["step_time_p10_s"], df["step_time_p90_s"] = [0.03, 0.03], [0.05, 0.05]
    df.loc[1, "step_time_s"] = 0.041
    assert "fp32 0.98x (within the noise)" in Layouts(df).finding()


def test_compare_turns_a_failing_setup_into_an_error_row(tiny_cfg, monkeypatch):

    real = results.cached_fit

    def fake(cfg, **kwargs):
        if cfg.precision == "bf16":
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
        return real(cfg, **kwargs)

    monkeypatch.setattr(results, "cached_fit", fake)
    two = {k: mixed_precision.SETUPS[k] for k in ("fp32", "bf16")}
    result = mixed_precision.compare(tiny_cfg.replace(batch_size=8, evaluate=False), setups=two, progress=False)
    df = result.frame.set_index("setup")
    assert df.error.isna()["fp32"] and "CUBLAS_STATUS_NOT_SUPPORTED" in df.error["bf16"]
    assert result.finding() == ""  # the failed run is skipped: nothing left to compare


def test_formats_come_from_finfo():
    df = mixed_precision.formats().set_index("format")
    assert df.loc["fp16", "max"] == 65504.0 and df.loc["bf16", "max"] == pytest.approx(3.3895e38, rel=1e-3)
    assert df.loc["fp16", "smallest subnormal"] == 2.0**-24 == FP16_SMALLEST_SUBNORMAL
    assert df.loc["fp16", "smallest normal"] == 2.0**-14
    assert list(df["exponent bits"]) == [8, 5, 8] and list(df["mantissa bits"]) == [23, 10, 7]


def test_scaler_finding():

    trace = pd.DataFrame({"step": [1, 2, 3], "scale": [2.0**20, 2.0**19, 2.0**19], "skipped": [True, False, False]})
    assert _unwrapped(ScalerTrace(trace).finding()) == (
        "1 of 3 optimizer steps were skipped (inf/NaN gradients); the scale went from 2**20 to 2**19 by the last step.")


def _setups_frame():
    mib = 2**20
    rows = [("fp32", 0.10, 40, 30), ("fp32 + TF32", 0.10, 40, 30), ("fp16 + GradScaler", 0.05, 26, 16),
            ("bf16", 0.08, 24, 15)]
    return Precisions(pd.DataFrame([{"setup": s, "step_time_s": t, "peak_memory_bytes": p * mib,
                                     "mem_activations_bytes": a * mib, "error": None} for s, t, p, a in rows]))


def test_prediction_figures_come_from_the_frame():
    df = _setups_frame()
    assert df.peak_fraction("bf16") == 24 / 40 and df.speedup("fp16").ratio == 2.0
    assert df.speedup("fp16").band is None  # no spread recorded
    assert df.own_saving_numbers("bf16") == {"fp32_peak_mib": 40.0, "fp32_activations_mib": 30.0,
                                             "low_activations_mib": 15.0, "low": "bf16"}
    text = _unwrapped(df.own_saving("bf16"))
    assert text == ("From the activations alone: 37.5% of the fp32 peak; measured: bf16 saved 40.0% of it: the rest "
                    "is the other categories.")


def test_speedups_put_published_rows_beside_the_live_ones():
    published = labkit.load_reference("01_mixed_precision-speedup-published*")
    assert list(published.speedup_vs_fp32) == [2.0, 3.0]
    assert published.source.str.startswith("published: PyTorch recipe 'Automatic Mixed Precision'").all()
    live, reference = _setups_frame().speedups(published)
    assert dict(zip(live.setup, live.speedup_vs_fp32, strict=True))["fp16 + GradScaler"] == 2.0
    assert list(reference.speedup_vs_fp32) == [2.0, 3.0, pytest.approx(65 / 8.1)]
    assert reference.source.str.startswith("published: ").all()


def test_a_failed_setup_is_named_not_a_key_error():
    df = _setups_frame()
    df.frame.loc[df.frame.setup == "bf16", "error"] = "RuntimeError: bf16 is not supported"
    with pytest.raises(ConfigError, match=r"df=.setups .* is not allowed: a frame where bf16 ran successfully"):
        df.peak_fraction("bf16")
    assert df.speedup("fp16").ratio == 2.0  # the setups that ran still compare


def test_the_language_model_arm_compares_fp32_with_the_low_precision(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LABKIT_PROFILE", "ci")
    result = lab.lm_compare("bf16", max_steps=4)
    frame = result.frame
    assert frame.setup.tolist() == ["fp32", "bf16"] and (frame.model == "tiny_llama").all()
    assert (frame.tokens_per_s > 0).all() and frame.error.isna().all()
    assert frame.mem_activations_bytes.iloc[1] < frame.mem_activations_bytes.iloc[0]  # 16-bit activations
    text = _unwrapped(result.finding())
    assert text.startswith("On tiny_llama: bf16 ran") and "tokens/s against" in text


def test_the_fp16_weights_pitfall_fails_as_on_a_t4_and_the_doctor_names_it():
    pitfall = lab.fp16_weights_pitfall()
    assert pitfall["error"] == "Attempting to unscale FP16 gradients." and pitfall["trainable_dtype"] == "torch.float16"
    assert 0 < pitfall["fixed_loss"] < 10  # float32 trainable weights: the same fp16-autocast step trains
    finding = labkit.troubleshoot.explain(pitfall["error"])
    assert finding.problem and finding.symptom == "fp16_weights" and "float32" in finding.remedy
    assert "Attempting to unscale" in str(finding)
    assert labkit.troubleshoot.explain("CUDA error: device-side assert triggered") is None

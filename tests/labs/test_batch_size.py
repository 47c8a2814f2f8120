"""labkit.labs.batch_size: notebook 02's experiments and the findings worded from them."""

import math

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

import labkit
from labkit import capacity, models, plots
from labkit.errors import ConfigError
from labkit.labs import batch_size as batch_lab
from labkit.labs.batch_size import sweep
from labkit.labs.batch_size.accumulation import Accumulation
from labkit.labs.batch_size.learning_rate import LR_SETTINGS, LRScaling
from labkit.labs.batch_size.sweep import FOLK_CLAIMS, BatchSweep
from labkit.measure import accuracy_noise
from labkit.result import RunResult

# models


def test_without_batchnorm():
    model = labkit.models.build("small_cnn", 10, pretrained=False)[0]
    count = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    stripped = batch_lab.without_batchnorm(model)
    assert stripped is model and count == 7 and not models.has_batchnorm(stripped)
    assert sum(isinstance(m, torch.nn.Identity) for m in stripped.modules()) == count
    assert stripped(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert isinstance(batch_lab.without_batchnorm(torch.nn.BatchNorm1d(3)), torch.nn.Identity)


def test_accumulation_matches_the_whole_batch_except_with_batchnorm_in_train_mode(tiny_cfg):
    result = batch_lab.accumulation_table(tiny_cfg, accum_steps=4)
    table = result.frame
    gaps = dict(zip(table.batchnorm, table.max_abs_grad_diff, strict=True))
    relative = dict(zip(table.batchnorm, table.relative_diff, strict=True))
    assert table.micro_batch_size.tolist() == [8, 8, 8]
    assert gaps["none"] < 1e-6 and relative["none"] < 1e-5  # float rounding
    assert gaps["eval"] < 1e-5 and relative["eval"] < 1e-4
    assert gaps["train"] > 1e-2 and relative["train"] > 0.1  # each micro-batch has its own statistics
    assert batch_lab.accumulation_table(tiny_cfg, 4, modes=["none"]).max_abs_grad_diff[0] == gaps["none"]
    assert batch_lab.accumulation_table(tiny_cfg, 1, modes=["train"]).max_abs_grad_diff[0] == 0.0
    assert result.finding().startswith("Largest gradient difference relative to the largest entry: ")
    assert "with BatchNorm train, " in result.finding() and "relative_diff" in repr(result)


def test_accumulation_gap_rejects_bad_input(tiny_cfg):
    with pytest.raises(ConfigError, match=r"accum_steps=5 is not allowed: a divisor of batch_size=32"):
        batch_lab.accumulation_table(tiny_cfg, 5)
    with pytest.raises(ConfigError, match=r"batchnorm='frozen' is not allowed: 'train'"):
        batch_lab.accumulation_table(tiny_cfg, 4, modes=["frozen"])
    with pytest.raises(ConfigError, match=r"accum_steps=32 is not allowed: at most batch_size / 2 = 16"):
        batch_lab.accumulation_table(tiny_cfg, 32)


def test_batch_sweep_columns_epoch_time_and_cache(tiny_cfg, monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    result = batch_lab.batch_sweep(tiny_cfg, [16, 32], lr_scaling="linear", base_batch_size=16, epochs=1)
    df = result.frame
    assert result.finding() == f"Epoch time comes within 10 % of the fastest ({sweep.seconds(df.epoch_time_s.min())} " \
        f"at batch {df.batch_size[df.epoch_time_s.idxmin()]}) from batch {result.floor()} on."
    for column in ("batch_size", "step_time_s", "peak_memory_bytes", "accuracy", "error", "steps_per_epoch",
                   "epoch_time_s", "epoch_time_p10_s", "epoch_time_p90_s", "lr", "lr_scaling", "inference_time_s",
                   "inference_time_p10_s", "inference_time_p90_s", "inference_per_sample_s"):
        assert column in df, column
    assert df.error.isna().all() and df.max_steps.isna().all() and df.epochs.eq(1).all()
    assert df.steps_per_epoch.tolist() == [8, 4] and df.steps.tolist() == [8, 4]
    assert df.epoch_time_s.tolist() == pytest.approx((df.step_time_s * df.steps_per_epoch).tolist())
    assert df.epoch_time_p90_s.tolist() == pytest.approx((df.step_time_p90_s * df.steps_per_epoch).tolist())
    assert (df.inference_time_p10_s <= df.inference_time_s).all()
    assert (df.inference_time_s <= df.inference_time_p90_s).all()
    assert df.lr.tolist() == pytest.approx([1e-3, 2e-3]) and set(df.lr_scaling) == {"linear"}
    assert (df.inference_time_s > 0).all()
    batches = [labkit.profile().test_size / size for size in (16, 32)]  # the test split in batches of 16 and 32
    assert df.inference_time_s.tolist() == pytest.approx((df.inference_batch_latency_s * batches).tolist())
    assert df.inference_per_sample_s.tolist() == pytest.approx((df.inference_batch_latency_s / [16, 32]).tolist())

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cached result should have been used")

    monkeypatch.setattr("labkit.results.fit", must_not_run)
    monkeypatch.setattr(sweep._InferenceTimer, "measure", must_not_run)
    again = batch_lab.batch_sweep(tiny_cfg, [16, 32], lr_scaling="linear", base_batch_size=16, epochs=1)
    pd.testing.assert_frame_equal(again.frame, df)


def test_batch_sweep_defaults_come_from_the_profile(tiny_cfg, monkeypatch):
    ran = []

    def run_configs(configs, refresh=False, progress=True):
        ran.extend(configs)
        return [RunResult(config=c.to_dict(), error="ConfigError: skipped") for c in configs]

    monkeypatch.setattr("labkit.results.run_configs", run_configs)
    result = batch_lab.batch_sweep(tiny_cfg.replace(batch_size=16), lr_scaling="sqrt")
    df = result.frame
    assert result.finding() == "No run finished: no epoch time to compare."
    prof = labkit.profile()
    assert [c.batch_size for c in ran] == list(prof.batch_sizes) == [8, 16, 32, 64]
    assert all(c.epochs == prof.sweep_epochs and c.max_steps is None for c in ran)
    assert [c.lr for c in ran] == pytest.approx([1e-3 * math.sqrt(b / 16) for b in prof.batch_sizes])
    assert df.error.notna().all() and df.epoch_time_s.isna().all() and df.inference_time_s.isna().all()
    with pytest.raises(ConfigError, match=r"lr_scaling='cube' is not allowed: False, True"):
        batch_lab.batch_sweep(tiny_cfg, lr_scaling="cube")
    with pytest.raises(ConfigError, match=r"grad_accum=4 is not allowed: a divisor of batch_size=6"):
        batch_lab.batch_sweep(tiny_cfg.replace(grad_accum=4), [8, 6])
    assert len(ran) == 4  # invalid sweeps run nothing


def _sweep_frame(accuracy, inference_s=(0.040, 0.041, 0.042, 0.043), epoch_s=(0.5, 0.4, 0.3, 0.28), spread=0.02):
    """A batch_sweep frame; each timing's p10-p90 spread is its value -/+ ``spread`` (a share)."""
    sizes = [8, 16, 32, 64]
    frame = pd.DataFrame({"batch_size": sizes, "peak_memory_bytes": [4e6 + 4e5 * b for b in sizes],
                          "epoch_time_s": list(epoch_s), "inference_time_s": list(inference_s),
                          "accuracy": list(accuracy), "profile": "ci", "error": None})
    for column in ("epoch_time", "inference_time"):
        frame[f"{column}_p10_s"] = frame[f"{column}_s"] * (1 - spread)
        frame[f"{column}_p90_s"] = frame[f"{column}_s"] * (1 + spread)
    return frame


def folk_claims(frame):
    return BatchSweep(frame).claims().frame


MEMORY, EPOCH, INFERENCE, ACCURACY = FOLK_CLAIMS


def test_folk_claims_verdicts_follow_the_numbers_and_the_noise():
    claims = folk_claims(_sweep_frame([0.90, 0.85, 0.70, 0.60])).set_index("claim")
    assert list(claims.index) == list(FOLK_CLAIMS)
    assert claims.loc[MEMORY, "verdict"] == "reproduced"
    assert claims.loc[MEMORY, "measured"] == "peak = 3.81 MiB + 391 KiB x batch, R^2 above 0.999"
    assert claims.loc[EPOCH, "measured"] == "0.5 s per epoch at batch 8, 0.28 s at 64: 0.56x (faster)"
    assert claims.loc[EPOCH, "verdict"] == "reproduced"
    # 40 to 43 ms: the slowest's p10 (42.1 ms) lies above the fastest's p90 (40.8 ms): a real, if small, change
    assert claims.loc[INFERENCE, "verdict"] == "refuted"
    assert claims.loc[ACCURACY, "verdict"] == "reproduced"
    assert claims.loc[ACCURACY, "measured"] == ("mean accuracy 87.5% at batches 8, 16, 65.0% at 32, 64; on 128 test "
                                                "images: better for small batches")  # ci's 128 test images
    assert claims.loc[INFERENCE, "measured"].endswith("43 ms at 64: 1.07x (slower)")
    noisy = folk_claims(_sweep_frame([0.7] * 4, spread=0.5)).set_index("claim").verdict
    assert noisy[EPOCH] == "inconclusive" and noisy[INFERENCE] == "reproduced"  # within the spread
    refuted = folk_claims(_sweep_frame([0.60, 0.80, 0.75, 0.90], inference_s=(0.08, 0.05, 0.04, 0.03),
                                       epoch_s=(0.3, 0.4, 0.5, 0.6))).set_index("claim").verdict
    assert list(refuted) == ["reproduced", "refuted", "refuted", "refuted"]
    flat = folk_claims(_sweep_frame([0.7] * 4, epoch_s=(0.5, 0.5, 0.5, 0.5))).set_index("claim")
    assert flat.verdict[EPOCH] == "inconclusive" and flat.measured[EPOCH].endswith("1x (within the noise)")
    turning = folk_claims(_sweep_frame([0.7, 0.8, 0.75, 0.6], epoch_s=(0.5, 0.3, 0.2, 0.35)))
    turning = turning.set_index("claim").loc[EPOCH]
    assert turning.verdict == "partly: falls up to batch 32, then rises"
    assert turning.measured.endswith("; fastest 0.2 s at batch 32")
    old = _sweep_frame([0.7] * 4).drop(columns=["epoch_time_p10_s", "inference_time_p90_s"])  # no spread cached
    assert set(folk_claims(old).verdict[1:3]) == {"inconclusive"}
    assert folk_claims(old).measured[1].endswith("(no spread measured)")
    flat = folk_claims(_sweep_frame([0.700, 0.701, 0.700, 0.701])).set_index("claim").verdict
    assert flat[ACCURACY] == "inconclusive"  # 0.1 pp < one of 128 images
    # the smallest batch beats the largest, but the halves do not differ: one end decides nothing
    ends = folk_claims(_sweep_frame([0.90, 0.70, 0.90, 0.70])).set_index("claim")
    assert ends.verdict[ACCURACY] == "inconclusive"
    assert ends.measured[ACCURACY].startswith("mean accuracy 80.0% at batches 8, 16, 80.0% at 32, 64")
    with pytest.raises(ConfigError, match="at least 3 successful batch sizes"):
        folk_claims(_sweep_frame([0.7] * 4).iloc[:2])


def test_estimate_frame_keeps_every_category():
    frame = batch_lab.estimate_frame({"parameters": 10, "activations": 30, "total": 40})
    assert list(frame.category) == ["parameters", "activations", "total"]
    assert list(frame.predicted_bytes) == [10, 30, 40]


def test_prediction_table_checks_the_line_against_measured_steps(tiny_cfg):
    table = batch_lab.prediction_table(tiny_cfg, fit_sizes=(16, 32), check_sizes=(64, 96))
    assert list(table.kind) == ["predicted from 16 and 32", "measured"] * 2
    measured = table[table.kind == "measured"].set_index("batch_size").peak_memory_bytes
    assert measured[64] == capacity.step_memory(tiny_cfg, 64).total_bytes
    predicted = table[table.kind != "measured"].set_index("batch_size")
    assert predicted.prediction_error[96] == pytest.approx(predicted.peak_memory_bytes[96] / measured[96] - 1)
    assert predicted.prediction_error.abs().max() < 0.1
    assert table.finding().startswith("Predicted from 16 and 32: off by ")


def test_the_prediction_chart_draws_predicted_and_measured_lines(tiny_cfg):
    # The chart once read the prediction's error column as failed runs and dropped the predicted rows.
    table = batch_lab.prediction_table(tiny_cfg, fit_sizes=(16, 32), check_sizes=(64, 96))
    ax = plots.line(table.frame, x="batch_size", y="peak_memory_bytes", hue="kind", logx=True)
    drawn = {line.get_label(): list(line.get_xdata()) for line in ax.lines}
    assert drawn == {"kind=predicted from 16 and 32": [64, 96], "kind=measured": [64, 96]}
    assert "failed" not in ax.get_title()
    plt.close("all")


def test_compare_lr_scaling_labels_three_sweeps(tiny_cfg):
    cfg = tiny_cfg.replace(max_steps=None, evaluate=True)
    df = batch_lab.compare_lr_scaling(cfg, warmup_steps=1, batch_sizes=[8, 16], base_batch_size=16, progress=False)
    assert list(df.lr_setting) == ["same lr"] * 2 + ["scaled"] * 2 + ["scaled + warm-up"] * 2
    assert list(df.lr) == [1e-3, 1e-3, 5e-4, 1e-3, 5e-4, 1e-3]
    assert list(df.lr_warmup_steps) == [0, 0, 0, 0, 1, 1]
    text = df.finding()
    assert text.startswith("Accuracy, counting only differences beyond the test-set noise: ") and "\n" not in text
    with pytest.raises(ConfigError, match="warmup_steps=0 is not allowed"):
        batch_lab.compare_lr_scaling(cfg, warmup_steps=0)


def test_accumulation_finding_calls_a_time_change_real_only_outside_the_spread():
    df = pd.DataFrame({"grad_accum": [2, 1], "batch_size": 64, "peak_memory_bytes": [10 * 2**20, 20 * 2**20],
                       "step_time_s": [0.06, 0.04], "step_time_p10_s": [0.055, 0.035],
                       "step_time_p90_s": [0.065, 0.045], "error": None})
    assert Accumulation(df).finding() == (
        "grad_accum=2 against 1, the same batch of 64 in micro-batches of 32: peak 20 MiB -> 10 MiB (50% less), "
        "step 40 ms -> 60 ms: 1.5x (slower).")
    df["step_time_p10_s"] = [0.03, 0.03]
    assert Accumulation(df).finding().endswith("step 40 ms -> 60 ms: 1.5x (within the noise).")


def test_run_with_lr_scaling_scales_from_the_base(tiny_cfg):
    res = batch_lab.run_with_lr_scaling(tiny_cfg.replace(evaluate=False), lr_scaling="linear", base_batch_size=16)
    assert res.config["lr"] == pytest.approx(2e-3)  # batch 32 = 2 x 16
    res = batch_lab.run_with_lr_scaling(tiny_cfg.replace(evaluate=False), lr_scaling=False)
    assert res.config["lr"] == 1e-3


def test_lr_scaling_finding_names_a_winner_only_beyond_the_noise():
    df = pd.DataFrame({"batch_size": 64, "lr_setting": list(LR_SETTINGS), "lr": [1e-3, 1e-3, 1e-3],
                       "accuracy": [0.65, 0.80, 0.79], "profile": "ci", "error": None})
    noise = accuracy_noise(0.80, 128)
    assert noise == pytest.approx(2 * math.sqrt(2 * 0.8 * 0.2 / 128))  # 10 points on ci's 128 test images
    finding = LRScaling(df).finding()
    assert finding == ("Accuracy, counting only differences beyond the test-set noise: scaled and scaled + warm-up "
                       "ahead at batch 64.")
    df.loc[2, "accuracy"] = 0.60
    assert LRScaling(df).finding().endswith(": scaled ahead at batch 64.")
    df["accuracy"] = [0.80, 0.79, 0.78]
    assert LRScaling(df).finding().endswith(": no clear winner at batch 64.")
    two = pd.concat([df, df.assign(batch_size=8, accuracy=[0.9, 0.6, 0.6])], ignore_index=True)
    assert LRScaling(two).finding().endswith(": same lr ahead at batch 8; no clear winner at batch 64.")


def test_epoch_time_floor_is_the_first_batch_within_ten_percent_of_the_fastest():
    result = BatchSweep(_sweep_frame([0.7] * 4, epoch_s=(0.50, 0.30, 0.26, 0.25)))
    assert result.floor() == 32  # 0.26 <= 1.1 x 0.25; 0.30 is not
    assert result.floor(within=0.5) == 16
    assert result.finding() == "Epoch time comes within 10 % of the fastest (0.25 s at batch 64) from batch 32 on."


def test_the_fitted_line_against_the_search():
    line = capacity.LinearMemory(fixed_bytes=3.14159 * 2**20, bytes_per_sample=163.7 * 1024, r2=0.999)
    numbers = batch_lab.max_batch_numbers(line, 40 * 2**20)
    assert numbers == {"fixed_mib": 3.14, "kib_per_sample": 164.0, "budget_mib": 40.0}
    same = "Your line predicts batch 230; find_max_batch_size found 230: the same."
    assert batch_lab.line_vs_search(numbers, 230) == same
    assert batch_lab.line_vs_search(numbers, 200) == ("Your line predicts batch 230; find_max_batch_size found 200 by "
                                                      "probing single steps (30 more, +15%).")
    assert "not even one sample fits" in batch_lab.line_vs_search(numbers, 0)


def test_accumulation_on_a_language_model_keeps_the_losses_and_lowers_the_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LABKIT_PROFILE", "ci")
    frame = batch_lab.lm_accumulation(grad_accum=(1, 4), batch_size=8)
    assert frame.micro_batch_rows.tolist() == [8, 2] and (frame.tokens_per_step == 8 * 128).all()
    assert (frame.loss_diff < 1e-5).all() and frame.pad_fraction.iloc[0] > 0.1  # uneven label tokens per row
    assert frame.peak_memory_bytes.iloc[1] < 0.7 * frame.peak_memory_bytes.iloc[0]
    text = frame.finding()
    assert text.startswith("1,024 tokens a step (8 rows,") and "the step losses match one large batch's" in text

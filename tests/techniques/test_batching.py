import contextlib
import math

import pandas as pd
import pytest
import torch

import labkit
from labkit.errors import ConfigError
from labkit.result import MEMORY_CATEGORIES, RunResult
from labkit.techniques import batching
from labkit.techniques.batching import Probe, search_batch_size

# --- the search, with a faked out-of-memory error (accelerate's test_memory_utils pattern) -------------


CUDA_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def oom_above(largest: int, error: Exception = CUDA_OOM):
    def fits(batch_size):
        if batch_size > largest:
            raise error
        return True

    return fits


@pytest.fixture
def freed(monkeypatch):
    """Count the frees after out-of-memory errors (and skip the slow gc.collect they run)."""
    calls = []
    monkeypatch.setattr(batching, "free_memory", lambda: calls.append(True))
    return calls


def sizes(search):
    return [p.batch_size for p in search.tried]


def test_search_doubles_then_bisects_to_the_exact_largest_size(freed):
    search = search_batch_size(oom_above(100), start=8, limit=1024)
    assert sizes(search) == [8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101]
    assert [p.fits for p in search.tried] == [True] * 4 + [False, True, False, False, True, False, False]
    assert search.best == 100 and not search.hit_limit
    assert all(p.peak_bytes is None for p in search.tried) and len(freed) == 5


def test_search_backs_off_on_a_runtime_error_saying_out_of_memory(freed):
    search = search_batch_size(oom_above(40, RuntimeError("CUDA out of memory. Tried to allocate 20 MiB")), start=32)
    assert sizes(search) == [32, 64, 48, 40, 44, 42, 41] and search.best == 40
    assert len(freed) == sum(not p.fits for p in search.tried) == 5


def test_search_when_start_fails_bisects_down_from_zero(freed):
    search = search_batch_size(oom_above(5), start=64)
    assert sizes(search) == [64, 32, 16, 8, 4, 6, 5] and search.best == 5


def test_search_stops_at_the_limit_and_says_so():
    search = search_batch_size(lambda b: True, start=8, limit=50)
    assert sizes(search) == [8, 16, 32, 50] and search.best == 50 and search.hit_limit


def test_search_never_tries_below_the_minimum_and_reports_none_fits():
    search = search_batch_size(lambda b: False, start=8, minimum=2)
    assert sizes(search) == [8, 4, 2] and search.best == 0


def test_search_records_measured_peaks_and_frames_them():
    search = search_batch_size(lambda b: (b * 10 <= 250, b * 10), start=16, limit=64)
    assert search.tried == [(16, True, 160), (32, False, 320), (24, True, 240), (28, False, 280), (26, False, 260),
                            (25, True, 250)]
    assert search.best == 25
    frame = search.to_frame()
    assert list(frame.columns) == ["step", "batch_size", "fits", "peak_bytes"] and frame.step.tolist() == [1, 2, 3, 4, 5, 6]


def test_other_errors_propagate():
    def fits(batch_size):
        if batch_size > 16:
            raise ValueError("Expected more than 1 value per channel")
        return True

    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        search_batch_size(fits, start=8)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        search_batch_size(lambda b: (_ for _ in ()).throw(RuntimeError("shape mismatch")), start=8)


def test_search_rejects_bad_arguments():
    with pytest.raises(ConfigError, match=r"start=1 is not allowed: an integer >= 2"):
        search_batch_size(lambda b: True, start=1, minimum=2)
    with pytest.raises(ConfigError, match=r"limit=4 is not allowed: an integer >= 8"):
        search_batch_size(lambda b: True, start=8, limit=4)
    with pytest.raises(ConfigError, match=r"fits=3 is not allowed: a function"):
        search_batch_size(3)


def test_out_of_memory_recognition():
    assert batching.is_out_of_memory(torch.OutOfMemoryError("x"))
    assert batching.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 1 GiB"))
    assert batching.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to ..."))
    assert not batching.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not batching.is_out_of_memory(ValueError("out of memory"))


# --- real measured steps on the CPU ------------------------------------------------------------


def test_find_max_batch_size_with_a_budget_is_exact(tiny_cfg):
    budget = 20 * 2**20
    search = batching.batch_search(tiny_cfg, budget_bytes=budget)
    best = search.best
    assert labkit.find_max_batch_size(tiny_cfg, budget_bytes=budget) == best
    peaks = {p.batch_size: p.peak_bytes for p in search.tried}
    assert peaks[best] <= budget < peaks[best + 1]
    assert 30 < best < 60 and search.tried[0] == (32, True, peaks[32])  # starts at cfg.batch_size
    # A fresh measurement agrees: the answer fits and one more sample does not.
    assert batching.step_memory(tiny_cfg, best).peak_bytes == peaks[best]
    assert batching.step_memory(tiny_cfg, best + 1).peak_bytes > budget
    assert search.budget_bytes == budget and search.device == "cpu" and search.elapsed_s > 0


def test_search_with_grad_accum_tries_multiples_only(tiny_cfg):
    cfg = tiny_cfg.replace(grad_accum=4)
    search = batching.batch_search(cfg, budget_bytes=12 * 2**20, limit=1000)
    assert all(p.batch_size % 4 == 0 for p in search.tried) and search.best % 4 == 0
    peaks = {p.batch_size: p.peak_bytes for p in search.tried}
    assert peaks[search.best] <= 12 * 2**20 < peaks[search.best + 4]
    assert search.limit == 1000  # a multiple of 4


def test_the_step_measured_for_the_search_is_the_step_fit_measures(tiny_cfg):
    res = labkit.fit(tiny_cfg.replace(evaluate=False))
    mem = batching.step_memory(tiny_cfg, tiny_cfg.batch_size)
    assert mem.peak_bytes == res.peak_memory_bytes == mem.total_bytes
    assert set(mem.by_category) == set(MEMORY_CATEGORIES)


def test_budget_below_the_models_own_memory(tiny_cfg):
    with pytest.raises(ConfigError, match=r"budget_bytes=1048576 is not allowed: at least the model's own "
                                          r"4731764 bytes \(4\.5 MiB\): parameters 1185792 \+ gradients 1181960 \+ "
                                          r"adamw state 2364012"):
        labkit.find_max_batch_size(tiny_cfg, budget_bytes=2**20)


def test_computed_model_memory_matches_the_measured_step(tiny_cfg):
    # At 2 samples the peak is inside optimizer.step(): parameters, gradients and state are all alive.
    mem = batching.step_memory(tiny_cfg, 2)
    model = labkit.models.build("small_cnn", 10)[0]
    state = batching.state_bytes(model, tiny_cfg)
    assert {k: mem.by_category[k] for k in ("parameters", "gradients", "optimizer_state")} == {
        k: state[k] for k in ("parameters", "gradients", "optimizer_state")}
    sgd = batching.state_bytes(model, tiny_cfg.replace(optimizer="sgd", momentum=0.0))
    assert sgd["optimizer_state"] == 0 and sgd["total"] == state["parameters"] + state["gradients"]


def test_budget_too_small_for_the_smallest_batch(tiny_cfg):
    with pytest.raises(ConfigError, match=r"budget_bytes=5000000 is not allowed: enough for the smallest batch: "
                                          r"2 samples \(small_cnn has BatchNorm.*\) need \d+ bytes"):
        labkit.find_max_batch_size(tiny_cfg, budget_bytes=5_000_000)


def test_cpu_needs_a_budget(tiny_cfg):
    with pytest.raises(ConfigError, match=r"budget_bytes=None is not allowed: a number of bytes when training on "
                                          r"a CPU. A CPU has no device memory limit to find.*256 \* 2\*\*20"):
        labkit.find_max_batch_size(tiny_cfg)
    with pytest.raises(ConfigError, match=r"budget_bytes=-5 is not allowed"):
        labkit.find_max_batch_size(tiny_cfg, budget_bytes=-5)
    with pytest.raises(ConfigError, match=r"start=30 is not allowed: a positive multiple of grad_accum=4"):
        batching.batch_search(tiny_cfg.replace(grad_accum=4), budget_bytes=2**30, start=30)


def test_memory_model_predicts_a_size_it_did_not_measure(tiny_cfg):
    model = batching.memory_model(tiny_cfg)
    assert model.note is None and 256 not in model.batch_sizes[:-1] and 384 not in model.batch_sizes
    measured = batching.step_memory(tiny_cfg, 384).peak_bytes
    predicted = labkit.estimate_memory(tiny_cfg, 384)
    assert predicted == model.predict(384)
    assert set(predicted) == {*MEMORY_CATEGORIES, "total"} and predicted["total"] == sum(
        predicted[k] for k in MEMORY_CATEGORIES)
    assert predicted["total"] == pytest.approx(measured, rel=0.02)
    # fixed + per-sample line: activations are what grows
    per_sample = model.bytes_per_sample
    assert per_sample["parameters"] == 0 and per_sample["activations"] > 0.9 * per_sample["total"]
    assert model.fixed_bytes["total"] + 384 * per_sample["total"] == pytest.approx(predicted["total"], abs=2)
    frame = model.to_frame()
    assert frame.batch_size.tolist() == model.batch_sizes and frame.total.iloc[0] > 0


def test_memory_model_from_two_given_sizes(tiny_cfg):
    model = batching.memory_model(tiny_cfg, batch_sizes=(128, 64))
    assert model.batch_sizes == [64, 128]
    assert model.predict(192)["total"] == pytest.approx(batching.step_memory(tiny_cfg, 192).peak_bytes, rel=0.02)
    with pytest.raises(ConfigError, match=r"batch_sizes=\[64, 64\] is not allowed: at least two different"):
        batching.memory_model(tiny_cfg, batch_sizes=[64, 64])
    with pytest.raises(ConfigError, match=r"batch_size=1 is not allowed: a multiple of grad_accum=1, at least 2 "
                                          r"\(small_cnn has BatchNorm"):
        batching.memory_model(tiny_cfg, batch_sizes=[1, 64])
    with pytest.raises(ConfigError, match=r"batch_size=30 is not allowed: a multiple of grad_accum=4"):
        batching.MemoryModel([8, 16], [{}, {}], {}, {}, grad_accum=4, min_batch_size=8).predict(30)


def test_fit_linear_memory():
    fixed, per_sample, r2 = batching.fit_linear_memory([16, 32, 64], [1000 + 16 * 50, 1000 + 32 * 50, 1000 + 64 * 50])
    assert (fixed, per_sample, r2) == (pytest.approx(1000), pytest.approx(50), pytest.approx(1.0))
    line = batching.fit_linear_memory(pd.Series([8, 16, 999]), pd.Series([180.0, 340.0, None]))  # a failed run
    assert line.bytes_per_sample == pytest.approx(20) and line.fixed_bytes == pytest.approx(20)
    noisy = batching.fit_linear_memory([1, 2, 3, 4], [10, 22, 29, 41])
    assert 0.95 < noisy.r2 < 1.0
    with pytest.raises(ConfigError, match=r"batch_sizes=\[8.0, 8.0\] is not allowed: at least two different"):
        batching.fit_linear_memory([8, 8], [1, 2])
    with pytest.raises(ConfigError, match=r"peak_bytes='1 values' is not allowed: one per batch size"):
        batching.fit_linear_memory([8, 16], [1])


# --- learning rate, DDP sync, accumulation -------------------------------------------------------


def test_scale_lr_rules(tiny_cfg):
    big = tiny_cfg.replace(batch_size=128, lr=1e-3)
    assert batching.scale_lr(big, 32).lr == pytest.approx(4e-3)
    assert batching.scale_lr(big, 32, rule="sqrt").lr == pytest.approx(2e-3)
    assert batching.scale_lr(tiny_cfg.replace(batch_size=8), 32).lr == pytest.approx(2.5e-4)
    assert batching.scale_lr(big, 128).lr == big.lr and batching.scale_lr(big, 32).batch_size == 128
    with pytest.raises(ConfigError, match=r"rule='cubic' is not allowed: 'linear' \(SGD, Goyal"):
        batching.scale_lr(big, 32, rule="cubic")
    with pytest.raises(ConfigError, match=r"base_batch_size=0 is not allowed: an integer >= 1"):
        batching.scale_lr(big, 0)


class FakeDDP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.entered = []

    @contextlib.contextmanager
    def no_sync(self):
        self.entered.append(True)
        yield


def test_sync_context_skips_sync_on_all_but_the_last_micro_batch():
    model = FakeDDP()
    for index in range(4):
        with batching.sync_context(model, last_micro_batch=index == 3):
            pass
    assert model.entered == [True, True, True]
    plain = torch.nn.Linear(2, 2)
    assert isinstance(batching.sync_context(plain, last_micro_batch=False), contextlib.nullcontext)


def test_without_batchnorm():
    model = labkit.models.build("small_cnn", 10, pretrained=False)[0]
    count = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    stripped = batching.without_batchnorm(model)
    assert stripped is model and count == 7 and not batching.has_batchnorm(stripped)
    assert sum(isinstance(m, torch.nn.Identity) for m in stripped.modules()) == count
    assert stripped(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert isinstance(batching.without_batchnorm(torch.nn.BatchNorm1d(3)), torch.nn.Identity)


def test_accumulation_matches_the_whole_batch_except_with_batchnorm_in_train_mode(tiny_cfg):
    table = batching.accumulation_table(tiny_cfg, accum_steps=4)
    gaps = dict(zip(table.batchnorm, table.max_abs_grad_diff, strict=True))
    relative = dict(zip(table.batchnorm, table.relative_diff, strict=True))
    assert table.micro_batch_size.tolist() == [8, 8, 8]
    assert gaps["none"] < 1e-6 and relative["none"] < 1e-5  # float rounding
    assert gaps["eval"] < 1e-5 and relative["eval"] < 1e-4
    assert gaps["train"] > 1e-2 and relative["train"] > 0.1  # each micro-batch has its own statistics
    assert batching.accumulation_gap(tiny_cfg, 4, batchnorm="none") == gaps["none"]
    assert batching.accumulation_gap(tiny_cfg, 1, batchnorm="train") == 0.0


def test_accumulation_gap_rejects_bad_input(tiny_cfg):
    with pytest.raises(ConfigError, match=r"accum_steps=5 is not allowed: a divisor of batch_size=32"):
        batching.accumulation_gap(tiny_cfg, 5)
    with pytest.raises(ConfigError, match=r"batchnorm='frozen' is not allowed: 'train'"):
        batching.accumulation_gap(tiny_cfg, 4, batchnorm="frozen")
    with pytest.raises(ConfigError, match=r"accum_steps=32 is not allowed: at most batch_size / 2 = 16"):
        batching.accumulation_gap(tiny_cfg, 32)


# --- the sweep -------------------------------------------------------------------------------------


def test_batch_sweep_columns_epoch_time_and_cache(tiny_cfg, monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    df = batching.batch_sweep(tiny_cfg, [16, 32], lr_scaling="linear", base_batch_size=16, epochs=1)
    for column in ("batch_size", "step_time_s", "peak_memory_bytes", "accuracy", "error", "steps_per_epoch",
                   "epoch_time_s", "lr", "lr_scaling", "inference_time_s", "inference_per_sample_s"):
        assert column in df, column
    assert df.error.isna().all() and df.max_steps.isna().all() and df.epochs.eq(1).all()
    assert df.steps_per_epoch.tolist() == [8, 4] and df.steps.tolist() == [8, 4]
    assert df.epoch_time_s.tolist() == pytest.approx((df.step_time_s * df.steps_per_epoch).tolist())
    assert df.lr.tolist() == pytest.approx([1e-3, 2e-3]) and set(df.lr_scaling) == {"linear"}
    assert (df.inference_time_s > 0).all()
    assert df.inference_time_s.tolist() == pytest.approx((df.inference_batch_latency_s * [16, 8]).tolist())
    assert df.inference_per_sample_s.tolist() == pytest.approx((df.inference_batch_latency_s / [16, 32]).tolist())

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cached result should have been used")

    monkeypatch.setattr("labkit.train.fit", must_not_run)
    monkeypatch.setattr(batching._InferenceTimer, "measure", must_not_run)
    again = batching.batch_sweep(tiny_cfg, [16, 32], lr_scaling="linear", base_batch_size=16, epochs=1)
    pd.testing.assert_frame_equal(again, df)


def test_batch_sweep_defaults_come_from_the_profile(tiny_cfg, monkeypatch):
    ran = []

    def run_configs(configs, refresh=False, progress=True):
        ran.extend(configs)
        return [RunResult(config=c.to_dict(), error="ConfigError: skipped") for c in configs]

    monkeypatch.setattr("labkit.results.run_configs", run_configs)
    df = batching.batch_sweep(tiny_cfg.replace(batch_size=16), lr_scaling="sqrt")
    prof = labkit.profile()
    assert [c.batch_size for c in ran] == list(prof.batch_sizes) == [8, 16, 32, 64]
    assert all(c.epochs == prof.sweep_epochs and c.max_steps is None for c in ran)
    assert [c.lr for c in ran] == pytest.approx([1e-3 * math.sqrt(b / 16) for b in prof.batch_sizes])
    assert df.error.notna().all() and df.epoch_time_s.isna().all() and df.inference_time_s.isna().all()
    with pytest.raises(ConfigError, match=r"lr_scaling='cube' is not allowed: False, True"):
        batching.batch_sweep(tiny_cfg, lr_scaling="cube")
    with pytest.raises(ConfigError, match=r"grad_accum=4 is not allowed: a divisor of batch_size=6"):
        batching.batch_sweep(tiny_cfg.replace(grad_accum=4), [8, 6])
    assert len(ran) == 4  # invalid sweeps run nothing


def test_profiles_have_batch_sizes_and_sweep_epochs():
    assert [(p.batch_sizes, p.sweep_epochs) for p in (labkit.profile(n) for n in ("ci", "quick", "full"))] == [
        ((8, 16, 32, 64), 1), ((8, 16, 32, 64, 128, 256), 2), ((8, 16, 32, 64, 128, 256), 3)]
    assert labkit.env_report()["profile"] == "ci"


def test_public_names():
    assert labkit.find_max_batch_size is batching.find_max_batch_size
    assert labkit.estimate_memory is batching.estimate_memory
    assert Probe(8, True) == (8, True, None)


# --- what notebook 02 reads off the results ------------------------------------------------------------

def _sweep_frame(accuracy, inference_s=(0.040, 0.041, 0.042, 0.043), epoch_s=(0.5, 0.4, 0.3, 0.28)):
    sizes = [8, 16, 32, 64]
    return pd.DataFrame({"batch_size": sizes, "peak_memory_bytes": [4e6 + 4e5 * b for b in sizes],
                         "epoch_time_s": list(epoch_s), "inference_time_s": list(inference_s),
                         "accuracy": list(accuracy), "profile": "ci", "error": None})


def test_seed_claims_verdicts_follow_the_numbers():
    claims = batching.seed_claims(_sweep_frame([0.70, 0.80, 0.75, 0.60])).set_index("claim")
    assert claims.loc["memory grows linearly with the batch size", "verdict"] == "reproduced"
    assert "R^2 = 1.0000" in claims.loc["memory grows linearly with the batch size", "measured"]
    assert claims.loc["training time per epoch falls as the batch grows", "measured"] == (
        "0.50 s per epoch at batch 8, 0.28 s at 64 (0.56x)")
    assert claims.loc["inference time barely moves with the batch size", "verdict"] == "reproduced"
    assert claims.loc["a middle batch size generalises best", "verdict"] == "reproduced"
    refuted = batching.seed_claims(_sweep_frame([0.90, 0.80, 0.75, 0.60], inference_s=(0.08, 0.05, 0.04, 0.03),
                                                epoch_s=(0.5, 0.5, 0.5, 0.5))).set_index("claim").verdict
    assert list(refuted) == ["reproduced", "refuted", "refuted", "refuted"]
    turning = batching.seed_claims(_sweep_frame([0.7, 0.8, 0.75, 0.6], epoch_s=(0.5, 0.3, 0.2, 0.35)))
    turning = turning.set_index("claim").loc["training time per epoch falls as the batch grows"]
    assert turning.verdict == "partly: falls up to batch 32, then rises"
    assert turning.measured.endswith("; fastest 0.20 s at batch 32, slower beyond")
    flat = batching.seed_claims(_sweep_frame([0.700, 0.701, 0.700, 0.700])).set_index("claim").verdict
    assert flat["a middle batch size generalises best"] == "inconclusive"  # 0.1 pp < one of 256 test images
    with pytest.raises(ConfigError, match="at least 3 successful batch sizes"):
        batching.seed_claims(_sweep_frame([0.7] * 4).iloc[:2])


def test_prediction_table_checks_the_line_against_measured_steps(tiny_cfg):
    table = batching.prediction_table(tiny_cfg, fit_sizes=(16, 32), check_sizes=(64, 96))
    assert list(table.kind) == ["predicted from 16 and 32", "measured"] * 2
    measured = table[table.kind == "measured"].set_index("batch_size").peak_memory_bytes
    assert measured[64] == batching.step_memory(tiny_cfg, 64).total_bytes
    predicted = table[table.kind != "measured"].set_index("batch_size")
    assert predicted.error[96] == pytest.approx(predicted.peak_memory_bytes[96] / measured[96] - 1)
    assert predicted.error.abs().max() < 0.1
    assert batching.prediction_finding(table).startswith("Predicted from 16 and 32: off by ")


def test_compare_lr_scaling_labels_three_sweeps(tiny_cfg):
    cfg = tiny_cfg.replace(max_steps=None, evaluate=True)
    df = batching.compare_lr_scaling(cfg, warmup_steps=1, batch_sizes=[8, 16], base_batch_size=16, progress=False)
    assert list(df.lr_setting) == ["same lr"] * 2 + ["scaled"] * 2 + ["scaled + warm-up"] * 2
    assert list(df.lr) == [1e-3, 1e-3, 5e-4, 1e-3, 5e-4, 1e-3]
    assert list(df.lr_warmup_steps) == [0, 0, 0, 0, 1, 1]
    text = batching.lr_scaling_finding(df).splitlines()
    assert text[0].startswith("batch 8: same lr ") and text[0].endswith(".")
    with pytest.raises(ConfigError, match="warmup_steps=0 is not allowed"):
        batching.compare_lr_scaling(cfg, warmup_steps=0)


def test_accumulation_finding():
    df = pd.DataFrame({"grad_accum": [2, 1], "batch_size": 64, "peak_memory_bytes": [10 * 2**20, 20 * 2**20],
                       "step_time_s": [0.06, 0.04], "error": None})
    assert batching.accumulation_finding(df) == (
        "Against grad_accum=1 (peak 20.0 MiB, step 40.0 ms), same batch of 64:\n"
        "grad_accum=2 (micro-batch 32): peak 10.0 MiB (0.50x), step 60.0 ms (1.50x)")


def test_run_with_lr_scaling_scales_from_the_base(tiny_cfg):
    res = batching.run_with_lr_scaling(tiny_cfg.replace(evaluate=False), lr_scaling="linear", base_batch_size=16)
    assert res.config["lr"] == pytest.approx(2e-3)  # batch 32 = 2 x 16
    res = batching.run_with_lr_scaling(tiny_cfg.replace(evaluate=False), lr_scaling=False)
    assert res.config["lr"] == 1e-3


def test_state_bytes_counts_8bit_optimizer_state_as_measured(tiny_cfg):
    cfg = tiny_cfg.replace(optimizer="adamw8bit")
    model, _ = labkit.models.build(cfg.model, 10)
    eight_bit, adamw = batching.state_bytes(model, cfg), batching.state_bytes(model, tiny_cfg)
    assert eight_bit["optimizer_state"] < adamw["optimizer_state"] / 3  # ~2 B vs 8 B per parameter
    measured = batching.step_memory(cfg, 8).breakdown.peak_by_category["optimizer_state"]
    assert eight_bit["optimizer_state"] == measured


def test_lr_scaling_finding_names_a_winner_only_beyond_the_noise():
    df = pd.DataFrame({"batch_size": 64, "lr_setting": list(batching.LR_SETTINGS), "lr": [1e-3, 1e-3, 1e-3],
                       "accuracy": [0.70, 0.80, 0.79], "profile": "ci", "error": None})
    noise = batching.accuracy_noise(0.80, 256)
    assert noise == pytest.approx(2 * math.sqrt(2 * 0.8 * 0.2 / 256))  # about 7 points on 256 test images
    assert batching.lr_scaling_finding(df).endswith(
        f"scaled and scaled + warm-up tie within the test-set noise ({noise:.1%}), ahead of same lr.")
    df.loc[2, "accuracy"] = 0.60
    assert batching.lr_scaling_finding(df).endswith("best: scaled.")
    df["accuracy"] = [0.80, 0.79, 0.78]
    assert batching.lr_scaling_finding(df).endswith(f"no clear winner (all within {noise:.1%}, the test-set noise).")

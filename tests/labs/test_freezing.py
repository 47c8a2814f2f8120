"""labkit.labs.freezing: notebook 05's experiments and the findings worded from them."""

import math

import pandas as pd
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from labkit import models
from labkit.errors import ConfigError
from labkit.labs import freezing as lab
from labkit.labs.freezing import exercises
from labkit.labs.freezing.backward import _model_and_batch
from labkit.labs.freezing.caching import FeatureCaching
from labkit.labs.freezing.common import _typical_step_s
from labkit.labs.freezing.levels import LevelSweep


@pytest.fixture(scope="module")
def sweep():
    import labkit

    cfg = labkit.RunConfig(model="small_cnn", dataset="shapes10", batch_size=32, max_steps=6, train_size=128,
                           device="cpu")
    return cfg, lab.level_sweep(cfg, levels=["heavy", "head_only", "none"], progress=False)


def test_level_table_says_what_each_level_freezes_per_model():
    table = lab.level_table(["small_cnn", "resnet18"]).set_index("level")
    assert table.loc["none", "small_cnn"] == "- (100% train)"
    assert table.loc["light", "resnet18"].startswith("stem, layer1 (")
    assert table.loc["head_only", "small_cnn"] == "stem, block1, block2, block3 (0.437% train)"  # 1,290 of 295,490


def test_the_layer_by_layer_count_matches_the_flop_counter(tiny_cfg):
    counts = lab.backward_profile(tiny_cfg, "none")
    model, x, _ = _model_and_batch(tiny_cfg, "none")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    assert counts["forward_flops"] == counter.get_total_flops()
    # nothing frozen: every layer computes both gradients, except the stem conv (the images need none)
    stem_conv = 2 * (tiny_cfg.batch_size * 24 * 32 * 32) * (3 * 3 * 3)
    assert counts["predicted_backward_flops"] == 2 * counts["forward_flops"] - stem_conv
    assert counts["no_input_grad_flops"] == stem_conv
    head = lab.backward_profile(tiny_cfg, "head_only")
    linear = 2 * tiny_cfg.batch_size * 128 * 10
    assert head["trainable_forward_flops"] == head["no_input_grad_flops"] == head["predicted_backward_flops"] == linear
    assert head["saved_by_stage"] == {"head": tiny_cfg.batch_size * 128 * 4}  # the pooled features only


def test_level_sweep_measures_each_level_against_no_freezing(sweep):
    _, df = sweep
    assert list(df["level"]) == ["heavy", "head_only", "none"] and df["error"].isna().all()
    rows = df.set_index("level")
    assert rows.loc["none", "time_ratio"] == rows.loc["none", "state_ratio"] == 1.0
    assert rows.loc["head_only", "num_trainable_params"] == 1290
    assert rows.loc["heavy", "frozen_stages"] == "stem, block1, block2"
    assert (rows["backward_flops"] == rows["predicted_backward_flops"]).all()
    assert rows.loc["head_only", "backward_flops"] < 1e-3 * rows.loc["none", "backward_flops"]
    assert rows.loc["head_only", "state_ratio"] < 0.01 and rows.loc["head_only", "mem_gradients_bytes"] == 4 * 1290
    assert rows.loc["heavy", "saved_activation_bytes"] < 0.2 * rows.loc["none", "saved_activation_bytes"]
    assert len(set(rows["forward_flops"])) == 1  # freezing never changes the forward pass
    assert rows.loc["none", "accuracy_change"] == 0.0
    with pytest.raises(ConfigError, match=r"levels=\['half'\] is not allowed: a non-empty list of levels from"):
        lab.level_sweep(sweep[0], levels=["half"])


def test_levels_finding_is_one_line_on_the_deepest_level(sweep):
    text = sweep[1].finding()
    head = sweep[1].set_index("level").loc["head_only"]
    assert text.startswith(f"At head_only a step took {head.time_ratio:.2f}x the time of no freezing (")
    assert "x the FLOPs: " in text and "\n" not in str.__str__(text)


def _timed(head_p10, head_p90, flop_share_backward=0.0):
    """A none / head_only pair: none's steps 10 ms (9-11 ms), forward 1 GFLOP, backward 2 GFLOP."""
    return LevelSweep(pd.DataFrame([
        {"level": "none", "error": None, "trainable_share": 1.0, "time_ratio": 1.0, "step_time_s": 0.010,
         "step_time_p10_s": 0.009, "step_time_p90_s": 0.011, "forward_flops": 1e9, "backward_flops": 2e9},
        {"level": "head_only", "error": None, "trainable_share": 0.01, "time_ratio": (head_p10 + head_p90) / 0.02,
         "step_time_s": (head_p10 + head_p90) / 2, "step_time_p10_s": head_p10, "step_time_p90_s": head_p90,
         "forward_flops": 1e9, "backward_flops": flop_share_backward},
    ]))


@pytest.mark.parametrize("p10, p90, verdict", [
    (0.0020, 0.0028, "time fell more than the FLOPs (the steps' spread allows 0.18x-0.31x)"),  # FLOPs: 0.33x
    (0.0055, 0.0065, "time fell less than the FLOPs (the steps' spread allows 0.50x-0.72x)"),
    (0.0032, 0.0040, "time followed the FLOPs (the steps' spread allows 0.29x-0.44x)"),
])
def test_levels_finding_compares_time_with_the_flops_within_the_measured_spread(p10, p90, verdict):
    assert _timed(p10, p90).finding().endswith(verdict + ".")


def _frame(time_ratio, accuracy, base_accuracy=0.9, test_size=1000):
    """none's steps 10 ms (9-11 ms); heavy's the same spread, scaled by ``time_ratio``."""
    return pd.DataFrame([
        {"level": "none", "frozen_stages": "-", "time_ratio": 1.0, "accuracy": base_accuracy, "error": None,
         "test_size": test_size, "step_time_s": 0.010, "step_time_p10_s": 0.009, "step_time_p90_s": 0.011},
        {"level": "heavy", "frozen_stages": "stem, block1, block2", "time_ratio": time_ratio, "accuracy": accuracy,
         "error": None, "test_size": test_size, "step_time_s": 0.010 * time_ratio,
         "step_time_p10_s": 0.009 * time_ratio, "step_time_p90_s": 0.011 * time_ratio},
    ])


@pytest.mark.parametrize("time_ratio, accuracy, verdict", [
    (0.8, 0.70, "-20.0 points, lower): the claim holds here, 22% of the accuracy lost to save 20% of the time."),
    (0.4, 0.80, "a real loss, but 11% of it against 60% of the time saved: the claim does not hold as stated."),
    (0.5, 0.895, "-0.5 points, within the noise): the 50% of time saved came free: the claim does not hold here."),
    (0.85, 0.70, "not faster beyond the steps' spread, so these times cannot judge the claim"),
    (1.2, 0.70, "not faster beyond the steps' spread"),
])
def test_the_popular_tradeoff_claim_is_judged_from_the_numbers(time_ratio, accuracy, verdict):
    text = LevelSweep(_frame(time_ratio, accuracy)).claim("heavy")
    assert text.startswith(f"heavy (stem, block1, block2 frozen): {time_ratio:.2f}x the step time, accuracy ")
    assert verdict in text
    with pytest.raises(ConfigError, match=r"frame=\"no successful 'none' row\" is not allowed: a level_sweep frame"):
        LevelSweep(_frame(0.5, 0.8).iloc[1:]).claim()


def test_the_batchnorm_demo_shows_the_statistics_moving_only_without_eval_mode(tiny_cfg):
    demo = lab.batchnorm_demo(tiny_cfg, "heavy", progress=False)
    good, bad = demo.frame.iloc[0], demo.frame.iloc[1]
    assert list(demo.frame["variant"]) == ["BatchNorm kept in eval mode (labkit)", "requires_grad_(False) only"]
    assert good.frozen_weight_change == bad.frozen_weight_change == 0.0
    assert good.running_mean_change == 0.0 and good.feature_change_fraction == 0.0
    assert bad.running_mean_change > 0 and bad.feature_change_fraction > 1e-3
    text = demo.finding()
    assert text.startswith("With requires_grad_(False) alone the frozen BatchNorm running means moved by up to ")
    assert "(kept in eval mode: 0 and 0.0%)" in text and text.endswith(("within the noise).", "lower).", "higher)."))
    assert "running mean" in repr(demo).lower() or "variant" in repr(demo).lower()
    with pytest.raises(ConfigError, match=r"level='none' is not allowed: a level that freezes something"):
        lab.batchnorm_demo(tiny_cfg, "none")


def test_feature_caching_trains_the_same_head_faster(tiny_cfg):
    caching = lab.feature_caching(tiny_cfg, epochs=2)
    by = caching.frame.set_index("method")
    assert caching.head_weight_diff < 1e-5 and by.accuracy.nunique() == 1
    assert caching.cache_bytes == 128 * 128 * 4 * 4 * 4  # train_size x 128 channels x 4 x 4 x float32
    assert caching.extract_s > 0 and (by.epoch_time_s > 0).all() and caching.epochs == 2
    assert math.isclose(caching.speedup, by.epoch_time_s["through the network"] / by.epoch_time_s["cached features"])
    with pytest.raises(ConfigError, match=r"epochs=0 is not allowed: an integer >= 1"):
        lab.feature_caching(tiny_cfg, epochs=0)


def test_the_caching_finding_counts_the_break_even():
    frame = pd.DataFrame([{"method": "through the network", "epoch_time_s": 2.0, "accuracy": 0.5},
                          {"method": "cached features", "epoch_time_s": 0.5, "accuracy": 0.5}])
    text = FeatureCaching(frame, extract_s=3.0, cache_bytes=2**20, head_weight_diff=0.0, epochs=3).finding()
    assert text.startswith("An epoch took 2 s through the network and 500 ms on the cache (4.0x faster, over the "
                           "epochs no spread measured); building")
    assert text.endswith("so it paid for itself after 2.00 epochs (4.5 s in all over 3 epochs, against 6 s).")
    times = {"through the network": [1.9, 2.0, 2.4], "cached features": [0.5, 0.5, 2.4]}
    uneven = FeatureCaching(frame, 3.0, 2**20, 0.0, 3, times).finding()
    assert "(4.0x faster, over the epochs within the noise)" in uneven
    clear = {"through the network": [1.9, 2.0, 2.4], "cached features": [0.5, 0.5, 0.6]}
    assert "(4.0x faster, over the epochs faster)" in FeatureCaching(frame, 3.0, 2**20, 0.0, 3, clear).finding()
    slower = frame.assign(epoch_time_s=[0.5, 0.6])
    assert FeatureCaching(slower, 3.0, 2**20, 0.0, 3).finding().endswith("so here it never pays.")


def test_schedules_end_with_everything_training(sweep):
    cfg, df = sweep
    schedules = lab.schedule_runs(cfg, df, decay=0.5, progress=False)
    rows = schedules.set_index("setup")
    assert list(rows.index) == ["heavy", "head_only", "none", *lab.SCHEDULES] and rows["error"].isna().all()
    assert (rows.loc[list(lab.SCHEDULES), "num_trainable_params"] == 295_490).all()
    # 6 steps, 4 body stages: one stage thaws every 6 // 5 = 1 step, from the top
    assert rows.loc["gradual unfreezing", "schedule"] == "block3@1, block2@2, block1@3, stem@4"
    assert rows.loc["discriminative lr", "schedule"] == ("stem 6.3e-05, block1 0.00013, block2 0.00025, block3 0.0005, "
                                                         "head 0.001")
    assert rows.loc["gradual unfreezing", "mem_optimizer_state_bytes"] == rows.loc["none", "mem_optimizer_state_bytes"]
    text = schedules.finding()
    assert text.startswith("Best accuracy: ") and "the fastest of those is " in text
    assert lab.schedule_runs(cfg, df.frame, decay=0.5, progress=False).frame.equals(schedules.frame)  # a frame too
    with pytest.raises(ConfigError, match=r"optimizer='sgd' is not allowed: 'adamw'"):
        lab.schedule_runs(cfg.replace(optimizer="sgd"), df)
    with pytest.raises(ConfigError, match=r"decay=0 is not allowed: a number in \(0, 1\]"):
        lab.schedule_runs(cfg, df, decay=0)


def test_own_backward_numbers_come_from_the_sweep(sweep):
    _, df = sweep
    mine = df.own_backward("heavy")
    row = df.set_index("level").loc["heavy"]
    assert mine["trainable_gflop"] == round(row.trainable_forward_flops / 1e9, 4) and mine["level"] == "heavy"
    answer = 2 * mine["trainable_gflop"] - mine["first_gflop"]
    assert exercises.check("05.own_backward", answer, mine).startswith("05.own_backward: correct!")
    assert df.backward_check(mine).startswith(f"The arithmetic gives {answer:.4g} GFLOP")
    with pytest.raises(ConfigError, match=r"frame=\"no successful 'light' row\" is not allowed"):
        df.own_backward("light")


def test_model_and_batch_freezes_as_the_run_does(tiny_cfg):
    model, x, y = _model_and_batch(tiny_cfg, "heavy")
    assert x.shape == (tiny_cfg.batch_size, 3, 32, 32) and y.shape == (tiny_cfg.batch_size,)
    assert [n for n, s in models.named_stages(model) if not any(p.requires_grad for p in s.parameters())] == [
        "stem", "block1", "block2"]


def test_a_schedules_mean_step_counts_each_step_at_its_phases_median():
    from labkit.result import RunResult

    # 10 steps, the first 3 untimed; a stage thaws at step 5: phase medians 1.0 (2 steps) and 3.0 (5 steps)
    result = RunResult(config={}, steps=10, step_times_s=[1.0, 1.0, 3.0, 3.0, 9.0, 3.0, 3.0])
    assert _typical_step_s(result, [5]) == pytest.approx((2 * 1.0 + 5 * 3.0) / 7)
    assert _typical_step_s(result) == 3.0  # one phase: the median, whatever the disturbed 9.0 did
    assert math.isnan(_typical_step_s(RunResult(config={}, steps=4)))


def test_levels_finding_says_when_the_timing_was_disturbed(sweep):
    _, df = sweep
    disturbed = df.frame.copy()
    head = disturbed["level"] == "head_only"
    none = disturbed.loc[disturbed["level"] == "none"].iloc[0]
    for column in ("step_time_s", "step_time_p10_s", "step_time_p90_s"):
        disturbed.loc[head, column] = 2 * none[column]
    disturbed.loc[head, "time_ratio"] = 2.0
    text = LevelSweep(disturbed).finding()
    assert "a step took 2.00x the time" in text and "this machine's timing was disturbed" in text
    rows = df.set_index("level")  # the live run says so exactly when its frozen step was not faster beyond the noise
    disturbed_live = rows.loc["head_only", "step_time_p90_s"] >= rows.loc["none", "step_time_p10_s"]
    assert ("this machine's timing was disturbed" in df.finding()) == disturbed_live


def test_torchs_counter_counts_grouped_weight_gradients_as_ungrouped(tiny_cfg):
    # ShuffleNetV2's depthwise convolutions: the counter's backward is the prediction plus its overcount
    cfg = tiny_cfg.replace(model="shufflenet_v2_x0_5", batch_size=4)
    counts = lab.backward_profile(cfg, "medium")
    model, x, y = _model_and_batch(cfg, "medium")
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    assert counts["counter_overcount_flops"] > 0
    measured = counter.get_total_flops() - counts["forward_flops"]
    assert measured == counts["predicted_backward_flops"] + counts["counter_overcount_flops"]

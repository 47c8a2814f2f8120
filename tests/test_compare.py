"""One comparison (`labkit.measure.compare`), the result object every lab experiment returns (`labkit.labresult`)
and the one set-up side experiments share (`labkit.runsetup.set_up`)."""

import math
import pickle
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

from labkit import RunConfig, plots
from labkit.labresult import LabResult
from labkit.measure import VERDICTS, Measured, compare
from labkit.runsetup import set_up
from labkit.train import Trainer


def test_apart_spreads_are_real_and_say_their_direction():
    faster = compare((0.9, 0.85, 0.95), (1.2, 1.1, 1.3), words=("faster", "slower"))
    assert faster.real and faster.direction == -1 and faster.verdict == "faster"
    assert faster.ratio == pytest.approx(0.75) and faster.difference == pytest.approx(-0.3)
    assert faster.band == pytest.approx((0.85 / 1.3, 0.95 / 1.1))
    assert str(faster) == "0.75x (faster)"
    slower = compare((1.2, 1.1, 1.3), (0.9, 0.85, 0.95), words=("faster", "slower"))
    assert slower.direction == 1 and slower.verdict == "slower" and bool(slower)


def test_overlapping_spreads_are_noise_and_no_spread_is_never_called_real():
    overlap = compare((1.0, 0.9, 1.2), (1.1, 1.0, 1.3))
    assert overlap.real is False and overlap.direction == 0 and overlap.verdict == VERDICTS[0]
    assert not overlap
    single = compare(1.0, 2.0)
    assert single.real is None and single.band is None and single.verdict == VERDICTS[None]
    assert single.ratio == 0.5
    flat = compare((1.0, 1.0, 1.0), (2.0, 1.9, 2.1))  # one timing: no width
    assert flat.real is None
    missing = compare((math.nan, math.nan, math.nan), (2.0, 1.9, 2.1))
    assert missing.real is None and math.isnan(missing.ratio)


def test_an_exact_value_is_a_point_against_the_others_spread():
    zero = Measured.exact_value(0.0)
    assert compare([0.01, 0.02, 0.015], zero).direction == 1  # every seed's change above nothing
    assert compare(zero, [0.01, 0.02, 0.015]).direction == -1
    assert compare([-0.01, 0.02, 0.015], zero).real is False  # the spread holds zero
    assert compare(0.3, zero).real is None and compare(zero, zero).real is None  # a point has no spread to judge by


def test_repeats_rows_and_accuracies_are_measurements():
    repeats = Measured.of([1.0, 1.1, 1.2, 1.05, 0.95])
    assert repeats.value == pytest.approx(1.05) and repeats.low < repeats.value < repeats.high
    row = {"step_time_s": 1.0, "step_time_p10_s": 0.9, "step_time_p90_s": 1.1}
    assert Measured.row(row, "step_time_s") == Measured(1.0, 0.9, 1.1)
    assert Measured.row(pd.Series(row), "step_time_s") == Measured(1.0, 0.9, 1.1)
    assert not Measured.row({"step_time_s": 1.0}, "step_time_s").has_spread
    # 1,000 test examples at 80 %: about 3.6 points apart is beyond chance, 1 point is not
    assert not compare(Measured.accuracy(0.81, 1000), Measured.accuracy(0.80, 1000))
    assert compare(Measured.accuracy(0.85, 1000), Measured.accuracy(0.80, 1000)).direction == 1
    assert compare(Measured.accuracy(None, 1000), Measured.accuracy(0.80, 1000)).real is None  # not evaluated


@dataclass
class _Timings(LabResult):
    shown = ("setup", "step_time_s")
    baseline: str = "fp32"

    def finding(self):
        rows = self.frame.set_index("setup")
        bf16, fp32 = (Measured.row(rows.loc[name], "step_time_s") for name in ("bf16", "fp32"))
        return f"bf16 {compare(bf16, fp32, ('faster', 'slower'))}"


def _timings() -> _Timings:
    return _Timings(pd.DataFrame({"setup": ["fp32", "bf16"], "step_time_s": [1.0, 0.5],
                                  "step_time_p10_s": [0.9, 0.45], "step_time_p90_s": [1.1, 0.55],
                                  "hidden": [1, 2]}))


def test_a_result_shows_its_table_and_finding_together_and_reads_as_its_frame():
    r = _timings()
    assert r.show_columns() == ["setup", "step_time_s"]
    html = r._repr_html_()
    assert "<table" in html and "bf16 0.5x (faster)" in html and "hidden" not in html
    assert repr(r).endswith("bf16 0.5x (faster)") and "fp32" in repr(r)
    assert len(r) == 2 and list(r["setup"]) == ["fp32", "bf16"] and r.iloc[1]["step_time_s"] == 0.5
    assert _Timings(r.frame, columns=["setup", "hidden"]).show_columns() == ["setup", "hidden"]
    back = pickle.loads(pickle.dumps(r))
    assert back.baseline == "fp32" and back.frame.equals(r.frame)
    with pytest.raises(AttributeError):
        r.no_such_thing  # noqa: B018


def test_set_up_gives_the_loops_model_device_and_first_batch():
    cfg = RunConfig(model="small_cnn", dataset="shapes10", batch_size=8, train_size=64, device="cpu")
    s = set_up(cfg)
    trainer = Trainer(cfg)
    for (name, mine), (_, loops) in zip(s.model.state_dict().items(), trainer.model.state_dict().items(),
                                        strict=True):
        assert torch.equal(mine, loops), name
    batch = s.batch()
    assert batch.images.shape[0] == 8 and batch.images.device.type == "cpu"
    assert torch.equal(batch.labels, next(iter(trainer.loader))[1])
    assert set_up(cfg, model=False).model is None


def test_plots_draw_a_results_frame():
    r = _timings()
    heights = [[p.get_height() for p in plots.bar(data, "setup", "step_time_s").patches] for data in (r, r.frame)]
    assert heights[0] == heights[1] and len(heights[0]) == 2
    plt.close("all")

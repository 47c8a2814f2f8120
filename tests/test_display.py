"""How measured columns are shown: units chosen from the values, three significant digits, at most 7 columns."""

import pandas as pd
import pytest

from labkit import display
from labkit.errors import ConfigError


def test_bytes_and_counts_take_the_unit_that_suits_the_values():
    assert display.scaled("peak_memory_bytes", [512 * 2**10]).unit == "KiB"
    assert display.scaled("peak_memory_bytes", [110 * 2**20]).unit == "MiB"
    assert display.scaled("peak_memory_bytes", [28e9]).unit == "GiB"
    assert display.scaled("num_trainable_params", [17_930]).unit == "thousands"  # not "0.0179 millions"
    assert display.scaled("num_params", [124e6]).unit == "millions"
    assert display.scaled("num_params", [7e9]).unit == "billions"
    assert display.axis_label("peak_memory_bytes") == "peak memory (MiB)"  # nothing to fit: MiB
    assert display.axis_label("num_params", [17_930]) == "parameters (thousands)"


def test_unknown_columns_are_read_by_their_suffix():
    assert display.metric("adapter_bytes").unit == display.BYTES
    assert display.scaled("merge_s", [0.004]) == display.Metric("merge", "ms", 1e3)
    assert display.metric("frozen_share") == display.Metric("frozen", "%", 100.0)
    assert display.metric("small_cnn") == display.Metric("small_cnn", "", 1.0)  # a name keeps its underscores


@pytest.mark.parametrize(("value", "shown"), [
    (0.123456, "0.123"), (40.54, "40.5"), (1234.5, "1,230"), (123456.0, "123,000"), (256, "256"),
    (17_930, "17,930"), (99.95, "100"), (2.5e-5, "2.50e-05"), (None, ""), (float("nan"), ""), (True, "True"),
])
def test_numbers_keep_three_significant_digits(value, shown):
    assert display.number(value) == shown


def test_a_table_shows_units_in_its_headers_and_no_raw_bytes():
    df = pd.DataFrame({"setup": ["full", "LoRA"], "peak_memory_bytes": [30e6, 110e6], "step_time_s": [0.0405, 0.165],
                       "accuracy": [0.807, 0.752], "weights_bytes": [28e9, 14e9]})
    shown = display.frame(df)
    assert list(shown.columns) == ["setup", "peak memory (MiB)", "step time (ms)", "accuracy (%)", "weights (GiB)"]
    assert shown.iloc[0].tolist() == ["full", "28.6", "40.5", "80.7", "26.1"]
    assert "28000000000" not in display.text_table(df)
    html = display.table(df, ["setup", "accuracy"]).to_html()
    assert "80.7" in html and "accuracy (%)" in html


def test_a_table_of_more_than_seven_columns_is_refused_with_what_to_do():
    wide = pd.DataFrame({f"c{i}": [i] for i in range(8)})
    with pytest.raises(ConfigError, match=r"columns.*8 columns.*at most 7: choose the ones to show"):
        display.frame(wide)
    assert len(display.frame(wide, [f"c{i}" for i in range(7)]).columns) == 7
    with pytest.raises(ConfigError, match=r"columns.*'nope'.*columns of the frame"):
        display.frame(wide, ["nope"])

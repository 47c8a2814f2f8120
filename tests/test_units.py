import math

import pytest

from labkit import units


def test_mib_formats_bytes_with_the_asked_precision():
    assert units.mib(3 * 2**20) == "3.00 MiB"
    assert units.mib(1536 * 1024, ".3g") == "1.5 MiB"
    assert units.mib(123_456_789, ".1f") == "117.7 MiB"
    assert units.mib(None) == "n/a"


@pytest.mark.parametrize("value, reference, expected", [
    (3.0, 4.0, 0.75), (4, 2, 2.0), (1.0, 0.0, math.nan), (None, 2.0, math.nan), (1.0, None, math.nan),
    (math.nan, 1.0, math.nan), (1.0, math.nan, math.nan),
])
def test_ratio_is_nan_when_either_side_is_missing(value, reference, expected):
    got = units.ratio(value, reference)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


@pytest.mark.parametrize("ratio, expected", [
    (0.6, "40% less"), (1.12, "12% more"), (1.004, "no change"), (0.996, "no change"), (0.99, "1% less"),
    (math.nan, "not measured"),
])
def test_change_words_a_ratio(ratio, expected):
    assert units.change(ratio) == expected


@pytest.mark.parametrize("value, reference, expected", [
    (30, 40, "25% less"), (44, 40, "10% more"), (40.1, 40, "no change"),
    (798720, 819200, "2% less"),  # exactly a 2.5 % saving: worded from the saving, not from a rounded ratio
])
def test_change_between_words_the_saving(value, reference, expected):
    assert units.change_between(value, reference) == expected

import numpy as np
import pytest

from labkit.errors import ConfigError
from labkit.validate import check_positive_int, is_int, is_number


@pytest.mark.parametrize("value, expected", [(3, True), (np.int64(3), True), (True, False), (3.0, False), ("3", False)])
def test_is_int_takes_integers_but_not_bools(value, expected):
    assert is_int(value) is expected


@pytest.mark.parametrize("value, expected", [(0.5, True), (np.float32(2), True), (7, True), (False, False),
                                             (float("inf"), False), (float("nan"), False), ("1", False)])
def test_is_number_takes_finite_reals_but_not_bools(value, expected):
    assert is_number(value) is expected


def test_check_positive_int_names_the_field_the_value_and_the_minimum():
    check_positive_int("limit", 4, minimum=4)
    with pytest.raises(ConfigError, match=r"limit=3 is not allowed: an integer >= 4"):
        check_positive_int("limit", 3, minimum=4)
    with pytest.raises(ConfigError, match=r"start=2.0 is not allowed: an integer >= 1"):
        check_positive_int("start", 2.0)

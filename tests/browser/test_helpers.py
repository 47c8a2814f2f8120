"""The browser test's own helpers, without a browser."""

import pytest

from .jupyterlab import cells_not_run, significant_digits, table_problems


def _cell(index, prompt, hidden=False):
    return {"index": index, "prompt": prompt, "hidden": hidden}


def test_a_collapsed_cell_ran_when_a_visible_cell_after_it_ran():
    cells = [_cell(0, "[1]:"), _cell(1, "", hidden=True), _cell(2, "[3]:")]
    assert cells_not_run(cells) == []


def test_a_collapsed_cell_after_the_failure_did_not_run():
    # cell 1 failed (its error box is reported separately); Run All stopped there
    cells = [_cell(0, "[1]:"), _cell(1, "[2]:"), _cell(2, "", hidden=True), _cell(3, "[ ]:"), _cell(4, "", hidden=True)]
    assert cells_not_run(cells) == [2, 3, 4]


def test_a_blank_chart_has_almost_no_ink_and_a_drawn_one_has_some():
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .jupyterlab import image_ink

    def src(fig) -> str:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()

    blank, drawn = plt.figure(figsize=(10, 8.4)), plt.figure(figsize=(10, 8.4))
    blank.text(0.2, 0.5, "small_cnn")
    drawn.add_subplot(1, 1, 1).bar([0], [1.0])
    assert image_ink(src(blank)) < 0.005 < 0.01 < image_ink(src(drawn))


@pytest.mark.parametrize(("text", "digits"), [("0.0123", 3), ("1,230", 3), ("2.80e+10", 3), ("40.54", 4), ("17,930", 4),
                                             ("256", 3), ("7", 1), ("fp32", None), ("", None), ("-3.14", 3)])
def test_significant_digits_of_a_shown_number(text, digits):
    assert significant_digits(text) == digits


def test_table_problems_name_wide_tables_raw_bytes_and_long_numbers():
    good = [["setup", "peak memory (MiB)", "accuracy (%)"], ["full", "28.6", "80.7"], ["LoRA r8", "1,230", "17,930"]]
    assert table_problems(good) == []
    wide = [[str(i) for i in range(8)], ["1"] * 8]
    assert table_problems(wide) == ["8 columns (at most 7)"]
    indexed = [["", *"abcdefg"], list("1234567")]  # pandas' index header cell does not count
    assert table_problems(indexed) == []
    raw = [["setup", "weights_bytes", "step_time_s"], ["7B", "28000000000", "0.040541"]]
    assert table_problems(raw) == ["raw number '28000000000' (bytes or a count without a unit)",
                                   "'0.040541' has more than 3 significant digits"]

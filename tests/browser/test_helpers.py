"""The browser test's own helpers, without a browser."""

from .jupyterlab import cells_not_run


def _cell(index, prompt, hidden=False):
    return {"index": index, "prompt": prompt, "hidden": hidden}


def test_a_collapsed_cell_ran_when_a_visible_cell_after_it_ran():
    cells = [_cell(0, "[1]:"), _cell(1, "", hidden=True), _cell(2, "[3]:")]
    assert cells_not_run(cells) == []


def test_a_collapsed_cell_after_the_failure_did_not_run():
    # cell 1 failed (its error box is reported separately); Run All stopped there
    cells = [_cell(0, "[1]:"), _cell(1, "[2]:"), _cell(2, "", hidden=True), _cell(3, "[ ]:"), _cell(4, "", hidden=True)]
    assert cells_not_run(cells) == [2, 3, 4]

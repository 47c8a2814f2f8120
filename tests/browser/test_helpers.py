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

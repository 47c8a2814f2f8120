"""labkit.views: what a panel shows after each run (History, run_overview)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from chart_checks import assert_readable  # noqa: E402

from labkit import views  # noqa: E402
from labkit.errors import ConfigError  # noqa: E402
from labkit.result import RunResult  # noqa: E402

MiB = 2**20


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def run(precision="fp32", time_s=0.04, **config):
    return RunResult(config={"model": "small_cnn", "precision": precision, **config}, steps=12, timed_steps=9,
                     step_time_s=time_s, step_time_p10_s=time_s, step_time_p90_s=time_s, throughput=64 / time_s,
                     peak_memory_bytes=3 * MiB, accuracy=0.5, model_size_bytes=MiB, num_params=10,
                     num_trainable_params=10, losses=[2.0 - 0.1 * i for i in range(12)],
                     memory={"parameters": MiB, "activations": 2 * MiB})


def test_run_overview_prints_the_headline_and_draws_two_charts(capsys):
    import matplotlib.pyplot as plt

    from labkit.result import RunResult

    plt.close("all")
    res = RunResult(config={"model": "small_cnn", "dataset": "shapes10"}, steps=12, timed_steps=9,
                    step_time_s=0.04, step_time_p10_s=0.03, step_time_p90_s=0.05, throughput=1600.0,
                    peak_memory_bytes=2**20, accuracy=0.5, model_size_bytes=2**20, num_params=10,
                    num_trainable_params=10, losses=[2.0 - 0.1 * i for i in range(12)],
                    memory={"parameters": 2**20, "activations": 2 * 2**20})
    views.run_overview(res)
    assert "median 40.00 ms" in capsys.readouterr().out
    (fig,) = [plt.figure(n) for n in plt.get_fignums()]
    titles = [" ".join(ax.get_title().split()) for ax in fig.axes[:2]]
    assert titles[0].startswith("training loss")
    assert titles[1] == "memory by category: each one's own peak (black mark: the total peak)"
    assert_readable(fig)
    views.run_overview(RunResult(config={}, error="OutOfMemoryError: CUDA out of memory"))
    assert "run failed: OutOfMemoryError" in capsys.readouterr().out

def test_history_keeps_runs_and_draws_one_bar_per_run(capsys):
    history = views.History(("step_time_s", "peak_memory_bytes"), max_runs=2)
    for name, time_s in (("fp32", 0.04), ("bf16", 0.02), ("fp16", 0.03)):
        history(RunResult(config={"model": "small_cnn", "precision": name}, steps=12, timed_steps=9,
                          step_time_s=time_s, step_time_p10_s=time_s, step_time_p90_s=time_s,
                          throughput=64 / time_s, peak_memory_bytes=2 * MiB, accuracy=0.5, model_size_bytes=MiB,
                          num_params=10, num_trainable_params=10, memory={"parameters": MiB}))
    fig = plt.figure(plt.get_fignums()[-1])
    time_ax, memory_ax = fig.axes[:2]
    assert [t.get_text() for t in time_ax.get_xticklabels()] == ["precision=bf16", "precision=fp16"]  # last two
    assert [p.get_height() for p in time_ax.patches] == pytest.approx([20.0, 30.0])
    assert memory_ax.get_ylabel() == "peak memory (MiB)"
    assert "Step time: median 30.00 ms" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="metrics=\\['speed'\\] is not allowed"):
        views.History(("speed",))

def test_history_can_draw_the_stacked_memory_chart():
    history = views.History(("memory_breakdown", "step_time_s"))
    for name in ("fp32", "bf16"):
        history(RunResult(config={"model": "small_cnn", "precision": name}, steps=12, timed_steps=9,
                          step_time_s=0.04, step_time_p10_s=0.04, step_time_p90_s=0.04, throughput=1600.0,
                          peak_memory_bytes=3 * MiB, accuracy=0.5, model_size_bytes=MiB, num_params=10,
                          num_trainable_params=10, memory={"parameters": MiB, "activations": 2 * MiB}))
    stacked = plt.figure(plt.get_fignums()[-1]).axes[0]
    assert [t.get_text() for t in stacked.get_xticklabels()] == ["precision=fp32", "precision=bf16"]
    assert stacked.get_ylabel() == "memory (MiB)"


def test_a_panel_of_eight_long_runs_numbers_its_bars_and_stays_readable(capsys):
    # 03's panel: several fields differ, so each label is long; rotated, they ran into each other.
    history = views.History(("memory_breakdown", "step_time_s", "peak_memory_bytes"))
    for i in range(8):
        history(run(precision=["fp32", "bf16"][i % 2], checkpointing=[False, True, 2, 3][i % 4],
                    optimizer=["adamw", "adamw8bit"][i // 4], batch_size=16 * (i + 1), time_s=0.01 * (i + 1)))
    fig = plt.figure(plt.get_fignums()[-1])
    assert fig.get_figwidth() <= 10.0
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == [f"#{i}" for i in range(1, 9)]
    printed = capsys.readouterr().out
    assert "#8: batch_size=128, checkpointing=3, optimizer=adamw8bit, precision=bf16" in printed
    assert_readable(fig)


def test_run_names_keep_short_labels():
    assert views.run_names(["precision=fp32", "precision=bf16"]) == ["precision=fp32", "precision=bf16"]
    assert views.run_names(["a"] * 5) == ["#1", "#2", "#3", "#4", "#5"]
    assert views.run_names(["batch_size=16, precision=fp32"]) == ["#1"]


class _Point:
    def __init__(self, method, removed, accuracy):
        self.method, self.removed, self.accuracy = method, removed, accuracy

    def to_row(self):
        return {"method": self.method, "params_removed": self.removed, "test_accuracy": self.accuracy}

    def __str__(self):
        return f"{self.method} {self.removed}"


def test_trend_keeps_runs_as_points_one_line_per_hue(capsys):
    trend = views.Trend("params_removed", ("test_accuracy",), hue="method", max_runs=3)
    for point in (_Point("a", 0.2, 0.9), _Point("a", 0.5, 0.8), _Point("b", 0.5, 0.7), _Point("b", 0.8, 0.5)):
        trend(point)
    assert [r["params_removed"] for r in trend.runs] == [0.5, 0.5, 0.8]  # the last 3
    assert capsys.readouterr().out.splitlines()[-1] == "b 0.8"
    ax = plt.gcf().axes[0]
    assert sorted(len(line.get_xdata()) for line in ax.get_lines()) == [1, 2]
    plt.close("all")
    with pytest.raises(ConfigError, match=r"Trend column='latency_s' is not allowed"):
        views.Trend("params_removed", ("latency_s",))(_Point("a", 0.1, 0.9))


def test_bars_keep_one_bar_per_x_and_hue_the_latest_run(capsys):
    bars = views.Bars("method", ("test_accuracy",), hue="params_removed")
    for point in (_Point("a", 0.2, 0.9), _Point("a", 0.2, 0.6), _Point("b", 0.2, 0.7), _Point("b", 0.8, 0.5)):
        bars(point)
    assert [(r["method"], r["params_removed"], r["test_accuracy"]) for r in bars.runs] == [
        ("a", 0.2, 0.6), ("b", 0.2, 0.7), ("b", 0.8, 0.5)]  # a's first run was replaced by its rerun
    assert capsys.readouterr().out.splitlines()[-1] == "b 0.8"
    ax = plt.gcf().axes[0]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches if p.get_height())
    assert heights == [50.0, 60.0, 70.0]  # percent
    plt.close("all")
    with pytest.raises(ConfigError, match=r"Bars column='latency_s' is not allowed"):
        views.Bars("method", ("latency_s",))(_Point("a", 0.1, 0.9))

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from chart_checks import assert_readable  # noqa: E402

from labkit import plots  # noqa: E402
from labkit.errors import ConfigError  # noqa: E402
from labkit.result import MEMORY_CATEGORIES, RunResult  # noqa: E402

MiB = 2**20
REF = "reference: A100 2024-05-01"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture
def df():
    return pd.DataFrame({
        "precision": ["fp32", "bf16", "fp32", "bf16", "fp16"],
        "batch_size": [32, 32, 64, 64, 64],
        "step_time_s": [0.100, 0.050, 0.200, 0.100, np.nan],
        "peak_memory_bytes": [10 * MiB, 6 * MiB, 20 * MiB, 12 * MiB, None],
        "accuracy": [0.5, 0.52, 0.61, 0.6, None],
        "source": "live",
        "error": [None, None, None, None, "ConfigError: fp16 needs a GPU"],
    })


@pytest.fixture
def reference():
    return pd.DataFrame({
        "precision": ["fp32", "bf16"],
        "batch_size": [64, 64],
        "step_time_s": [0.010, 0.004],
        "peak_memory_bytes": [30 * MiB, 18 * MiB],
        "accuracy": [0.6, 0.6],
        "source": REF,
        "error": [None, None],
    })


def bars(ax):
    """(x centre, height, hatch) of each bar, in drawing order."""
    return [(round(p.get_x() + p.get_width() / 2, 6), round(p.get_height(), 6), p.get_hatch()) for p in ax.patches]


def test_metrics_table_gives_units():
    assert plots.axis_label("step_time_s") == "step time (ms)"
    assert plots.axis_label("peak_memory_bytes") == "peak memory (MiB)"
    assert plots.axis_label("throughput") == "throughput (samples/s)"
    assert plots.axis_label("accuracy") == "accuracy (%)"
    assert plots.axis_label("achieved_flops") == "achieved FLOP/s (TFLOP/s)"
    assert plots.axis_label("mem_optimizer_state_bytes") == "memory: optimizer state (MiB)"
    assert plots.axis_label("my_metric") == "my_metric"  # an unknown column: its name
    assert plots.metric("achieved_flops").scale == 1e-12


def test_bar_heights_in_display_units_and_failed_row_skipped(df):
    ax = plots.bar(df, x="precision", y="step_time_s", hue="batch_size")
    # fp16 failed: only fp32 and bf16 groups, 2 batch sizes each; heights in ms.
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16"]
    assert sorted(h for _, h, _ in bars(ax)) == [50.0, 100.0, 100.0, 200.0]
    assert {(x, h) for x, h, _ in bars(ax)} == {(-0.2, 100.0), (0.8, 50.0), (0.2, 200.0), (1.2, 100.0)}
    assert ax.get_ylabel() == "step time (ms)"
    assert ax.get_xlabel() == "precision"
    assert "1 failed run skipped" in ax.get_title()
    assert ax.get_legend_handles_labels()[1] == ["batch_size=32", "batch_size=64"]


def test_bar_reference_is_hatched_and_labelled(df, reference):
    ax = plots.bar(df, x="precision", y="peak_memory_bytes", hue="batch_size", reference=reference)
    drawn = bars(ax)
    assert len(drawn) == 6
    hatched = [(h, hatch) for _, h, hatch in drawn if hatch]
    assert sorted(h for h, _ in hatched) == [18.0, 30.0]  # MiB
    assert all(hatch == "//" for _, hatch in hatched)
    labels = ax.get_legend_handles_labels()[1]
    assert f"batch_size=64, {REF}" in labels
    assert "batch_size=64, live" in labels
    assert ax.get_ylabel() == "peak memory (MiB)"


def test_bar_without_hue_and_accuracy_in_percent(df):
    ax = plots.bar(df, x="precision", y="accuracy")
    # duplicates of the same (x, hue) are reduced to their median
    assert sorted(h for _, h, _ in bars(ax)) == [55.5, 56.0]
    assert ax.get_ylabel() == "accuracy (%)"


def test_bar_draws_given_axes_and_unknown_column_raw():
    data = pd.DataFrame({"model": ["a", "b"], "score": [3.0, 4.0]})
    fig, ax = plt.subplots()
    assert plots.bar(data, x="model", y="score", ax=ax, title="scores") is ax
    assert [h for _, h, _ in bars(ax)] == [3.0, 4.0]
    assert ax.get_ylabel() == "score"
    assert ax.get_title() == "scores"


def test_bar_all_failed_does_not_crash():
    data = pd.DataFrame({"precision": ["fp16"], "step_time_s": [np.nan], "error": ["out of memory"]})
    ax = plots.bar(data, x="precision", y="step_time_s")
    assert bars(ax) == []
    assert "nothing to plot" in ax.get_title()


def test_bad_column_raises_with_available_columns(df, reference):
    with pytest.raises(ConfigError, match=r"y='step_time' is not allowed: a column \(available: .*step_time_s"):
        plots.bar(df, x="precision", y="step_time")
    with pytest.raises(ConfigError, match="Did you mean 'step_time_s'"):
        plots.line(df, x="batch_size", y="step_time")
    with pytest.raises(ConfigError, match="x='batchsize'"):
        plots.line(df, x="batchsize", y="step_time_s")
    with pytest.raises(ConfigError, match="hue='dtype'"):
        plots.bar(df, x="precision", y="step_time_s", hue="dtype")
    with pytest.raises(ConfigError, match="a column of reference"):
        plots.bar(df, x="precision", y="step_time_s", reference=reference.drop(columns="step_time_s"))
    with pytest.raises(ConfigError, match="a pandas DataFrame"):
        plots.bar([1, 2], x="precision", y="step_time_s")


def test_line_one_line_per_hue_reference_dashed(df, reference):
    ax = plots.line(df, x="batch_size", y="step_time_s", hue="precision", reference=reference, logx=True)
    lines = {line.get_label(): line for line in ax.lines}
    assert set(lines) == {"precision=fp32, live", "precision=bf16, live",
                          f"precision=fp32, {REF}", f"precision=bf16, {REF}"}
    fp32 = lines["precision=fp32, live"]
    assert list(fp32.get_xdata()) == [32, 64]
    assert list(fp32.get_ydata()) == pytest.approx([100.0, 200.0])
    assert fp32.get_linestyle() == "-"
    ref = lines[f"precision=bf16, {REF}"]
    assert ref.get_linestyle() == "--"
    assert list(ref.get_ydata()) == pytest.approx([4.0])
    assert ref.get_color() == lines["precision=bf16, live"].get_color()
    assert ax.get_xscale() == "log"
    assert ax.get_xlabel() == "batch size (samples)"
    assert ax.get_ylabel() == "step time (ms)"
    assert "1 failed run skipped" in ax.get_title()


def test_line_needs_numeric_x(df):
    with pytest.raises(ConfigError, match="a numeric column for line"):
        plots.line(df, x="precision", y="step_time_s")


def result(label_precision, losses=(), memory=None, peak=None, error=None):
    return RunResult(config={"model": "small_cnn", "precision": label_precision}, losses=list(losses),
                     memory=memory or {}, peak_memory_bytes=peak, error=error)


def test_loss_curve_raw_and_smoothed_lines():
    losses = np.linspace(2.0, 0.5, 40).tolist()
    ax = plots.loss_curve([result("fp32", losses), result("bf16", losses[:5])])
    # 40 steps: raw + smoothed; 5 steps: raw only.
    assert len(ax.lines) == 3
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["precision=fp32", "precision=bf16"]
    raw = ax.lines[0]
    assert list(raw.get_ydata()) == pytest.approx(losses)
    assert list(raw.get_xdata()) == list(range(1, 41))
    assert ax.get_xlabel() == "optimizer step"
    assert "loss" in ax.get_ylabel()


def test_loss_curve_single_result_and_dict():
    ax = plots.loss_curve(result("fp32", [1.0, 0.8]))
    assert ax.get_legend_handles_labels()[1] == ["small_cnn"]
    ax = plots.loss_curve({"mine": result("fp32", [1.0, 0.8]), "failed": result("fp16", error="NaN loss")})
    assert ax.get_legend_handles_labels()[1] == ["mine"]
    assert "failed" in ax.get_title()


def test_memory_breakdown_stacks_categories_in_order():
    memory = {c: (i + 1) * MiB for i, c in enumerate(MEMORY_CATEGORIES)}
    half = {c: v // 2 for c, v in memory.items()}
    ax = plots.memory_breakdown({"fp32": result("fp32", memory=memory, peak=12 * MiB),
                                 "bf16": result("bf16", memory=half, peak=6 * MiB),
                                 "oom": result("fp16", error="out of memory")})
    assert len(ax.patches) == 2 * len(MEMORY_CATEGORIES)
    fp32 = [p for p in ax.patches if abs(p.get_x() + p.get_width() / 2) < 1e-9]
    assert [p.get_height() for p in fp32] == pytest.approx([1, 2, 3, 4, 5])
    assert [p.get_y() for p in fp32] == pytest.approx([0, 1, 3, 6, 10])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [c.replace("_", " ") for c in reversed(MEMORY_CATEGORIES)] + ["total peak (MiB above)"]
    peak = next(line for line in ax.lines if line.get_label() == "total peak")
    assert list(peak.get_ydata()) == pytest.approx([12.0, 6.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16"]
    assert ax.get_ylabel() == "memory (MiB)"
    assert "oom" in ax.get_title()


def test_plots_never_show(monkeypatch, df):
    monkeypatch.setattr(plt, "show", lambda *a, **k: pytest.fail("plt.show() called"))
    plots.bar(df, x="precision", y="step_time_s")
    plots.line(df, x="batch_size", y="throughput" if "throughput" in df else "step_time_s")
    plots.loss_curve(result("fp32", [1.0]))
    plots.memory_breakdown(result("fp32", memory={"parameters": MiB}))


def test_timing_pitfalls_frame_plots_in_milliseconds():
    from labkit.measure import TimingPitfalls

    tp = TimingPitfalls(first_call_s=0.2, warm_median_s=0.04, unsynced_median_s=0.01, device="cuda", repeats=5)
    ax = plots.bar(tp.to_frame(), x="method", y="time_s")
    assert sorted(round(p.get_height(), 6) for p in ax.patches) == [10.0, 40.0, 200.0]
    assert "(ms)" in ax.get_ylabel()


def test_memory_breakdown_from_a_results_frame():
    from labkit.results import to_frame

    memory = {c: (i + 1) * MiB for i, c in enumerate(MEMORY_CATEGORIES)}
    runs = [result("fp32", memory=memory, peak=12 * MiB), result("bf16", memory=memory, peak=9 * MiB)]
    frame = to_frame(runs)
    frame["setup"] = ["A", "B"]
    ax = plots.memory_breakdown(frame, label="setup")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["A", "B"]
    assert [p.get_height() for p in ax.patches[::2]] == pytest.approx([1, 2, 3, 4, 5])
    ax = plots.memory_breakdown(frame)  # labelled by the config fields that differ
    assert [t.get_text() for t in ax.get_xticklabels()] == ["precision=fp32", "precision=bf16"]
    with pytest.raises(ConfigError, match="label='stage' is not allowed: a column of the frame"):
        plots.memory_breakdown(frame, label="stage")


def test_loss_scale_marks_skipped_steps():
    trace = pd.DataFrame({"step": [1, 2, 3, 4], "scale": [2.0**18, 2.0**17, 2.0**16, 2.0**16],
                          "skipped": [True, True, False, False]})
    ax = plots.loss_scale(trace)
    skipped = next(line for line in ax.lines if line.get_label().startswith("step skipped"))
    assert list(skipped.get_xdata()) == [1, 2]
    assert ax.get_yscale() == "log" and "2 of 4 steps skipped" in ax.get_title()
    with pytest.raises(ConfigError, match="column='scale' is not allowed"):
        plots.loss_scale(trace.drop(columns="scale"))


def test_an_empty_reference_draws_nothing_whatever_its_columns(df):
    ax = plots.line(df, x="batch_size", y="step_time_s", hue="precision", reference=pd.DataFrame(columns=["model"]))
    assert {line.get_linestyle() for line in ax.lines} == {"-"}


def test_lines_put_chosen_metrics_on_a_log_axis(df):
    axes = plots.lines(df, x="batch_size", ys=["step_time_s", "peak_memory_bytes"], logy=["peak_memory_bytes"])
    assert [ax.get_yscale() for ax in axes[:2]] == ["linear", "log"]
    with pytest.raises(ConfigError, match="logy='accuracy' is not allowed: one of the charted metrics"):
        plots.lines(df, x="batch_size", ys=["step_time_s"], logy=["accuracy"])
    plt.close("all")


def test_lines_draws_one_chart_per_metric(df):
    axes = plots.lines(df, x="batch_size", ys=["step_time_s", "peak_memory_bytes", "accuracy", "step_time_s"],
                       hue="precision")
    assert len(axes) == 4 and len(plt.gcf().axes) == 4  # two rows of three, the spare axes removed
    assert [ax.get_ylabel() for ax in axes[:2]] == ["step time (ms)", "peak memory (MiB)"]
    with pytest.raises(ConfigError, match="ys=\\[\\] is not allowed"):
        plots.lines(df, x="batch_size", ys=[])


def test_batch_search_plot_marks_probes_budget_and_answer():
    from labkit.techniques.oom_backoff import BatchSearch, Probe

    search = BatchSearch(best=48, tried=[Probe(32, True, 20 * MiB), Probe(64, False, None), Probe(48, True, 30 * MiB)],
                         budget_bytes=32 * MiB, state_bytes={"total": 4 * MiB})
    ax = plots.batch_search(search)
    fits = next(line for line in ax.lines if line.get_label() == "fits")
    assert list(fits.get_xdata()) == [32, 48] and list(fits.get_ydata()) == [20, 30]
    failed = next(line for line in ax.lines if line.get_label() == "does not fit")
    assert list(failed.get_ydata())[0] > 32  # out of memory, no peak: drawn above the budget
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "budget" in labels and "largest that fits: 48" in labels
    assert sorted(t.get_text() for t in ax.texts) == ["1", "2", "3"]
    assert_readable(ax.get_figure())


def test_batch_search_plot_leaves_out_crowded_numbers():
    # notebook 02's search: doubling to 256, then a bisection whose last probes sit within a few samples
    from labkit.techniques.oom_backoff import BatchSearch, Probe

    sizes = [16, 32, 64, 128, 256, 512, 384, 320, 288, 272, 280, 284, 282, 281]
    tried = [Probe(n, n <= 281, n * 0.45 * MiB) for n in sizes]
    ax = plots.batch_search(BatchSearch(best=281, tried=tried, budget_bytes=127 * MiB, state_bytes={"total": 4 * MiB}))
    shown = [t.get_text() for t in ax.texts]
    assert shown[:6] == ["1", "2", "3", "4", "5", "6"] and 0 < len(shown) < len(sizes)
    assert f"{len(sizes) - len(shown)} crowded near the answer left out" in " ".join(ax.get_title().split())
    assert_readable(ax.get_figure())


def test_checkpoint_tradeoff_plot_draws_memory_and_the_trade():
    frame = pd.DataFrame({"segments": [0, 1, 2], "peak_memory_bytes": [30 * MiB, 30 * MiB, 28 * MiB],
                          "mem_activations_bytes": [26 * MiB, 26 * MiB, 20 * MiB],
                          "predicted_activation_bytes": [26 * MiB, 26 * MiB, 19 * MiB],
                          "peak_ratio": [1.0, 1.0, 0.93], "activation_ratio": [1.0, 1.0, 0.77],
                          "time_ratio": [1.0, 1.3, 1.35], "sqrt_rule_segments": 2, "error": None})
    left, right = plots.checkpoint_tradeoff(frame)
    measured = next(line for line in left.lines if line.get_label() == "activations (measured)")
    assert list(measured.get_ydata()) == pytest.approx([26, 26, 20])
    rule = next(line for line in left.lines if line.get_label() == "sqrt(n) rule")
    assert list(rule.get_xdata()) == [2, 2]
    peak = next(line for line in right.lines if line.get_label() == "peak (ratio)")
    assert list(peak.get_xdata()) == [1.0, 1.3, 1.35] and list(peak.get_ydata()) == [1.0, 1.0, 0.93]
    with pytest.raises(ConfigError, match="column='time_ratio' is not allowed"):
        plots.checkpoint_tradeoff(frame.drop(columns="time_ratio"))


# Readable at the output area's size: every chart kind with long labels and many bars


LONG = ["baseline", "+AMP", "+checkpointing", "+8-bit optimizer", "all savers together"]


def test_bars_with_long_labels_stay_readable():
    frame = pd.DataFrame({"stage": LONG, "step_time_s": [0.1, 0.05, 0.12, 0.1, 0.07], "source": "live"})
    ax = plots.bar(frame, x="stage", y="step_time_s")
    assert [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()] == LONG
    assert_readable(ax.get_figure())


def test_many_metrics_wrap_into_rows_no_wider_than_the_output_area(df, reference):
    axes = plots.lines(df, x="batch_size", ys=["step_time_s", "peak_memory_bytes", "accuracy"], reference=reference)
    fig = axes[0].get_figure()
    assert fig.get_figwidth() <= plots.FIGURE_WIDTH_IN and len(axes) == 3
    assert_readable(fig)
    axes = plots.bars(df, x="precision", ys=["step_time_s", "peak_memory_bytes", "accuracy"], hue="batch_size")
    assert_readable(axes[0].get_figure())


def test_memory_breakdown_with_long_labels_stays_readable():
    # notebook 03's staged view: five bars, neighbouring peaks almost equal ("peak 29.3 MiB" ran into "peak 29.5 MiB")
    memory = {c: (i + 1) * MiB for i, c in enumerate(MEMORY_CATEGORIES)}
    runs = {label: result("fp32", memory=memory, peak=peak * MiB) for label, peak
            in zip(LONG, [31.1, 18.6, 29.3, 29.5, 16], strict=True)}
    ax = plots.memory_breakdown(runs)
    assert [t.get_text() for t in ax.texts] == ["31.1", "18.6", "29.3", "29.5", "16"]
    assert_readable(ax.get_figure())


def test_the_checker_catches_tiny_text_and_collisions():
    fig, ax = plt.subplots(figsize=(18, 4))
    ax.set_xticks(range(8))
    ax.set_xticklabels([f"checkpointing=True, optimizer=adamw8bit {i}" for i in range(8)])
    with pytest.raises(AssertionError, match="px tall when shown") as caught:
        assert_readable(fig)
    assert "overlap" in str(caught.value)


def test_the_checker_catches_annotations_on_top_of_each_other():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar([0, 1], [29.3, 29.5])
    for x, y in ((0, 29.3), (1, 29.5)):
        ax.annotate(f"peak {y} MiB of memory", (x, y), ha="center")
    with pytest.raises(AssertionError, match="overlaps 'peak 29.5 MiB of memory'"):
        assert_readable(fig)


def test_setup_labels_wrap_at_spaces_instead_of_standing_on_end():
    # notebook 01's comparison, three charts two to a row: "fp16 + GradScaler" fits on two lines
    frame = pd.DataFrame({"setup": ["fp32", "fp32 + TF32", "fp16 + GradScaler", "bf16"], "source": "live",
                          "step_time_s": [0.07, 0.07, 1.1, 0.05], "peak_memory_bytes": [30e6, 30e6, 19e6, 19e6],
                          "accuracy": [0.69, 0.69, 0.70, 0.69]})
    axes = plots.bars(frame, x="setup", ys=["step_time_s", "peak_memory_bytes", "accuracy"])
    ticks = axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == ["fp32", "fp32 +\nTF32", "fp16 +\nGradScaler", "bf16"]
    assert {t.get_rotation() for t in ticks} == {0.0}
    assert_readable(axes[0].get_figure())


@pytest.mark.parametrize("logy", [False, True])
def test_a_bar_charts_legend_never_covers_a_bar(logy):
    # the shape of notebook 01's speed-ups: live bars, then taller published ones at the right edge
    live = pd.DataFrame({"setup": ["fp32", "fp32 + TF32", "fp16 + GradScaler", "bf16"],
                         "speedup_vs_fp32": [1.0, 1.1, 0.08, 1.9], "source": "live"})
    published = pd.DataFrame({"setup": ["AMP recipe: low", "AMP recipe: high", "T4 peak ratio"],
                              "speedup_vs_fp32": [2.0, 3.0, 8.0],
                              "source": ["published: PyTorch recipe 'Automatic Mixed Precision' "
                                         "(2-3x on Volta, Turing, Ampere)"] * 2
                              + ["published: NVIDIA T4 datasheet, tensor-core fp16 peak / fp32 peak"]})
    ax = plots.bar(live, x="setup", y="speedup_vs_fp32", reference=published, logy=logy)
    fig = ax.get_figure()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches if p.get_height() > 0]
    assert len(bars) == 7
    assert not [b for b in bars if b.overlaps(legend)], "the legend hides a bar"
    assert ax.get_ylabel() == "speed-up over fp32 (x)"
    plt.close(fig)


def test_bars_draws_the_reference_only_where_it_has_the_metric_and_keeps_legends_off_the_bars():
    df = pd.DataFrame({"label": ["a", "b", "c"], "time_ratio": [1.6, 1.9, 2.0], "memory_ratio": [0.5, 0.6, 0.7]})
    ref = pd.DataFrame({"label": ["a"], "time_ratio": [0.4], "source": ["published: somewhere"]})
    axes = plots.bars(df, x="label", ys=["time_ratio", "memory_ratio"], reference=ref)
    assert "skipped" not in axes[1].get_title()  # the reference has no memory figure: not counted as missing
    assert len([p for p in axes[0].patches if p.get_height() > 0]) == 4
    assert axes[1].get_legend() is None
    legend = axes[0].get_legend()
    renderer = axes[0].get_figure().canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert not any(p.get_window_extent(renderer).overlaps(box) for p in axes[0].patches if p.get_height() > 0)

"""ExperimentPanel without a kernel or training. Also run under ipywidgets 7.7.1, in Colab's image (make test)."""

import html
import types

import ipywidgets
import pytest

from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.widgets import ExperimentPanel, make_control

CONTROLS = {"precision": ["fp32", "bf16"], "batch_size": (16, 256, 16), "lr": (1e-4, 1e-2, 1e-4),
            "channels_last": False}


class FakeRun:
    """Records the configs it is called with; returns a small table (no training)."""

    def __init__(self, error=None):
        self.configs, self.error = [], error

    def __call__(self, cfg):
        self.configs.append(cfg)
        if self.error:
            raise self.error
        return {"batch_size": cfg.batch_size, "step_time_s": 0.01}


def make_panel(run=None, **kwargs):
    shown = []
    panel = ExperimentPanel(run or FakeRun(), CONTROLS, base=RunConfig(max_steps=4), show=shown.append, **kwargs)
    return panel, shown


def test_each_control_kind_maps_to_its_widget():
    panel, _ = make_panel()
    assert type(panel.controls["precision"]) is ipywidgets.Dropdown
    assert type(panel.controls["batch_size"]) is ipywidgets.IntSlider
    assert type(panel.controls["lr"]) is ipywidgets.FloatSlider
    assert type(panel.controls["channels_last"]) is ipywidgets.Checkbox
    assert isinstance(panel.button, ipywidgets.Button)
    assert isinstance(panel.progress, ipywidgets.IntProgress)
    assert isinstance(panel.status, ipywidgets.HTML)
    assert isinstance(panel.output, ipywidgets.Output)
    assert isinstance(panel.widget, ipywidgets.VBox)
    # initial values come from base where allowed
    assert panel.controls["batch_size"].value == 64
    assert panel.controls["precision"].value == "fp32"
    assert panel.controls["lr"].value == pytest.approx(1e-3)
    assert panel.controls["batch_size"].description == "batch_size"


def test_click_runs_with_control_values_and_shows_result():
    run = FakeRun()
    panel, shown = make_panel(run)
    panel.controls["precision"].value = "bf16"
    panel.controls["batch_size"].value = 128
    panel.controls["channels_last"].value = True
    assert panel.config() == RunConfig(max_steps=4, precision="bf16", batch_size=128, lr=1e-3,
                                       channels_last=True)
    panel.click()
    assert run.configs == [panel.config()]
    assert run.configs[0].max_steps == 4  # base kept
    assert panel.last_result == {"batch_size": 128, "step_time_s": 0.01}
    assert shown == [panel.last_result]
    assert panel.last_error is None
    assert not panel.running and not panel.button.disabled
    assert "Done" in panel.status.value
    assert panel.progress.value == panel.progress.max


def test_button_press_is_click():
    run = FakeRun()
    panel, _ = make_panel(run)
    panel.button.click()  # what the browser triggers
    assert len(run.configs) == 1


def test_run_error_is_caught_and_shown():
    run = FakeRun(error=RuntimeError("CUDA out of memory"))
    panel, shown = make_panel(run)
    panel.click()  # must not raise: ipywidgets would swallow it
    assert isinstance(panel.last_error, RuntimeError)
    assert "CUDA out of memory" in panel.status.value
    assert "color:#b00" in panel.status.value
    assert shown == [] and panel.last_result is None
    assert not panel.running and not panel.button.disabled


def test_bad_combination_is_a_config_error_in_the_status():
    run = FakeRun()
    panel = ExperimentPanel(run, {"batch_size": [30, 32], "grad_accum": [1, 4]}, show=lambda r: None)
    panel.controls["batch_size"].value = 30
    panel.controls["grad_accum"].value = 4
    panel.click()
    assert isinstance(panel.last_error, ConfigError)
    assert "grad_accum=4 is not allowed" in panel.status.value
    assert run.configs == []
    # a later good run clears the error
    panel.controls["batch_size"].value = 32
    panel.click()
    assert panel.last_error is None and len(run.configs) == 1


def test_click_while_running_is_refused():
    run = FakeRun()
    panel, shown = make_panel(run)
    panel.running = True
    panel.click()
    assert run.configs == [] and shown == []
    assert "already in progress" in panel.status.value


def test_progress_callback_passed_as_on_step():
    seen = []

    def run(cfg, on_step=None):
        for step in range(1, 5):
            on_step(step, 4)
            seen.append((panel.progress.value, panel.progress.max))
        return "done"

    panel = ExperimentPanel(run, {"batch_size": [32, 64]}, show=lambda r: None)
    panel.click()
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert panel.last_result == "done"


def test_a_run_prints_into_the_panel_and_its_progress_bar_is_the_panels(capsys, monkeypatch):
    # A widget callback's stray output lands in JupyterLab's log console: the run's prints (notes, a
    # tqdm bar) must go to the panel's output area, and tqdm is switched off where the run allows it.
    calls, inside = [], [False]

    def run(cfg, progress=True, on_step=None):
        calls.append((progress, inside[0]))
        print("labkit note: fp16 on this CPU is emulated")
        return types.SimpleNamespace(warnings=["fp16 on this CPU is emulated"])

    panel = ExperimentPanel(run, {"batch_size": [32, 64]}, show=lambda r: None)
    monkeypatch.setattr(type(panel.output), "__enter__", lambda self: inside.__setitem__(0, True))
    monkeypatch.setattr(type(panel.output), "__exit__", lambda self, *exc: inside.__setitem__(0, False))
    panel.click()
    assert calls == [(False, True)]  # no tqdm bar, and the run itself happened inside the output area
    assert "Note: fp16 on this CPU is emulated" in panel.status.value  # said under every run that had it


def test_default_show_displays_the_result(capsys):
    panel = ExperimentPanel(lambda cfg: f"result for batch {cfg.batch_size}", {"batch_size": [32, 64]})
    panel.click()
    # Outside a kernel the Output area passes display() through to stdout.
    assert "result for batch 64" in capsys.readouterr().out


def test_unknown_control_field_lists_runconfig_fields():
    with pytest.raises(ConfigError, match=r"controls key='batchsize' is not allowed: a RunConfig field \(model, "
                                          r".*Did you mean 'batch_size'"):
        ExperimentPanel(FakeRun(), {"batchsize": [32, 64]})


def test_bad_control_specs():
    with pytest.raises(ConfigError, match=r"controls\['batch_size'\].*pass a list: \[32, 64, 128\]"):
        make_control("batch_size", (32, 64, 128))
    with pytest.raises(ConfigError, match="a list of values"):
        make_control("precision", "fp32")
    with pytest.raises(ConfigError, match="a list of values"):
        make_control("precision", [])


def test_dropdown_keeps_value_types():
    dropdown = make_control("max_steps", [None, 10, 20], default=20)
    assert dropdown.value == 20
    assert make_control("max_steps", [None, 10], default=5).value is None


def test_panel_displays_as_its_widget():
    panel, _ = make_panel(title="Mixed precision")
    assert hasattr(panel, "_ipython_display_")
    bundle = panel._repr_mimebundle_()
    assert "text/plain" in bundle
    assert "Mixed precision" in panel.widget.children[0].value


def test_options_go_to_run_as_keywords():
    seen = []

    def run(cfg, lr_scaling=False):
        seen.append((cfg.batch_size, lr_scaling))
        return {"ok": True}

    panel = ExperimentPanel(run, {"batch_size": (16, 256, 16)}, base=RunConfig(max_steps=4),
                            options={"lr_scaling": [False, "linear", "sqrt"]}, show=lambda r: None)
    assert panel.options["lr_scaling"].value is False  # the first option
    panel.options["lr_scaling"].value = "sqrt"
    panel.click()
    assert seen == [(64, "sqrt")] and panel.last_error is None
    assert "lr_scaling='sqrt'" in html.unescape(panel.status.value)


def test_options_start_at_the_run_functions_defaults():
    def run(cfg, method="b", amount=8, unset=None):
        return {"ok": True}

    panel = ExperimentPanel(run, {"batch_size": (16, 256, 16)}, base=RunConfig(max_steps=4),
                            options={"method": ["a", "b"], "amount": (1, 32, 1), "unset": ["x", "y"]},
                            show=lambda r: None)
    assert panel.options["method"].value == "b" and panel.options["amount"].value == 8
    assert panel.options["unset"].value == "x"  # the default None is not an option: the first one


def test_options_must_be_keywords_of_run():
    with pytest.raises(ConfigError, match="options key='warmup' is not allowed: a keyword argument of fake_run"):
        def fake_run(cfg):
            return cfg

        ExperimentPanel(fake_run, {"batch_size": (16, 256, 16)}, options={"warmup": [0, 4]})
    with pytest.raises(ConfigError, match="options=\\[1\\] is not allowed"):
        ExperimentPanel(lambda cfg: cfg, {"batch_size": (16, 256, 16)}, options=[1])


def test_dropdown_refuses_options_it_cannot_tell_apart():
    with pytest.raises(ConfigError, match=r"True == 1, so the dropdown cannot tell them apart"):
        make_control("checkpointing", [False, True, 1, 2])
    assert make_control("checkpointing", [False, True, 2, 3]).options[2] == ("2", 2)


def test_an_error_inside_the_output_area_still_reaches_the_status(monkeypatch):
    # In a kernel, Output.__exit__ shows an exception and swallows it: the panel must still report it.
    monkeypatch.setattr(ipywidgets.Output, "__exit__", lambda self, *exc: True)
    panel, _ = make_panel(FakeRun(error=ConfigError("batch_size", 999, "at most 512")))
    panel.click()
    assert isinstance(panel.last_error, ConfigError) and panel.last_result is None
    assert "ConfigError" in panel.status.value and "batch_size=999" in html.unescape(panel.status.value)
    assert not panel.running and not panel.button.disabled


def test_a_chart_is_rendered_with_ink_or_the_panel_says_it_came_out_blank():
    import matplotlib.pyplot as plt

    from labkit.widgets import _render_png

    fig, ax = plt.subplots()
    ax.bar([0, 1], [1, 2])
    assert _render_png(fig).startswith(b"\x89PNG")
    blank, ax = plt.subplots()
    ax.set_axis_off()  # an axes that draws nothing: a blank chart
    with pytest.raises(RuntimeError, match=r"a chart came out blank: 1 axes, .* 0 bars and lines"):
        _render_png(blank)
    plt.close("all")


def test_a_panel_shows_the_chart_its_run_drew_even_if_pyplot_lost_it(monkeypatch):
    """The figures come from labkit's own record of the charts it made, not from pyplot's registry.

    A chart closed behind the panel's back (what JupyterLab's blank panel charts pointed to) is still shown
    whole.
    """
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkit import plots
    from labkit import widgets as labkit_widgets

    shown = []
    monkeypatch.setattr(labkit_widgets, "display", lambda obj: shown.append(obj))

    registered = []

    def show(result):
        plots.bar(pd.DataFrame({"setup": ["a", "b"], "step_time_s": [0.1, 0.2]}), x="setup", y="step_time_s")
        registered.append(len(plt.get_fignums()))  # made outside pyplot: the inline backend cannot reach it
        plt.close("all")  # someone else closes every figure before the panel displays them
        plt.figure()  # and an empty one is left open: nothing to show

    panel = ExperimentPanel(lambda cfg: {"ok": True}, {"batch_size": (16, 256, 16)}, base=RunConfig(max_steps=4),
                            show=show)
    panel.click()
    assert panel.last_error is None and len(shown) == 1 and registered == [0]
    assert shown[0].data.startswith(b"\x89PNG") and not plt.get_fignums()
    import io

    import numpy as np
    from PIL import Image as PILImage

    pixels = np.asarray(PILImage.open(io.BytesIO(shown[0].data)).convert("L"))
    assert (pixels < 200).mean() > 0.01  # the bars, not a blank canvas


def test_a_language_model_run_is_summarised_in_tokens_not_samples(capsys):
    # A panel's summary line gives samples/s for image runs; a language-model run is read in tokens/s, and in
    # real tokens/s when its batches hold padding (the padding's share said beside it).
    from labkit import views
    from labkit.result import RunResult

    lm = dict(config={"model": "tiny_llama", "dataset": "tiny_stories"}, steps=6, timed_steps=4,
              step_time_s=0.05, step_time_p10_s=0.05, step_time_p90_s=0.05, throughput=160.0,
              peak_memory_bytes=2**20, model_size_bytes=2**20, num_params=10, num_trainable_params=10,
              losses=[3.0, 2.9], tokens_per_s=10240.0)
    runs = iter([RunResult(**lm, real_tokens_per_s=7680.0, pad_fraction=0.25),
                 RunResult(**lm, real_tokens_per_s=10240.0, pad_fraction=0.0)])
    panel = ExperimentPanel(lambda cfg: next(runs), {"batch_size": [8, 16]}, show=views.History(("tokens_per_s",)))
    panel.click()
    padded = " ".join(capsys.readouterr().out.split())  # the summary is wrapped to the output area's width
    panel.click()
    packed = " ".join(capsys.readouterr().out.split())
    assert panel.last_error is None
    assert "Throughput: 7,680 real tokens/s (10,240 tokens/s counting the 25% padding)." in padded
    assert "Throughput: 10,240 tokens/s." in packed
    assert "samples/s" not in padded + packed

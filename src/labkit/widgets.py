"""`ExperimentPanel`: controls for a few `RunConfig` fields, a Run button, a progress bar and an output area.

Notebook-only: this module imports ipywidgets, and ``labkit/__init__`` never imports it. Works with
ipywidgets 7.7.1 (what Colab ships) and 8.x: only core widgets and arguments both versions share.

Pressing Run builds ``base.replace(**control values)``, calls ``run(cfg)`` and draws what it returns with
``show`` in the output area; matplotlib figures ``show`` leaves open are displayed and closed after it returns.
Errors (a `ConfigError` from a bad combination, or anything ``run`` raises) are caught, shown in red in the
status line and kept in ``last_error``: ipywidgets would otherwise swallow them silently. A click while a run is
in progress is refused. A ``run`` that takes a keyword ``on_step`` receives ``panel.progress_callback`` to move
the progress bar.

A control is a list of values (Dropdown), a ``(min, max, step)`` tuple (IntSlider when all ints, else
FloatSlider) or a bool (Checkbox, initially that value); ``base`` also sets the initial dropdown/slider values
where they are allowed. ``options`` are controls that are not `RunConfig` fields: each starts at ``run``'s
default for that keyword when the spec offers it, and their values go to ``run`` as keyword arguments (e.g.
``{"lr_scaling": [False, "linear", "sqrt"]}``), so ``run`` must accept each name. The ``estimate`` line (default
`labkit.estimates.estimate_run`: "about 40 s", from runs already finished on this machine) is updated whenever a
control changes, so that a slow choice such as fp16 emulated on a CPU is known before Run is pressed.
"""

from __future__ import annotations

import html
import inspect
import io
import numbers
import sys
import time
import traceback

import ipywidgets as widgets
import pandas as pd
from IPython.display import Image, display
from matplotlib._pylab_helpers import Gcf
from matplotlib.backends.backend_agg import FigureCanvasAgg

from .config import RunConfig, check_keys
from .errors import ConfigError, LabkitError
from .estimates import estimate_run, format_seconds
from .finetune import Finetune
from .finetune.measure import method_config
from .plots import bar, detached_figures, figure_mark, figures_since
from .validate import is_number

_WIDE = {"description_width": "initial"}
NO_ESTIMATE = "No time estimate yet: no run like this one has finished on this machine."
CONTROL_KINDS = ("a list of values (dropdown), a (min, max, step) tuple of numbers (int or float slider) "
                 "or a bool (checkbox)")


def make_control(name: str, spec, default=None):
    """The widget for one control: list -> Dropdown, (min, max, step) -> IntSlider/FloatSlider, bool -> Checkbox.

    Args:
        name: the `RunConfig` field (the widget's description).
        spec: a list of values (so is any other tuple), a ``(min, max, step)`` tuple, or a bool (its initial state).
        default: the initial value when it is allowed (else the first option / the minimum).

    Example:
        >>> make_control("batch_size", (16, 256, 16), default=64).value
        64
    """
    field = f"controls[{name!r}]"
    if isinstance(spec, bool):
        return widgets.Checkbox(value=spec, description=name, style=_WIDE)
    if isinstance(spec, tuple) and len(spec) == 3 and all(is_number(v) for v in spec):
        low, high, step = spec
        if not (low < high and 0 < step <= high - low):
            raise ConfigError(field, spec, "a (min, max, step) tuple with min < max and 0 < step <= max - min",
                              f"For a dropdown of these values pass a list: {list(spec)}")
        value = default if is_number(default) and low <= default <= high else low
        if all(isinstance(v, numbers.Integral) for v in spec):
            return widgets.IntSlider(value=int(value), min=int(low), max=int(high), step=int(step),
                                     description=name, style=_WIDE, continuous_update=False)
        return widgets.FloatSlider(value=float(value), min=float(low), max=float(high), step=float(step),
                                   description=name, style=_WIDE, continuous_update=False)
    if isinstance(spec, (list, tuple)) and len(spec) > 0:
        options = list(spec)
        for i, a in enumerate(options):
            for b in options[i + 1:]:
                if a == b and type(a) is not type(b):
                    # ipywidgets finds a dropdown's selection by equality: it would turn 1 into True.
                    raise ConfigError(field, spec, "options that no two compare equal",
                                      f"{a!r} == {b!r}, so the dropdown cannot tell them apart; drop one")
        value = default if any(default is o or (default == o and type(default) is type(o)) for o in options) \
            else options[0]
        # Explicit (label, value) pairs: a plain list whose values are 2-tuples would be read as pairs.
        return widgets.Dropdown(options=[(str(o), o) for o in options], value=value, description=name,
                                style=_WIDE)
    raise ConfigError(field, spec, CONTROL_KINDS)


class ExperimentPanel:
    """Controls for a few `RunConfig` fields, a Run button, a progress bar, a status line and an output area.

    Args:
        run: ``run(cfg) -> result`` (e.g. ``labkit.fit`` or a function returning a DataFrame).
        controls: `RunConfig` field -> a list of values (Dropdown), a ``(min, max, step)`` tuple or a bool.
        base: the `RunConfig` the controls override (default ``RunConfig()``).
        show: ``show(result)`` draws the result into the output area (default: ``display(result)``).
        title: a heading above the controls.
        options: controls that are not `RunConfig` fields, name -> spec as in ``controls``, passed to ``run``.
        estimate: ``estimate(cfg) -> text or None`` shown above Run (default `estimate_run`); None: no line.

    Example:
        >>> panel = ExperimentPanel(labkit.fit, {"precision": ["fp32", "bf16"], "batch_size": (16, 256, 16)},
        ...                         base=labkit.RunConfig(max_steps=20), show=lambda res: plots.loss_curve(res))
        >>> panel   # last line of the cell: shows the panel
    """

    def __init__(self, run, controls: dict, base: RunConfig | None = None, show=None, title: str | None = None,
                 options: dict | None = None, estimate=estimate_run):
        if not callable(run):
            raise ConfigError("run", run, "a callable run(cfg) -> result, e.g. labkit.fit")
        if not isinstance(controls, dict) or not controls:
            raise ConfigError("controls", controls, "a non-empty dict of RunConfig field -> options")
        check_keys(controls, "controls")
        self.base = RunConfig() if base is None else base
        if not isinstance(self.base, RunConfig):
            raise ConfigError("base", self.base, "a labkit.RunConfig")
        self.run = run
        self.show = show if show is not None else display
        # the attributes a notebook may read: controls (field -> widget), the widgets, and the state of the runs
        self.controls = {name: make_control(name, spec, getattr(self.base, name)) for name, spec in controls.items()}
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise ConfigError("options", options, "None or a dict of run keyword -> options")
        for name in options:
            if name in controls or not _accepts_keyword(run, name):
                raise ConfigError("options key", name, f"a keyword argument of {getattr(run, '__name__', run)} that "
                                  "is not also a RunConfig control")
        # An option starts at the run function's own default for it, when the control offers that value.
        self.options = {name: make_control(name, spec, _keyword_default(run, name)) for name, spec in options.items()}
        self.button = widgets.Button(description="Run", button_style="primary", tooltip="Train with these settings")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="progress", style=_WIDE)
        self.status = widgets.HTML(value="Set the controls and press <b>Run</b>.")
        if estimate is not None and not callable(estimate):
            raise ConfigError("estimate", estimate, "None or a callable estimate(cfg) -> text or None")
        self.estimate = estimate
        self._estimate_takes_cached = estimate is not None and _accepts_keyword(estimate, "cached")
        self.estimate_line = widgets.HTML(value="")
        self.output = widgets.Output()
        self.running = False  # a run is in progress (a click then is refused)
        self.last_result = None  # what the last successful run returned
        self.last_error: BaseException | None = None  # what the last run raised, or None
        self.button.on_click(lambda _button: self.click())
        header = [widgets.HTML(value=f"<h3>{html.escape(title)}</h3>")] if title else []
        self.widget = widgets.VBox(header + [  # the whole panel
            widgets.HBox([*self.controls.values(), *self.options.values()],
                         layout=widgets.Layout(flex_flow="row wrap")),
            self.estimate_line,
            widgets.HBox([self.button, self.progress]),
            self.status,
            self.output,
        ])
        self._passes_on_step = _accepts_keyword(run, "on_step")
        self._passes_progress = _accepts_keyword(run, "progress")
        for control in [*self.controls.values(), *self.options.values()]:
            control.observe(lambda _change: self.update_estimate(), names="value")
        self.update_estimate()

    def update_estimate(self) -> None:
        """Show how long Run will take with the current settings (nothing when it cannot be told)."""
        if self.estimate is None:
            return
        try:
            cfg = self.config()
            # A run with options (e.g. an lr rule) is not the cached run of its config: estimate it, never
            # call it cached.
            text = self.estimate(cfg, cached=False) if self.options and self._estimate_takes_cached \
                else self.estimate(cfg)
        except (LabkitError, OSError, ValueError, KeyError):  # a bad combination: Run will say why
            self.estimate_line.value = ""
            return
        if text is None:
            text = NO_ESTIMATE
        self.estimate_line.value = f"<i>{html.escape(str(text))}</i>"

    def config(self) -> RunConfig:
        """``base`` with the controls' current values applied (validated: may raise `ConfigError`)."""
        return self.base.replace(**{name: w.value for name, w in self.controls.items()})

    def progress_callback(self, step: int, total: int | None = None) -> None:
        """Move the progress bar to ``step`` of ``total``; ``run`` gets it as ``on_step`` when it accepts one."""
        if total:
            self.progress.max = int(total)
        self.progress.value = min(int(step), self.progress.max)
        done = f"step {int(step)}" + (f" of {int(total)}" if total else "")
        self.status.value = f"Running: {done}"

    def click(self) -> None:
        """Do what pressing Run does (used by the button, and by tests)."""
        if self.running:
            self.status.value = ("<span style='color:#a60'>A run is already in progress: "
                                 "wait for it to finish before pressing Run again.</span>")
            return
        self.running = True
        self.button.disabled = True
        self.last_error = None
        self.progress.value = 0
        self.output.clear_output()
        start = time.perf_counter()
        figures_before, mark = _open_figures(), figure_mark()
        try:
            cfg = self.config()
            chosen = {name: w.value for name, w in self.options.items()}
            changed = ", ".join([*(f"{name}={getattr(cfg, name)!r}" for name in self.controls),
                                 *(f"{name}={value!r}" for name, value in chosen.items())])
            self.status.value = f"Running with {html.escape(changed)} ..."
            kwargs = {"on_step": self.progress_callback} if self._passes_on_step else {}
            if self._passes_progress:
                kwargs["progress"] = False  # the panel has its own bar; tqdm's would land in the log console
            kwargs.update(chosen)
            # Everything the run prints (labkit's notes included) goes to the panel's output area: outside
            # it, a widget callback's output lands in JupyterLab's log console, where nobody looks.
            # In a kernel, the output area's __exit__ shows an exception and swallows it: keep it and
            # raise it again after the block, so that the panel reports it (and Ctrl-C still stops).
            failure = None
            with self.output, detached_figures():
                try:
                    result = self.run(cfg, **kwargs)
                    self.show(result)
                    _display_new_figures(figures_before, mark)
                except BaseException as error:  # noqa: BLE001 - re-raised below
                    failure = error
            if failure is not None:
                raise failure
            self.last_result = result
            self.progress.value = self.progress.max
            self.update_estimate()  # this run is cached now
            self.status.value = (f"Done in {time.perf_counter() - start:.1f} s ({html.escape(changed)})."
                                 + _notes_html(result))
        except Exception as error:  # shown in the panel: ipywidgets would swallow it
            self.last_error = error
            self.status.value = (f"<span style='color:#b00'><b>{type(error).__name__}:</b> "
                                 f"{html.escape(str(error))}</span>")
            if not isinstance(error, LabkitError):
                with self.output:
                    traceback.print_exc()
        except KeyboardInterrupt as error:
            self.last_error = error
            self.status.value = "<span style='color:#b00'>Interrupted.</span>"
            raise
        finally:
            self.running = False
            self.button.disabled = False

    def _ipython_display_(self, **kwargs):
        display(self.widget)

    def _repr_mimebundle_(self, **kwargs):
        # ipywidgets 8 displays through _repr_mimebundle_, ipywidgets 7 through _ipython_display_.
        bundle = getattr(self.widget, "_repr_mimebundle_", None)
        if bundle is not None:
            return bundle(**kwargs)
        return {"text/plain": repr(self)}

    def __repr__(self) -> str:
        return f"ExperimentPanel(controls={list(self.controls)}, running={self.running})"


def _notes_html(result) -> str:
    """The run's own warnings (e.g. fp16 emulated on this CPU), shown under every run that had them: the
    notebook prints each note once per session, but a panel run's time needs its explanation each time."""
    notes = getattr(result, "warnings", None) or []
    return "".join(f"<br><span style='color:#8a5a00'>Note: {html.escape(str(message))}</span>"
                   for message in notes)


def _accepts_keyword(func, name: str) -> bool:
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    param = parameters.get(name)
    return param is not None and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)


def _keyword_default(func, name: str):
    """The default of ``func``'s keyword ``name``, or None when it has none."""
    param = inspect.signature(func).parameters[name]
    return None if param.default is inspect.Parameter.empty else param.default


def _open_figures() -> set:
    plt = sys.modules.get("matplotlib.pyplot")
    return set() if plt is None else set(plt.get_fignums())


def _display_new_figures(before: set, mark: int) -> None:
    """Display and close the figures a run made: a widget callback has no end-of-cell flush.

    They are the figures labkit's charts created since ``mark`` (`labkit.plots.figures_since`), then any other
    pyplot figure opened since ``before`` (a ``show`` of the caller's own); figures without axes (nothing
    drawn) are left out. Each is rendered on a fresh Agg canvas at its own layout and shown as a PNG.

    Why not pyplot's registry alone: in JupyterLab a panel's chart came out now and then as a blank image of
    matplotlib's default size (notebooks 02 and 05, later 02 and 06, under CI's parallel browser runs; never
    reproduced alone). That is what ``plt.figure(number)`` makes when the number is no longer registered, so
    the run's figure had apparently left pyplot's registry before it was displayed; who removed it is not
    known. Displaying the figure through IPython's formatter had also come out blank earlier. The figure
    objects themselves are whole, so they are kept from their creation here; and while a panel runs they are
    made outside pyplot altogether (`labkit.plots.detached_figures`), out of the inline backend's reach: it
    shows and closes every registered figure when a cell finishes, and the half-drawn chart seen once fits a
    figure printed by two parties at the same time.
    """
    plt = sys.modules.get("matplotlib.pyplot")
    figures = figures_since(mark)
    if plt is not None:
        for manager in Gcf.get_all_fig_managers():
            if manager.num not in before and manager.canvas.figure not in figures:
                figures.append(manager.canvas.figure)
    for figure in figures:
        if figure.axes:
            display(Image(data=_render_png(figure), format="png"))
        if plt is not None:
            plt.close(figure)  # a no-op for a figure made outside pyplot


def _render_png(figure, attempts: int = 2) -> bytes:
    """``figure`` drawn on a fresh Agg canvas, as PNG bytes. A figure with axes that comes out without a single
    dark pixel (seen once in a while in JupyterLab, cause unknown) is drawn again; if it stays blank, the
    error says what the figure held, so that the panel shows it instead of an empty chart."""
    import numpy as np

    for _ in range(attempts):
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        inked = bool((np.asarray(canvas.buffer_rgba())[..., :3] < 200).any())
        if inked or not figure.axes:
            buffer = io.BytesIO()
            canvas.print_png(buffer)
            return buffer.getvalue()
    raise RuntimeError(f"a chart came out blank: {len(figure.axes)} axes, size {figure.get_size_inches()} in, "
                       f"dpi {figure.dpi}, {sum(len(ax.patches) + len(ax.lines) for ax in figure.axes)} bars and lines")


class FinetuneForm:
    """Your fine-tune as a form (`labkit.Finetune`): model, data and target GPU as text; ``seq_len``, batch and method
    replan at once (no weights built), and **Run** measures a few steps of the chosen methods here.

    Args:
        model, data, gpu, seq_len, batch_size: `labkit.Finetune`'s, as the form starts.
        max_seq_len: the ``seq_len`` slider's end.

    Example:
        >>> form = FinetuneForm("Qwen/Qwen2.5-0.5B", "chats.jsonl", gpu="t4")
        >>> form   # last line of the cell: shows the form and the plan
    """

    METHODS = {"all three": ("full", "lora", "qlora"), "full": ("full",), "LoRA": ("lora",), "QLoRA": ("qlora",)}

    def __init__(self, model: str, data: str, gpu: str = "t4", seq_len: int = 512, batch_size: int = 8,
                 max_seq_len: int = 2048):
        self.fields = {name: widgets.Text(value=str(value), description=name, style=_WIDE, continuous_update=False)
                       for name, value in (("model", model), ("data", data), ("gpu", gpu))}
        self.controls = {"seq_len": make_control("seq_len", (16, max_seq_len, 16), seq_len),
                         "batch_size": make_control("batch_size", (1, 64, 1), batch_size),
                         "method": make_control("method", list(self.METHODS), "all three")}
        self.button = widgets.Button(description="Run (measure)", button_style="primary",
                                     tooltip="Measure: a few steps of the chosen methods here, longest batch first")
        self.estimate_line, self.status, self.output = widgets.HTML(value=""), widgets.HTML(value=""), widgets.Output()
        self.last_result, self.last_error, self._sessions = None, None, {}
        for control in [*self.fields.values(), *self.controls.values()]:
            control.observe(lambda _change: self.replan(), names="value")
        self.button.on_click(lambda _button: self.measure())
        self.widget = widgets.VBox([
            widgets.HBox(list(self.fields.values()), layout=widgets.Layout(flex_flow="row wrap")),
            widgets.HBox(list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap")),
            self.estimate_line, self.button, self.status, self.output])
        self.replan()

    def session(self, **settings) -> Finetune:
        """The `labkit.Finetune` of the form's fields (kept per settings: the data is tokenized once)."""
        key = (*(w.value.strip() for w in self.fields.values()), *sorted(settings.items()))
        if key not in self._sessions:
            model, data, gpu = key[:3]
            self._sessions[key] = Finetune(model, data=data, gpu=gpu, **settings)
            if settings:  # the same tokenizer and tokens as the form's plan: tokenized once
                first = self.session()
                self._sessions[key].__dict__.update(tokenizer=first.tokenizer, encoded=first.encoded)
        return self._sessions[key]

    def _values(self) -> tuple[dict, str]:
        values = {name: w.value for name, w in self.controls.items()}
        return values, ", ".join(f"{name}={value!r}" for name, value in values.items())

    def _do(self, done: str, call) -> None:
        self.last_error = None
        self.output.clear_output()
        start, figures_before, mark = time.perf_counter(), _open_figures(), figure_mark()
        try:
            failure = None
            with self.output, detached_figures():
                try:
                    self.last_result = call()
                    display(self.last_result)
                    _display_new_figures(figures_before, mark)
                except Exception as error:  # noqa: BLE001 - re-raised below, outside the output area
                    failure = error
            if failure is not None:
                raise failure
            self.status.value = done.format(s=f"{time.perf_counter() - start:.1f}")
        except Exception as error:  # shown in the form: ipywidgets would swallow it
            self.last_error = error
            self.status.value = (f"<span style='color:#b00'><b>{type(error).__name__}:</b> "
                                 f"{html.escape(str(error))}</span>")

    def replan(self) -> None:
        """Plan with the current values (what moving a slider does), and say how long Run would take."""
        values, said = self._values()
        self._do(f"Planned ({html.escape(said)}); Run measures.", lambda: self.session().plan(
            values["seq_len"], values["batch_size"], self.METHODS[values["method"]]))
        try:
            base = self.session(seq_len=values["seq_len"], batch_size=values["batch_size"]).run_config()
            guesses = [estimate_run(method_config(base, m)) for m in self.METHODS[values["method"]]]
        except (LabkitError, OSError, ValueError, KeyError):
            guesses = [None]
        text = NO_ESTIMATE if None in guesses else str(guesses[0]) if all(g.cached for g in guesses) else \
            f"Estimated time: about {format_seconds(sum(g.seconds for g in guesses))} (from runs on this machine)."
        self.estimate_line.value = f"<i>{html.escape(text)}</i>"

    def measure(self) -> None:
        """Measure with the current values (what pressing Run does), with a chart of predicted against measured."""
        values, said = self._values()
        self.status.value = f"Running with {html.escape(said)} ..."
        self._do(f"Done in {{s}} s ({html.escape(said)}).", lambda: self._measured(values))

    def _measured(self, values: dict):
        result = self.session(seq_len=values["seq_len"], batch_size=values["batch_size"]).measure(
            methods=self.METHODS[values["method"]])
        ran = result.frame.dropna(subset=["peak_memory_bytes"])
        if len(ran):
            bar(pd.concat([ran.assign(peak="predicted", peak_memory_bytes=ran.predicted_bytes),
                           ran.assign(peak="measured")]), "method", "peak_memory_bytes", hue="peak")
        return result

    def _ipython_display_(self, **kwargs):
        display(self.widget)

    def _repr_mimebundle_(self, **kwargs):
        bundle = getattr(self.widget, "_repr_mimebundle_", None)
        return bundle(**kwargs) if bundle is not None else {"text/plain": repr(self)}

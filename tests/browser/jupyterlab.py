"""Drive JupyterLab in headless Chromium as a learner would: open a notebook, run every cell, use its panel.

`LabServer` starts JupyterLab on a free loopback port over a scratch copy of the notebooks (so
JupyterLab's autosave never writes outputs into the committed files). `NotebookPage` wraps a
Playwright page on one notebook. Only Debian's ``chromium`` is used (`find_chromium`): Playwright's
own browser download is never needed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

# Without the background-networking flags Chromium keeps trying to reach Google's hosts from a closed network.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
HOW_TO_GET_CHROMIUM = ("install Debian's Chromium (`sudo apt-get install -y chromium`) or set "
                       "LABKIT_CHROMIUM to a Chromium/Chrome executable")
# JupyterLab settings for a test: every cell rendered (no windowing, so every output is in the page) and
# no news or update checks (the network is closed).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}
# The outputs a learner reads as trouble: stderr streams (the pink warning box) and tracebacks.
TROUBLE_OUTPUTS = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"


def find_chromium() -> str | None:
    """The Chromium executable to drive: $LABKIT_CHROMIUM, else the first Debian/Ubuntu path that exists."""
    chosen = os.environ.get("LABKIT_CHROMIUM")
    if chosen:
        return chosen if Path(chosen).is_file() else None
    return next((path for path in CHROMIUM_CANDIDATES if Path(path).is_file()), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabServer:
    """JupyterLab serving a scratch copy of ``notebooks`` on 127.0.0.1 with a random token."""

    def __init__(self, notebooks: list[Path], env: dict | None = None, python: str = sys.executable,
                 replace_env: bool = False):
        """``env`` is added to this process's environment, or replaces it with ``replace_env=True``."""
        self.root = Path(tempfile.mkdtemp(prefix="labkit-browser-"))
        self.notebook_dir = self.root / "notebooks"
        self.notebook_dir.mkdir()
        for path in notebooks:
            shutil.copy(path, self.notebook_dir / path.name)
        settings = self.root / "settings"
        for name, values in LAB_SETTINGS.items():
            target = settings / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(values))
        self.port = free_port()
        self.token = os.urandom(12).hex()
        self.log_path = self.root / "jupyterlab.log"
        command = [python, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                   f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.notebook_dir}",
                   f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={self.root / 'workspaces'}",
                   "--allow-root"]
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=dict(env or {}) if replace_env else {**os.environ, **(env or {})})
        self._wait_until_up()

    def _wait_until_up(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.process.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/api/status?token={self.token}", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {timeout_s:.0f} s:\n{self.log()}")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        return f"{self.base_url}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}?reset&token={self.token}"

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-4000:]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class PanelRun:
    """What one press of a panel's Run button showed."""

    slider: str | None = None
    slider_value: str | None = None
    dropdown: str | None = None
    dropdown_value: str | None = None
    status: str = ""
    seconds: float = 0.0
    images: int = 0
    ink: list[float] = field(default_factory=list)  # per image: the share of pixels that are not near-white
    notes: list[str] = field(default_factory=list)
    estimate: str | None = None
    tables: list[list[list[str]]] = field(default_factory=list)  # each table the run showed: rows of cell texts


# Reads every code cell's prompt and outputs in one round trip.
_CELLS_JS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell.jp-CodeCell')).map((cell, i) => ({
    index: i,
    prompt: (cell.querySelector('.jp-InputArea-prompt') || {}).textContent || '',
    hidden: !!cell.querySelector('.jp-InputPlaceholder'),  // a collapsed check cell: no prompt is drawn
    source: (cell.querySelector('.jp-InputArea-editor') || {}).textContent || '',
    trouble: Array.from(cell.querySelectorAll(arguments_selector)).map(o => o.textContent),
    stdout: Array.from(cell.querySelectorAll(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stdout']")).map(o => o.textContent),
    tables: Array.from(cell.querySelectorAll('.jp-OutputArea-output table')).map(TABLE_ROWS),
}))""".replace("arguments_selector", json.dumps(TROUBLE_OUTPUTS))
# A rendered table as rows of cell texts: its header row (th) first, then each body row's data cells (td; a
# pandas index column is th and not counted).
_TABLE_ROWS_JS = """t => [Array.from(t.querySelectorAll('thead tr:last-child th')).map(c => c.textContent.trim()),
    ...Array.from(t.querySelectorAll('tbody tr')).map(r => Array.from(r.querySelectorAll('td')).map(
        c => c.textContent.trim()))]"""
_CELLS_JS = _CELLS_JS.replace("TABLE_ROWS", _TABLE_ROWS_JS)
MAX_TABLE_COLUMNS = 7
SHOT_HEIGHT_PX = 2700  # the window's height while the notebook's picture is taken (a learner's is 900)
SIGNIFICANT_DIGITS = 3
_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][-+]?\d+)?$")


def significant_digits(text: str) -> int | None:
    """The significant digits a table cell shows (None: not a number): "0.0123" 3, "1,230" 3, "2.80e+10" 3,
    "28000000000" 2 (an integer's trailing zeros are not counted: they may be rounding), "40.54" 4."""
    text = text.strip()
    if not text or not _NUMBER.match(text) or not any(ch.isdigit() for ch in text):
        return None
    mantissa = re.split(r"[eE]", text)[0].lstrip("+-").replace(",", "")
    digits = mantissa.replace(".", "").lstrip("0")
    if "." not in mantissa:
        digits = digits.rstrip("0")
    return max(1, len(digits))


def table_problems(rows: list[list[str]]) -> list[str]:
    """What a learner should not see in a table: more than 7 columns, raw bytes or counts (an integer of 6 or more
    digits), or a number with more than 3 significant digits (integers below 100,000, such as steps, are exact)."""
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    width = max([len(header) - (1 if header and not header[0] else 0), *(len(r) for r in body)], default=0)
    problems = [f"{width} columns (at most {MAX_TABLE_COLUMNS})"] if width > MAX_TABLE_COLUMNS else []
    for row in body:
        for text in row:
            plain = text.replace(",", "")
            if plain.isdigit() and len(plain) >= 6:
                problems.append(f"raw number {text!r} (bytes or a count without a unit)")
            elif not plain.lstrip("+-").isdigit() and (significant_digits(text) or 0) > SIGNIFICANT_DIGITS:
                problems.append(f"{text!r} has more than {SIGNIFICANT_DIGITS} significant digits")
    return problems


class NotebookPage:
    """One notebook open in JupyterLab in a Playwright page."""

    def __init__(self, page, server: LabServer, notebook: str):
        self.page = page
        self.notebook = notebook
        self.console: list[str] = []
        page.on("console", self._on_console)
        page.goto(server.url(notebook))
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        self.wait_for_kernel("Idle", timeout_s=120)

    def _on_console(self, message) -> None:
        if message.type == "error" and "ERR_NAME_NOT_RESOLVED" not in message.text:
            self.console.append(message.text)  # offline badge images fail to load: expected

    def kernel_status(self) -> str:
        text = self.page.locator(".jp-StatusBar-TextItem", has_text="|").first.text_content() or ""
        return text.split("|")[-1].strip()

    def wait_for_kernel(self, state: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.kernel_status() != state:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.notebook}: kernel is {self.kernel_status()!r}, not {state!r}, "
                                   f"after {timeout_s:.0f} s")
            time.sleep(0.25)

    def run_all(self, timeout_s: float) -> list[dict]:
        """Run > Run All Cells, wait until every cell ran or one failed; return each code cell's state."""
        self.page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        deadline = time.monotonic() + timeout_s
        time.sleep(1)
        while True:
            cells = self.cells()
            busy = any("*" in cell["prompt"] for cell in cells)
            if not busy and self.kernel_status() == "Idle":
                time.sleep(1)  # outputs of the last cell may still be arriving
                cells = self.cells()
                if not any("*" in cell["prompt"] for cell in cells) and self.kernel_status() == "Idle":
                    return cells
            if time.monotonic() > deadline:
                running = [c["index"] for c in cells if "*" in c["prompt"]]
                raise TimeoutError(f"{self.notebook}: still running cell(s) {running} after {timeout_s:.0f} s")
            time.sleep(0.5)

    def cells(self) -> list[dict]:
        return self.page.evaluate(_CELLS_JS)


    def panels(self):
        """The ExperimentPanels on the page (a widget box holding a Run button)."""
        return self.page.locator(".widget-vbox").filter(
            has=self.page.locator("button.widget-button", has_text="Run")).filter(
            has=self.page.locator(".widget-output"))

    def drive_panel(self, panel, timeout_s: float, dropdown: str | None = None, dropdown_option: int = 1,
                    shot: Path | None = None) -> PanelRun:
        """Move the panel's first slider one step right, pick option ``dropdown_option`` in its dropdown
        labelled ``dropdown`` (default: the first), press Run and wait for the panel's own status to say it
        is done (or failed); ``shot``: where to save a picture of the panel after the run."""
        run = PanelRun()
        panel.scroll_into_view_if_needed()
        sliders = panel.locator(".widget-slider")
        if sliders.count():
            slider = sliders.first
            run.slider = slider.locator(".widget-label").first.text_content()
            before = slider.locator(".widget-readout").first.text_content()
            slider.locator(".noUi-handle").first.focus()
            self.page.keyboard.press("ArrowRight")
            self.page.wait_for_function(
                "([el, before]) => el.textContent !== before",
                arg=[slider.locator(".widget-readout").first.element_handle(), before], timeout=10_000)
            run.slider_value = slider.locator(".widget-readout").first.text_content().strip()
        dropdowns = panel.locator(".widget-dropdown")
        if dropdown is not None:
            dropdowns = dropdowns.filter(has=self.page.locator(".widget-label", has_text=dropdown))
        if dropdowns.count():
            chosen = dropdowns.first
            run.dropdown = chosen.locator(".widget-label").first.text_content()
            select = chosen.locator("select")
            option = select.locator("option").nth(dropdown_option)
            run.dropdown_value = option.text_content()
            select.select_option(label=run.dropdown_value)
        # The kernel redraws the panel's estimate for the new settings: let the panel's texts settle.
        texts = panel.locator(".widget-html")
        self._wait_until_stable(lambda: "|".join(texts.all_inner_texts()), settle_s=1.5, timeout_s=10)
        estimates = r"\s*(Estimated time|Cached|No time estimate)"
        run.estimate = next((t for t in texts.all_inner_texts() if re.match(estimates, t)), None)
        status = panel.locator(".widget-html").last
        before = status.inner_text()
        start = time.monotonic()
        panel.locator("button.widget-button", has_text="Run").first.click()
        self.page.wait_for_function(
            "([el, before]) => el.innerText !== before && !el.innerText.startsWith('Running')",
            arg=[status.element_handle(), before], timeout=timeout_s * 1000, polling=250)
        run.seconds = time.monotonic() - start
        run.status = status.inner_text()
        output = panel.locator(".widget-output")
        run.images = output.locator("img").count()
        run.ink = [image_ink(src) for src in output.locator("img").evaluate_all("imgs => imgs.map(i => i.src)")]
        run.notes = [text for text in output.locator(".jp-OutputArea-output").all_inner_texts()
                     if "labkit note" in text]
        run.tables = output.locator("table").evaluate_all(f"ts => ts.map({_TABLE_ROWS_JS})")
        if shot is not None:
            shot.parent.mkdir(parents=True, exist_ok=True)
            panel.screenshot(path=str(shot))
        return run

    @staticmethod
    def _wait_until_stable(read, settle_s: float, timeout_s: float) -> str:
        """Poll ``read()`` until it has not changed for ``settle_s`` (or ``timeout_s`` passed); return it."""
        deadline = time.monotonic() + timeout_s
        value, since = read(), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < settle_s:
            time.sleep(0.2)
            current = read()
            if current != value:
                value, since = current, time.monotonic()
        return value

    def log_console_messages(self) -> list[str]:
        """What landed in JupyterLab's log console (output a widget callback printed outside any output
        area, so the learner never sees it in the notebook): opened from its status-bar counter and read."""
        item = self.page.locator(".jp-LogConsoleStatusItem")
        if not item.count() or not any(ch.isdigit() and ch != "0" for ch in item.first.text_content() or ""):
            return []
        item.first.click()
        panel = self.page.locator(".jp-LogConsolePanel")
        panel.wait_for(timeout=10_000)
        time.sleep(0.5)
        return [text.strip() for text in panel.locator(".jp-OutputArea-output").all_inner_texts() if text.strip()]

    def screenshot(self, path: Path) -> None:
        """The whole notebook, as slices of what the window shows while scrolling down, stitched together:
        cells are painted only near the window, so one picture of a very tall page comes out part blank."""
        scroller = ("(document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')"
                    " || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook'))")
        # A window SHOT_HEIGHT_PX tall for the pictures: a third of the slices (each costs a round trip, two
        # frames and a pause) of the 900 px a learner's window shows; restored afterwards.
        viewport = self.page.viewport_size
        self.page.set_viewport_size({"width": viewport["width"], "height": SHOT_HEIGHT_PX})
        try:
            self._wait_until_stable(lambda: self.page.evaluate(
                f"() => {{ const n = {scroller}; return [n.clientHeight, n.scrollHeight].join(); }}"),
                settle_s=0.5, timeout_s=10)
            self._stitch(scroller, path)
        finally:
            self.page.set_viewport_size(viewport)

    def _stitch(self, scroller: str, path: Path) -> None:
        import io

        from PIL import Image

        # The picture ends just under the last cell: the scroll-past-end space below it grows with the window.
        x, y, width, height, total = self.page.evaluate(
            f"() => {{ const n = {scroller}; const r = n.getBoundingClientRect(); "
            f"const cells = n.querySelectorAll('.jp-Cell'); const last = cells[cells.length - 1]; "
            f"const end = last ? last.getBoundingClientRect().bottom - r.top + n.scrollTop + 40 : n.scrollHeight; "
            f"return [r.x, r.y, r.width, r.height, Math.min(n.scrollHeight, Math.ceil(end))]; }}")
        canvas = Image.new("RGB", (int(width), int(total)), "white")
        top = 0
        while True:
            shown = self.page.evaluate(f"() => {{ const n = {scroller}; n.scrollTop = {top}; return n.scrollTop; }}")
            # Let the newly visible cells paint: two animation frames (layout, then paint), then a short margin.
            self.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            time.sleep(0.1)
            png = self.page.screenshot(clip={"x": x, "y": y, "width": width, "height": height})
            canvas.paste(Image.open(io.BytesIO(png)), (0, int(shown)))  # past ``total``: cut off
            if shown + height >= total:
                break
            top = shown + height
        path.parent.mkdir(parents=True, exist_ok=True)
        canvas.save(path)


def longest_blank_stretch_px(path: Path) -> int:
    """The tallest run of blank (near-white) rows across the notebook's column of a screenshot: a picture
    with part of the notebook unpainted has one far taller than the scroll-past-end space at the bottom."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("L"))
    width = pixels.shape[1]
    blank = (pixels[:, width // 4: width * 9 // 10] > 250).all(axis=1)
    longest = current = 0
    for row_is_blank in blank:
        current = current + 1 if row_is_blank else 0
        longest = max(longest, current)
    return longest


def cells_not_run(cells: list[dict]) -> list[int]:
    """The code cells that did not run. A collapsed cell (input hidden, as check cells are) draws no prompt,
    so it counts as run when a visible cell after it ran: Run All runs the cells in order and stops at
    the first failure (whose error box the test reports)."""
    ran = [cell["prompt"].strip("[]: ").isdigit() for cell in cells]
    later_visible_ran = False
    for index in reversed(range(len(cells))):
        if cells[index]["hidden"]:
            ran[index] = later_visible_ran
        else:
            later_visible_ran = later_visible_ran or ran[index]
    return [cell["index"] for cell, done in zip(cells, ran, strict=True) if not done]


def image_ink(src: str) -> float:
    """The share of an image's pixels that are not near-white, from its ``data:`` URL: a chart drawn blank has
    almost none (a few tick labels), a real one several percent."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    if not src.startswith("data:image/png;base64,"):
        return 1.0  # not an inline PNG: nothing to judge
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("L"))
    return float((pixels < 200).mean())

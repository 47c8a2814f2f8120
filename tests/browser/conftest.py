"""Fixtures for the browser test: one JupyterLab server and one Chromium per pytest worker."""

import os
import warnings
from pathlib import Path

import pytest

from .jupyterlab import CHROMIUM_FLAGS, HOW_TO_GET_CHROMIUM, LabServer, find_chromium

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = Path(os.environ.get("LABKIT_ARTIFACTS", ROOT / "build" / "browser"))
# CI sets this: there a missing browser is a failure, not a skip.
REQUIRED = os.environ.get("LABKIT_REQUIRE_BROWSER") == "1"


@pytest.fixture(scope="session")
def chromium_path():
    path = find_chromium()
    if path is None:
        message = f"the browser test needs Chromium: {HOW_TO_GET_CHROMIUM}"
        if REQUIRED:
            pytest.fail(f"{message} (LABKIT_REQUIRE_BROWSER=1)")
        warnings.warn(f"SKIPPING THE BROWSER TEST: {message}", stacklevel=1)
        pytest.skip(f"SKIPPED LOUDLY: {message}")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path):
    try:
        from playwright import sync_api
    except ImportError:
        message = "the browser test needs Playwright's Python client: pip install -e '.[dev]'"
        if REQUIRED:
            pytest.fail(f"{message} (LABKIT_REQUIRE_BROWSER=1)")
        pytest.skip(f"SKIPPED LOUDLY: {message}")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def lab_server(chromium_path):
    # What a learner's kernel sees: matplotlib's inline backend and tqdm's bars (no MPLBACKEND=Agg, no
    # TQDM_DISABLE), with the profile, offline mode and the result cache of this test run.
    env = {key: value for key, value in os.environ.items() if key not in ("MPLBACKEND", "TQDM_DISABLE")}
    if os.environ.get("LABKIT_RUN_DATA_DIR"):  # the test run's cache, which nbval filled (scripts/test.sh)
        env["LABKIT_DATA_DIR"] = os.environ["LABKIT_RUN_DATA_DIR"]
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        env["OMP_NUM_THREADS"] = "1"  # one core per notebook when two run side by side
    server = LabServer(NOTEBOOKS, env=env, replace_env=True)
    yield server
    server.stop()

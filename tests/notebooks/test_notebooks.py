"""Checks on the committed notebooks themselves (nbval executes them separately)."""

import json
import re
import sys
from pathlib import Path

import pytest

from labkit import exercises, project

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
sys.path.insert(0, str(ROOT / "scripts"))
import sync_notebooks  # noqa: E402


def cells(path, kind=None):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if kind is None or c["cell_type"] == kind]


def source(cell) -> str:
    return "".join(cell["source"])


def test_there_are_notebooks_in_order():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_start_here.ipynb"
    for path in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    dirty = [i for i, c in enumerate(cells(path)) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs; run `make strip`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badges_and_install_line_follow_the_one_repo_url(path):
    assert sync_notebooks.sync(path, check=True) == [], "run `python scripts/sync_notebooks.py`"
    first = source(cells(path)[0])
    assert first.startswith("# ") and project.badges(path.name) in first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_installs_only_on_colab_or_kaggle_and_never_torch(path):
    install_cell, setup_cell = (source(c) for c in cells(path, "code")[:2])
    setup = install_cell + "\n" + setup_cell
    install = [line for line in setup.splitlines() if line.lstrip().startswith("%pip install")]
    assert len(install) == 1 and install[0].startswith("    "), "the install must sit inside the platform check"
    assert "google.colab" in setup and "KAGGLE_KERNEL_RUN_TYPE" in setup
    assert "torch" not in install[0].replace(project.DISTRIBUTION, "")
    assert "labkit.env_report()" in setup_cell and "labkit.profile()" in setup_cell


class FakeShell:
    """What the install cell calls as ``get_ipython()``: records the %pip line and installs nothing, as a
    %pip on Kaggle with Internet off does (it prints an error and the cell goes on)."""

    def __init__(self):
        self.magics = []

    def run_line_magic(self, name, line, *args, **kwargs):
        self.magics.append(f"%{name} {line}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_failed_install_stops_with_what_to_do(path, monkeypatch):
    from IPython.core.inputtransformer2 import TransformerManager

    code = TransformerManager().transform_cell(source(cells(path, "code")[0]))
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setitem(sys.modules, "labkit", None)  # `import labkit` raises ModuleNotFoundError
    shell = FakeShell()
    with pytest.raises(SystemExit, match=r"labkit is not installed\. On Kaggle: Settings > Internet on") as stop:
        exec(compile(code, path.name, "exec"), {"get_ipython": lambda: shell})
    assert stop.value.__cause__ is None and stop.value.__suppress_context__  # no ModuleNotFoundError traceback
    assert shell.magics == [f"%pip install -q \"{project.install_spec(path.name)}\""]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_profile_is_read_once_and_never_branched_on(path):
    code = [source(c) for c in cells(path, "code")]
    assert sum("labkit.profile()" in c for c in code) == 1
    assert not any(re.search(r"P\.name\s*==|LABKIT_PROFILE", c) for c in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_ends_with_a_checked_exercise(path):
    code = [source(c) for c in cells(path, "code")]
    checks = [c for c in code if "exercises.check(" in c]
    assert checks and all("answer = None  # YOUR CODE" in c for c in checks)
    for name in re.findall(r'exercises\.check\("([^"]+)"', "\n".join(checks)):
        assert name in exercises.names()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cells_stay_thin(path):
    long = [i for i, c in enumerate(cells(path, "code")) if len(source(c).splitlines()) > 15]
    assert not long, f"{path.name}: code cells {long} exceed 15 lines; move the code into labkit"


def test_repository_url_is_written_in_one_place():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'Homepage = "{project.REPO_URL}"' in pyproject and f'name = "{project.DISTRIBUTION}"' in pyproject


def test_notebook_extras_exist_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for notebook, names in project.NOTEBOOK_EXTRAS.items():
        assert (ROOT / "notebooks" / notebook).exists(), notebook
        assert set(names) <= set(extras), names
        assert project.install_spec(notebook).startswith(f"{project.DISTRIBUTION}[{','.join(names)}] @ git+")
    assert project.install_spec("00_start_here.ipynb") == project.install_spec()

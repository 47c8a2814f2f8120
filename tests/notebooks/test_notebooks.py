"""Checks on the committed notebooks themselves (nbval executes them separately)."""

import json
import re
import sys
from pathlib import Path

import pytest

from labkit import exercises, project
from labkit.labs import catalog

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402

SOURCES = build_notebooks.sources()


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


def test_every_notebook_has_one_source():
    assert [p.stem for p in NOTEBOOKS] == [s.stem for s in SOURCES]


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_is_its_build(src):
    assert build_notebooks.difference(src) is None, build_notebooks.difference(src)


def test_a_stale_notebook_is_named_with_its_first_differing_cell(tmp_path, monkeypatch):
    src = SOURCES[0]
    committed = json.loads(build_notebooks.built_path(src).read_text())
    committed["cells"][5]["source"] = ["an edit made in JupyterLab instead of the source"]
    stale = tmp_path / build_notebooks.built_path(src).name
    stale.write_text(json.dumps(committed))
    monkeypatch.setattr(build_notebooks, "built_path", lambda s: stale)
    assert build_notebooks.difference(src).startswith(f"{stale.name}: cell 5 differs from its build (source)")


def test_a_source_without_the_closing_sections_is_refused(tmp_path):
    broken = tmp_path / SOURCES[0].name
    broken.write_text(SOURCES[0].read_text().replace("## Going further", "## More"))
    with pytest.raises(build_notebooks.BuildError, match=r"closing sections must be .*Going further"):
        build_notebooks.build(broken)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badges_and_install_line_follow_the_one_repo_url(path):
    first = source(cells(path)[0])
    assert first.startswith(f"# {path.name[:2]} · ") and project.badges(path.name) in first
    assert f'%pip install -q "{project.install_spec(path.name)}"' in source(cells(path, "code")[0])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_installs_only_on_colab_or_kaggle_and_never_torch(path):
    install_cell, setup_cell = (source(c) for c in cells(path, "code")[:2])
    setup = install_cell + "\n" + setup_cell
    install = [line for line in setup.splitlines() if line.lstrip().startswith("%pip install")]
    assert len(install) == 1 + (path.name in project.NEEDS_TORCHAO)  # labkit, and torchao matched to the torch
    assert all(line.startswith("    ") for line in install), "the install must sit inside the platform check"
    assert "google.colab" in setup and "KAGGLE_KERNEL_RUN_TYPE" in setup
    assert not any("torch" in line.replace(project.DISTRIBUTION, "") for line in install)
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


@pytest.mark.parametrize("torch_version, torchao", [("2.9.1+cu128", "0.15.0"), ("2.14.1", "0.18.0")])
def test_the_quantization_setup_installs_the_torchao_built_for_the_torch_it_finds(torch_version, torchao,
                                                                                 monkeypatch):
    """torchao 0.18 cannot import on Colab's torch 2.9 (and PEFT imports it when present): pip cannot choose."""
    from IPython.core.inputtransformer2 import TransformerManager

    path = ROOT / "notebooks" / project.NEEDS_TORCHAO[0]
    code = TransformerManager().transform_cell(source(cells(path, "code")[0]))
    monkeypatch.setitem(sys.modules, "google.colab", object())
    monkeypatch.setattr(project, "installed_torch", lambda: torch_version)
    shell, namespace = FakeShell(), {}
    namespace["get_ipython"] = lambda: shell
    exec(compile(code, path.name, "exec"), namespace)
    assert [m.format(**namespace) for m in shell.magics] == [
        f"%pip install -q \"{project.install_spec(path.name)}\"", f"%pip install -q \"torchao=={torchao}\""]


def test_torchao_requirement_follows_torchaos_table():
    assert project.torchao_requirement("2.5.1") == "torchao==0.12.0"  # labkit's floor
    assert project.torchao_requirement("2.8.0+cu126") == "torchao==0.13.0"
    assert project.torchao_requirement("2.9.0") == "torchao==0.14.1"
    assert project.torchao_requirement("2.10.0a0+git1234") == "torchao==0.16.0"
    with pytest.raises(ValueError, match=r"torch_version='2.4.1' is not allowed: torch 2.5 or newer"):
        project.torchao_requirement("2.4.1")


def test_no_extra_pulls_torchao():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not [(name, r) for name, reqs in extras.items() if name != "dev" for r in reqs if r.startswith("torchao")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_profile_is_read_once_and_never_branched_on(path):
    code = [source(c) for c in cells(path, "code")]
    assert sum("labkit.profile()" in c for c in code) == 1
    assert not any(re.search(r"P\.name\s*==|LABKIT_PROFILE", c) for c in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercises_include_code_and_the_learners_own_numbers(path):
    code = [source(c) for c in cells(path, "code")]
    checks = [c for c in code if "exercises.check(" in c]
    assert checks
    names = re.findall(r'exercises\.check\("([^"]+)"', "\n".join(checks))
    own_lab = catalog.NOTEBOOKS[path.stem].EXERCISES  # the notebook's exercises sit with its lab
    assert sorted(names) == sorted(own_lab.names()), (names, own_lab.names())  # every one, none from elsewhere
    kinds = {name: own_lab.get(name) for name in names}
    coded = [n for n, e in kinds.items() if isinstance(e, exercises.CodeExercise)]
    own = [n for n, e in kinds.items() if getattr(e, "from_run", ())]
    assert coded and own, f"{path.name}: needs a code exercise and one on the learner's own numbers"
    for cell in checks:  # an untouched cell reports "not attempted yet"
        assert "answer = None  # YOUR CODE" in cell or "raise NotImplementedError  # YOUR CODE" in cell, cell
    for name in own:  # the notebook passes the learner's numbers to question and check
        assert any(f'exercises.question("{name}", mine)' in c for c in code)
        assert any(f'exercises.check("{name}", answer, mine)' in c for c in checks)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_header_says_what_you_need_how_long_and_what_is_inside(path):
    header = source(cells(path)[0])
    assert "**You will learn**" in header and "**What you need:**" in header and "**Contents:**" in header
    time = re.sub(r"\s+", " ", header.split("**Time:**")[1])
    assert re.match(r" about \d+ minutes? of compute at `quick` on a 2-core CPU \(measured: .+?\), about .+? at "
                    r"`full` on a T4 .+?; about \d+ minutes of reading\.", time), time
    for part in ("Pitfalls", "Going further", "Summary", "Further reading", "Exercises"):
        assert part in header, part


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_closing_sections_in_order_with_linked_reading(path):
    headings = [source(c).splitlines()[0] for c in cells(path, "markdown")]
    order = ["## Pitfalls", "## Going further", "## Summary", "## Further reading", "## Exercises"]
    found = [h for h in headings if h in order]
    assert found == order, found
    reading = next(source(c) for c in cells(path, "markdown") if source(c).startswith("## Further reading"))
    assert len(re.findall(r"https://\S+", reading)) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_guess_is_printed_beside_its_measurement(path):
    code = [source(c) for c in cells(path, "code")]
    guesses = re.findall(r"^(guess_\w+) = None  # YOUR GUESS", "\n".join(code), flags=re.M)
    assert guesses, f"{path.name}: no predict-first cell"
    for name in guesses:
        assert any(f"guesses.versus({name}," in c for c in code), name


def _is_check(code: str) -> bool:
    return bool(re.search(r"^\s*assert ", code, flags=re.M))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_check_cells_are_collapsed_tagged_and_teach_nothing(path):
    for cell in cells(path, "code"):
        code, meta = source(cell), cell["metadata"]
        tagged = "check" in meta.get("tags", [])
        assert _is_check(code) == tagged, code
        if tagged:
            assert meta.get("jupyter", {}).get("source_hidden") is True, code
            # collapsed, a cell shows its first line: it says what is checked
            assert code.startswith("# "), f"a check cell starts with a comment saying what it checks: {code}"
            assert "print(" not in code and "plots." not in code, f"a check cell shows nothing: {code}"


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

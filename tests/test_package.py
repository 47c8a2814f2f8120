import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import labkit
from labkit import capacity
from labkit.techniques.oom_backoff import Probe

SRC = Path(labkit.__file__).parent


def test_import_labkit_pulls_in_no_notebook_only_package():
    """`labkit bench` must run on a bare GPU machine without ipywidgets or Jupyter, and the labs with it."""
    code = ("import sys, labkit, labkit.cli, labkit.bench; "
            "bad = [m for m in ('ipywidgets', 'IPython', 'matplotlib', 'bitsandbytes') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_public_api_names():
    for name in ("RunConfig", "RunResult", "env_report", "fit", "sweep", "load_config", "load_reference",
                 "profile", "find_max_batch_size", "estimate_memory", "training_memory"):
        assert hasattr(labkit, name), name
    assert labkit.find_max_batch_size is capacity.find_max_batch_size
    assert labkit.estimate_memory is capacity.estimate_memory
    assert labkit.training_memory is capacity.training_memory
    assert Probe(8, True) == (8, True, None)


def _function_level_labkit_imports(path: Path, root: Path = SRC) -> list[str]:
    """``file:line`` of each import of a labkit module made inside a function of ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            relative_or_labkit = isinstance(inner, ast.ImportFrom) and (
                inner.level > 0 or (inner.module or "").split(".")[0] == "labkit")
            plain_labkit = isinstance(inner, ast.Import) and any(a.name.split(".")[0] == "labkit" for a in inner.names)
            if relative_or_labkit or plain_labkit:
                found.append(f"{path.relative_to(root)}:{inner.lineno}")
    return found


def test_no_labkit_module_imports_another_inside_a_function():
    """labkit's own imports all stand at the top of a module, where a reader sees any cycle.

    The layers contract (import-linter, in pyproject.toml) sees every import; one inside a function would still
    hide a cycle from a reader.
    """
    found = [hit for path in sorted(SRC.rglob("*.py")) for hit in _function_level_labkit_imports(path)]
    assert found == []


def test_the_function_level_import_check_finds_one(tmp_path):
    module = tmp_path / "mod.py"
    module.write_text("import torch\n\n\ndef f():\n    from . import train\n    import labkit.data\n    return train\n")
    assert _function_level_labkit_imports(module, tmp_path) == ["mod.py:5", "mod.py:6"]


def _torch_install_line(tmp_path, driver: str | None) -> str:
    """The torch line `make install` would run on a machine whose nvidia-smi reports ``driver`` (None: no GPU)."""
    path = [str(tmp_path)] + [p for p in os.environ["PATH"].split(os.pathsep) if not Path(p, "nvidia-smi").exists()]
    if driver is not None:
        (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\necho {driver}\n")
        (tmp_path / "nvidia-smi").chmod(0o755)
    make = shutil.which("make")
    done = subprocess.run([make, "-n", "-B", ".venv/bin/.labkit-installed"], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], env={**os.environ, "PATH": os.pathsep.join(path)})
    return next(line for line in done.stdout.splitlines() if "torch==" in line)


def test_make_takes_the_cuda_12_8_torch_where_the_driver_is_older_than_r580(tmp_path):
    # torch 2.14 from PyPI is the CUDA 13.0 build: on a driver before R580 it would see no GPU
    if not shutil.which("make"):
        pytest.skip("no make here")
    for name, driver, old in (("old", "535.104.05", True), ("new", "580.159.03", False), ("none", None, False)):
        (tmp_path / name).mkdir()
        line = _torch_install_line(tmp_path / name, driver)
        assert ("--index-url https://download.pytorch.org/whl/cu128" in line) is old, (driver, line)


def test_no_module_over_500_lines_and_no_loop_function_over_40():
    package = Path(labkit.__file__).parent
    long_modules = {str(p.relative_to(package)): n for p in package.rglob("*.py")
                    if (n := len(p.read_text().splitlines())) > 500}
    assert not long_modules, f"modules over 500 lines (DESIGN.md): {long_modules}"
    loop = ast.parse((package / "train.py").read_text())
    long_functions = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(loop)
                      if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 40}
    assert not long_functions, f"train.py functions over 40 lines: {long_functions}"

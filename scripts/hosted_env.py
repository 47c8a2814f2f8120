"""Build a second environment as Colab's (or Kaggle's) image has it, install labkit there as the notebooks' setup
cells do, and run the tests and notebooks that scripts/hosted_images.toml names for it.

    python scripts/hosted_env.py colab               # build (or reuse) .ci-cache/hosted-colab, then test there
    python scripts/hosted_env.py colab --build-only  # `make test` builds it in the background, beside the unit tests
    python scripts/hosted_env.py colab --run-only    # ... and runs it once its build has finished
    python scripts/hosted_env.py floor               # the oldest torch labkit supports (by hand: about 3 GB)

The image's Python comes from pyenv or PATH (python3.13); its `preinstalled` packages from the package index at the
versions the file gives (torchao among them where the image has one), none of its `absent` ones; then labkit from
this checkout with every notebook's extras, with nothing pinned (so pip keeps the preinstalled torch, or upgrades
whatever labkit's requirements force, as on Colab). The notebooks whose setup cell installs no torchao run with the
image's own; then the torchao release 06's and 08's setup cells pick for that torch is installed, and the tests and
the notebooks that need it run. The environment is reused while the image's entry is unchanged.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "scripts" / "hosted_images.toml"
REQUIRED = ("torch", "torchvision", "ipywidgets", "transformers", "peft")  # every image names these
# What the test run itself needs there (Colab has ipykernel and pytest; nbval and xdist are ours).
TEST_TOOLS = ("pytest", "pytest-xdist", "nbval", "ipykernel", "nbformat")
# nbval's options, as scripts/test.sh passes them (a kernel on a busy machine may take over 60 s to answer)
NBVAL = ("--nbval-lax", "--nbval-current-env", "--nbval-kernel-startup-timeout=240")


class HostedEnvError(RuntimeError):
    pass


def image(name: str, path: Path = IMAGES) -> dict:
    """The entry ``name`` of hosted_images.toml; an error names the images there and what an entry lacks."""
    images = tomllib.loads(path.read_text())
    if name not in images:
        raise HostedEnvError(f"image={name!r} is not allowed: one of {sorted(images)} ({path.name})")
    entry = images[name]
    missing = [key for key in ("python", "preinstalled", "absent", "tests", "notebooks") if key not in entry]
    missing += [f"preinstalled.{package}" for package in REQUIRED if package not in entry.get("preinstalled", {})]
    if missing:
        raise HostedEnvError(f"{path.name} [{name}] lacks {missing}")
    return entry


def find_python(version: str) -> str:
    """An interpreter of ``version`` (e.g. 3.13) that runs: the newest pyenv build of it, else python3.13 on PATH."""
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    builds = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"),
                    key=lambda p: [int(x) for x in Path(p).parent.parent.name.split(".") if x.isdigit()])
    for candidate in [*reversed(builds), shutil.which(f"python{version}")]:
        # a pyenv shim on PATH answers "command not found" for a version that is installed but not selected
        if candidate and subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode == 0:
            return candidate
    raise HostedEnvError(f"python={version!r}: no Python {version} here (neither {root}/versions/{version}.* nor "
                         f"python{version} on PATH); install it, e.g. `pyenv install {version}`")


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in command), flush=True)
    return subprocess.run([str(c) for c in command], check=True, **kwargs)


def setup_cell_spec() -> str:
    """What the notebooks' setup cells install, every notebook's extras together, from this checkout."""
    project = _project()
    extras = sorted({extra for names in project.NOTEBOOK_EXTRAS.values() for extra in names})
    return f"{project.DISTRIBUTION}[{','.join(extras)}] @ {ROOT.as_uri()}"


def _project():
    """labkit's own project facts, read from its file alone: importing the package would import torch, and `make
    test` runs this build with the host's Python, before labkit's environment exists."""
    spec = importlib.util.spec_from_file_location("labkit_project", ROOT / "src" / "labkit" / "project.py")
    project = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(project)
    return project


def _pip(python: Path) -> tuple:
    # --no-compile: byte-compiling torch's and the CUDA wheels' thousands of files took a core for minutes, beside
    # the unit tests that `make test` runs meanwhile; Python compiles what it imports
    return (python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile")


def _installed(python: Path, package: str) -> str | None:
    """``package``'s installed version in ``python``'s environment, None when it is not installed."""
    done = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                          capture_output=True, text=True, cwd="/")
    return done.stdout.strip() if done.returncode == 0 else None


def build(name: str, venv: Path) -> Path:
    """Create (or reuse) the image's venv with labkit installed as the setup cells install it; returns its Python."""
    entry = image(name)
    python = venv / "bin" / "python"
    stamp = venv / ".image.json"
    wanted = json.dumps({k: entry[k] for k in ("python", "preinstalled", "absent")}, sort_keys=True)
    if not (stamp.exists() and stamp.read_text() == wanted and python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        run(find_python(entry["python"]), "-m", "venv", venv)
        run(*_pip(python), *(f"{package}=={version}" for package, version in entry["preinstalled"].items()),
            *TEST_TOOLS)
        present = [package for package in entry["absent"] if _installed(python, package)]
        if present:
            raise HostedEnvError(f"[{name}] lists {present} as absent, and its preinstalled packages brought them")
        stamp.write_text(wanted)
    # This checkout's labkit (pip rebuilds a local directory each time) with its requirements, resolved beside the
    # image's packages as the setup cell's %pip resolves them.
    run(*_pip(python), setup_cell_spec())
    return python


def _pytest(python: Path, name: str, args, env: dict) -> int:
    common = ("-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile")
    started = time.perf_counter()
    done = subprocess.run([python, "-m", "pytest", *common, *args], cwd=ROOT, env=env)
    print(f"[{name}] {' '.join(args)}: exit {done.returncode} in {time.perf_counter() - started:.0f} s", flush=True)
    return done.returncode


def check(name: str, venv: Path) -> int:
    """Print the versions there, then run the image's tests and notebooks; returns the worst exit code.

    First the notebooks whose setup cell installs no torchao, with the image's own (Colab's 0.10, which PEFT 0.19+
    refuses); then torchao as 06's and 08's setup cells install it, and the other notebooks and the tests together.
    """
    entry = image(name)
    python = venv / "bin" / "python"
    if not python.exists():
        raise HostedEnvError(f"{venv} has no environment yet: run `python scripts/hosted_env.py {name}` first")
    preinstalled = entry["preinstalled"]
    torchao = preinstalled.get("torchao")
    if torchao and _installed(python, "torchao") != torchao:  # a reused environment: an earlier check upgraded it
        run(*_pip(python), f"torchao=={torchao}")
    elif not torchao and _installed(python, "torchao"):
        run(python, "-m", "pip", "uninstall", "-q", "-y", "torchao")
    shown = [*preinstalled, *entry["absent"], "labkit-finetune"]
    print(f"[{name}]", ", ".join(f"{package} {_installed(python, package) or 'absent'}" for package in shown),
          flush=True)
    for package, version in preinstalled.items():  # the image's own versions survived labkit's install
        got = _installed(python, package)
        if got is None or got.split("+")[0] != version:
            raise HostedEnvError(f"installing labkit changed the image's {package} {version} to {got}")
    # Its own results cache: runs cached by the main environment's tests must not stand in for runs on this torch.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LABKIT_DATA_DIR": tempfile.mkdtemp(prefix=f"labkit-{name}-")}
    needs = set(_project().NEEDS_TORCHAO)
    before = [nb for nb in entry["notebooks"] if Path(nb).name not in needs]
    after = [nb for nb in entry["notebooks"] if Path(nb).name in needs]
    worst = 0
    if before:
        worst = _pytest(python, name, (*NBVAL, *before), env)
    requirement = subprocess.run([python, "-c", "from labkit.project import torchao_requirement; "
                                                "print(torchao_requirement())"],
                                 check=True, capture_output=True, text=True, cwd="/").stdout.strip()
    run(*_pip(python), requirement)  # what 06's and 08's setup cells install
    # The tests and those notebooks in one run: each notebook first (in order, not xdist's by-size order), on one
    # worker while the other takes the test files, rather than alone after them with a core idle.
    worst = max(worst, _pytest(python, name, (*NBVAL, "--no-loadscope-reorder", *after, *entry["tests"]), env))
    shutil.rmtree(env["LABKIT_DATA_DIR"], ignore_errors=True)
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", help="an entry of scripts/hosted_images.toml: colab, kaggle, floor, ...")
    parser.add_argument("--build-only", action="store_true", help="build the environment, run nothing")
    parser.add_argument("--run-only", action="store_true", help="run in the environment built before")
    parser.add_argument("--dir", help="where the environment lives (default: .ci-cache/hosted-IMAGE)")
    args = parser.parse_args(argv)
    venv = Path(args.dir) if args.dir else ROOT / ".ci-cache" / f"hosted-{args.image}"
    try:
        image(args.image)
        if not args.run_only:
            started = time.perf_counter()
            build(args.image, venv)
            print(f"[{args.image}] environment ready in {time.perf_counter() - started:.0f} s: {venv}", flush=True)
        return 0 if args.build_only else check(args.image, venv)
    except (HostedEnvError, subprocess.CalledProcessError) as exc:
        print(f"hosted_env: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

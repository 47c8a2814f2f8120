"""Build a second environment as Colab's (or Kaggle's) image has it, install labkit there as the notebooks' setup
cell does, and run the tests and notebooks that scripts/hosted_images.toml names for it.

    python scripts/hosted_env.py colab               # build (or reuse) .ci-cache/hosted-colab, then test there
    python scripts/hosted_env.py colab --build-only  # `make test` builds it in the background, beside the unit tests
    python scripts/hosted_env.py colab --run-only    # ... and runs it once its build has finished
    python scripts/hosted_env.py floor               # the oldest torch labkit supports (by hand: about 3 GB)

The image's Python comes from PATH (python3.12) or pyenv; its packages from the package index, pinned to the
versions the file gives; then labkit from this checkout with every notebook's extras, with nothing pinned (so pip
keeps the preinstalled torch, or upgrades whatever labkit's requirements force, as on Colab), then the torchao
release 06's setup cell picks for that torch. The environment is reused while the image's entry is unchanged.
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
PREINSTALLED = ("torch", "torchvision", "ipywidgets", "transformers", "peft")
# What the test run itself needs there (Colab has ipykernel and pytest; nbval and xdist are ours).
TEST_TOOLS = ("pytest", "pytest-xdist", "nbval", "ipykernel", "nbformat")


class HostedEnvError(RuntimeError):
    pass


def image(name: str, path: Path = IMAGES) -> dict:
    """The entry ``name`` of hosted_images.toml, following ``same_as``; an error names the images there."""
    images = tomllib.loads(path.read_text())
    if name not in images:
        raise HostedEnvError(f"image={name!r} is not allowed: one of {sorted(images)} ({path.name})")
    entry = images[name]
    if "same_as" in entry:
        entry = {**image(entry["same_as"], path), "read": entry.get("read")}
    missing = [key for key in ("python", *PREINSTALLED, "tests", "notebooks") if key not in entry]
    if missing:
        raise HostedEnvError(f"{path.name} [{name}] lacks {missing}")
    return entry


def find_python(version: str) -> str:
    """An interpreter of ``version`` (e.g. 3.12) that runs: the newest pyenv build of it, else python3.12 on PATH."""
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
    # labkit's own project facts, read from its file alone: importing the package would import torch, and `make test`
    # runs this build with the host's Python, before labkit's environment exists
    spec = importlib.util.spec_from_file_location("labkit_project", ROOT / "src" / "labkit" / "project.py")
    project = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(project)

    extras = sorted({extra for names in project.NOTEBOOK_EXTRAS.values() for extra in names})
    return f"{project.DISTRIBUTION}[{','.join(extras)}] @ {ROOT.as_uri()}"


def build(name: str, venv: Path) -> Path:
    """Create (or reuse) the image's venv with labkit installed; returns its Python."""
    entry = image(name)
    python = venv / "bin" / "python"
    stamp = venv / ".image.json"
    wanted = json.dumps({k: entry[k] for k in ("python", *PREINSTALLED)}, sort_keys=True)
    if not (stamp.exists() and stamp.read_text() == wanted and python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        run(find_python(entry["python"]), "-m", "venv", venv)
        # --no-compile: byte-compiling torch's and the CUDA wheels' thousands of files took a core for minutes,
        # beside the unit tests that `make test` runs meanwhile; Python compiles what it imports
        pip = (python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile")
        run(*pip, *(f"{package}=={entry[package]}" for package in PREINSTALLED), *TEST_TOOLS)
        stamp.write_text(wanted)
    pip = (python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile")
    # This checkout's labkit (pip rebuilds a local directory each time) with its requirements, resolved beside the
    # image's packages as the setup cell's %pip resolves them.
    run(*pip, setup_cell_spec())
    torchao = subprocess.run([python, "-c", "from labkit.project import torchao_requirement; "
                                            "print(torchao_requirement())"],
                             check=True, capture_output=True, text=True, cwd="/").stdout.strip()
    run(*pip, torchao)  # what 06's setup cell installs
    return python


def check(name: str, venv: Path) -> int:
    """Print the versions there, then run the image's tests and notebooks; returns the worst exit code."""
    entry = image(name)
    python = venv / "bin" / "python"
    if not python.exists():
        raise HostedEnvError(f"{venv} has no environment yet: run `python scripts/hosted_env.py {name}` first")
    versions = ("import sys, torch, torchvision, ipywidgets, transformers, peft, torchao, bitsandbytes, labkit; "
                "print(f'Python {sys.version.split()[0]}', *(f'{m.__name__} {m.__version__}' for m in (torch, "
                "torchvision, ipywidgets, transformers, peft, torchao, bitsandbytes, labkit)), sep=', ')")
    run(python, "-c", versions, cwd="/")
    for package in PREINSTALLED:  # the image's own versions survived labkit's install
        got = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version('{package}'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
        if got.split("+")[0] != entry[package]:
            raise HostedEnvError(f"installing labkit changed the image's {package} {entry[package]} to {got}")
    common = ("-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile")
    # Its own results cache: runs cached by the main environment's tests must not stand in for runs on this torch.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LABKIT_DATA_DIR": tempfile.mkdtemp(prefix=f"labkit-{name}-")}
    worst = 0
    for args in (entry["tests"], ("--nbval-lax", "--nbval-current-env", *entry["notebooks"])):
        started = time.perf_counter()
        done = subprocess.run([python, "-m", "pytest", *common, *args], cwd=ROOT, env=env)
        print(f"[{name}] {' '.join(args)}: exit {done.returncode} in {time.perf_counter() - started:.0f} s", flush=True)
        worst = max(worst, done.returncode)
    shutil.rmtree(env["LABKIT_DATA_DIR"], ignore_errors=True)
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", help="an entry of scripts/hosted_images.toml: colab, kaggle, floor")
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

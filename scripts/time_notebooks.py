"""Run notebooks at the `quick` profile as a learner's first pass does (one notebook at a time, in order, sharing
one results cache that starts empty: a notebook reuses runs an earlier one cached, as on a learner's machine) and
write their wall times to `notebooks/src/timings.json`, which `scripts/build_notebooks.py` puts in each header.
Run it on an idle 2-core machine after a change that alters a notebook's work, then `make notebooks`.

Usage: python scripts/time_notebooks.py [NN_name or NN ...]   (none: every notebook)
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ROOT / "notebooks" / "src" / "timings.json"
CELL_TIMEOUT_S = 1800


def machine() -> str:
    """What the times were measured on: cores, the CPU's bf16/fp16 support, torch, the date."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    native = [name for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16"),
                                      ("avx512_fp16", "AVX512-FP16")) if flag in flags]
    import torch

    return (f"{os.cpu_count()}-core {platform.machine()}, {', '.join(native) or 'no native bf16 or fp16'}, "
            f"torch {torch.__version__.split('+')[0]}, {datetime.date.today().isoformat()}")


def run(path: Path, data: str) -> float:
    """Seconds to run every cell of ``path`` at `quick`, with its results cache in ``data``."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as cwd:
        env = {**os.environ, "LABKIT_PROFILE": "quick", "LABKIT_DATA_DIR": data, "LABKIT_OFFLINE": "1"}
        os.environ.update(env)  # the kernel inherits this process's environment
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": cwd}})
        start = time.monotonic()
        client.execute()
        return time.monotonic() - start


def notebooks_named(names: list[str]) -> list[Path]:
    """The built notebooks named by stem or number (``08_lora`` or ``08``), in order; every one for no names."""
    return [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
            if not names or p.stem in names or p.stem[:2] in names]


def main(names: list[str]) -> int:
    timings = json.loads(TIMINGS.read_text())
    chosen = notebooks_named(names)
    if not chosen:
        print(f"no notebook matches {names}", file=sys.stderr)
        return 2
    data = tempfile.mkdtemp(prefix="labkit-timing-")
    for path in chosen:
        seconds = run(path, data)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        timings["notebooks"].setdefault(path.stem, {}).update(
            quick_s=round(seconds, 1), measured_on=machine(), commit=commit.stdout.strip())
        TIMINGS.write_text(json.dumps(timings, indent=1) + "\n")  # after each: an interrupted run keeps the rest
        print(f"{path.stem}: {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

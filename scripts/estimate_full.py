"""Estimate each notebook's time at `full` on a T4, from what it runs, and write it to notebooks/src/timings.json
(`full_t4_min`, `full_t4_basis`), which `scripts/build_notebooks.py` puts in each header.

    python scripts/estimate_full.py [NN_name or NN ...]   (none: every notebook, in order, one results cache)
    python scripts/estimate_full.py --ledgers DIR [NN ...] (estimate again from the ledgers of an earlier run)

Each notebook runs here, on the CPU, at the `full` profile's sizes and steps with its models shrunk
(``LABKIT_PROFILE=full LABKIT_SHRINK=plan``: `labkit.env.FULL_PLAN`), and a first cell installs the ledger
(scripts/full_ledger.py): every training run, evaluation, latency table and distributed job is recorded with the
steps and shapes it has at `full`, and cut short here. The ledger's FLOPs at the real models' shapes, at a stated
share of the T4's peak, plus a fixed cost per run and the CPU forwards at this CPU's rate, give the estimate
(`full_ledger.METHOD`). Cells that fail on the cut-short runs (checks on accuracy) do not stop the notebook.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ROOT / "notebooks" / "src" / "timings.json"
sys.path.insert(0, str(ROOT / "scripts"))

import full_ledger  # noqa: E402 - beside this script
from time_notebooks import notebooks_named  # noqa: E402

CELL_TIMEOUT_S = 3600
HOOK = f"import sys\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\nimport full_ledger\nfull_ledger.install()"


def record(path: Path, data: str, ledger: Path) -> float:
    """Run ``path`` in plan mode with the ledger installed; returns the wall seconds here."""
    nb = nbformat.read(path, as_version=4)
    setup = next(i for i, cell in enumerate(nb.cells) if "labkit.profile()" in cell.source)
    nb.cells.insert(setup, nbformat.v4.new_code_cell(HOOK))
    # a cache of its own, as on Colab, where each notebook opens in a fresh runtime: no run is reused from another
    env = {"LABKIT_PROFILE": "full", "LABKIT_SHRINK": "plan", "LABKIT_DATA_DIR": str(Path(data) / path.stem),
           "LABKIT_OFFLINE": "1",
           full_ledger.LEDGER_ENV: str(ledger), "TQDM_DISABLE": "1", "MPLBACKEND": "Agg"}
    os.environ.update(env)  # the kernel inherits this process's environment
    with tempfile.TemporaryDirectory() as cwd:
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": cwd}})
        start = time.monotonic()
        client.execute()
    for name in env:
        os.environ.pop(name, None)
    errors = [(c.source.splitlines()[0], o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    print(f"{path.stem}: {len(errors)} cell(s) failed on the cut-short runs", flush=True)
    for first, error in errors:  # a check on accuracy is expected to fail; anything else would skip counted work
        print(f"    {first[:100]} -> {error['ename']}: {error['evalue'][:160]}", flush=True)
    return time.monotonic() - start


BASIS = "estimated from its FLOPs: scripts/estimate_full.py"  # the header's words; the method is in the README
BASIS_07 = "its jobs on Kaggle's two T4s; estimated from its FLOPs: scripts/estimate_full.py"


def parts(seconds: dict) -> str:
    """What the estimate is made of, for timings.json: the method and its parts in minutes."""
    method = full_ledger.METHOD.format(fp32=full_ledger.T4_SHARE["fp32"], fp16=full_ledger.T4_SHARE["fp16"],
                                       op_us=full_ledger.OP_S * 1e6,
                                       run=full_ledger.RUN_OVERHEAD_S)
    found = [f"{seconds['runs']} runs: {seconds['train'] / 60:.1f} min of training steps"]
    if seconds["eval"]:
        found.append(f"{seconds['eval'] / 60:.1f} evaluating")
    if seconds["forward_gpu"] + seconds["forward_cpu"]:
        found.append(f"{(seconds['forward_gpu'] + seconds['forward_cpu']) / 60:.1f} timing inference "
                     f"({seconds['forward_cpu'] / 60:.1f} of it on the CPU)")
    if seconds["launch"]:
        found.append(f"{seconds['launch'] / 60:.1f} in distributed jobs")
    return f"{method}; " + ", ".join(found)


def main(names: list[str]) -> int:
    ledgers = None
    if names[:1] == ["--ledgers"]:
        if len(names) < 2:
            print("--ledgers needs the folder of an earlier run's ledgers", file=sys.stderr)
            return 2
        ledgers, names = Path(names[1]), names[2:]
    timings = json.loads(TIMINGS.read_text())
    chosen = notebooks_named(names)
    if not chosen:
        print(f"no notebook matches {names}", file=sys.stderr)
        return 2
    data = str(ledgers) if ledgers else tempfile.mkdtemp(prefix="labkit-plan-")
    rate = full_ledger.cpu_rate()
    print(f"this CPU's matmul rate: {rate / 1e9:.0f} GFLOP/s; ledgers in {data}", flush=True)
    for path in chosen:
        ledger = Path(data) / f"{path.stem}.jsonl"
        wall = 0.0 if ledgers else record(path, data, ledger)
        seconds = full_ledger.estimate(ledger, rate) if ledger.exists() else None
        if seconds is None:
            print(f"{path.stem}: nothing recorded", flush=True)
            continue
        minutes = seconds["total"] / 60
        timings["notebooks"].setdefault(path.stem, {}).update(
            full_t4_min=round(minutes, 1), full_t4_basis=BASIS_07 if path.stem.startswith("07") else BASIS,
            full_t4_parts=parts(seconds))
        TIMINGS.write_text(json.dumps(timings, indent=1) + "\n")  # after each: an interrupted run keeps the rest
        print(f"{path.stem}: about {minutes:.1f} min on a T4 ({parts(seconds)}); {wall:.0f} s here", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

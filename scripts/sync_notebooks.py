"""Rewrite each notebook's badges and install line from src/labkit/project.py (the one place the
repository URL is written). `tests/notebooks/test_notebooks.py` fails when they disagree.

Usage: python scripts/sync_notebooks.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from labkit import project  # noqa: E402

BADGE_PREFIX = "[![Open In Colab]"
INSTALL_MARK = "%pip install"


def expected_lines(name: str) -> dict:
    return {BADGE_PREFIX: project.badges(name), INSTALL_MARK: f'    %pip install -q "{project.install_spec(name)}"'}


def sync(path: Path, check: bool = False) -> list[str]:
    """Return the lines that differ; rewrite them unless ``check``."""
    nb = json.loads(path.read_text())
    wanted = expected_lines(path.name)
    changed = []
    for cell in nb["cells"]:
        lines = "".join(cell["source"]).split("\n")
        for i, line in enumerate(lines):
            for mark, good in wanted.items():
                if line.lstrip().startswith(mark) and line != good:
                    changed.append(f"{path.name}: {line.strip()!r} -> {good.strip()!r}")
                    lines[i] = good
        cell["source"] = [line + "\n" for line in lines[:-1]] + [lines[-1]]
    if changed and not check:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


if __name__ == "__main__":
    check = "--check" in sys.argv
    diffs = [d for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) for d in sync(nb, check)]
    print("\n".join(diffs) or "notebooks agree with src/labkit/project.py")
    sys.exit(1 if check and diffs else 0)

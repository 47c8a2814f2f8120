"""Build every notebook from its source: `notebooks/src/NN_name.py` (jupytext py:percent) filled into
`notebooks/src/_template.py` (header, setup cells, closing cell) -> `notebooks/NN_name.ipynb`, without outputs.

The header's title, badges, times and contents are written here: the title and the "what you will learn / need"
text come from the source's first cell, the badges and the install line from `src/labkit/project.py`, the
compute time at `quick` from `notebooks/src/timings.json` (written by `scripts/time_notebooks.py` from a
measured run), the reading time from the notebook's words, the contents from its `## ` headings.

Usage: python scripts/build_notebooks.py [--check] [NN_name ...]
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks" / "src"
TEMPLATE = SOURCES / "_template.py"
TIMINGS = SOURCES / "timings.json"
sys.path.insert(0, str(ROOT / "src"))

from labkit import project  # noqa: E402

# A learner's reading pace through these notebooks (prose with formulas, tables and code to follow): a read
# of 1.9k-3.1k markdown words took 30-45 minutes, about 70 words a minute.
READING_WORDS_PER_MIN = 70
FOOTER = ("## Pitfalls", "## Going further", "## Summary", "## Further reading", "## Exercises")
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def words(markdown: str) -> int:
    """The words of ``markdown`` as `wc -w` counts them: every whitespace-separated token (a table's pipes too)."""
    return len(markdown.split())


class BuildError(ValueError):
    """A source that cannot be built; the message names the source and what is wrong."""


def sources() -> list[Path]:
    return sorted(p for p in SOURCES.glob("[0-9][0-9]_*.py"))


def built_path(source: Path) -> Path:
    return ROOT / "notebooks" / f"{source.stem}.ipynb"


def read_cells(path: Path) -> list[dict]:
    return [dict(cell) for cell in jupytext.read(path, fmt="py:percent").cells]


def _split_header(source: Path, cells: list[dict]) -> tuple[str, str, list[dict]]:
    if not cells or cells[0]["cell_type"] != "markdown" or not cells[0]["source"].startswith("# "):
        raise BuildError(f"{source.name}: the first cell must be markdown starting with '# <title>'")
    title, _, header = cells[0]["source"].partition("\n")
    for needed in ("**You will learn**", "**What you need:**"):
        if needed not in header:
            raise BuildError(f"{source.name}: the header cell lacks {needed!r}")
    return title[2:].strip(), header.strip(), cells[1:]


def _headings(cells: list[dict]) -> list[str]:
    return [line for c in cells if c["cell_type"] == "markdown" for line in c["source"].splitlines()
            if line.startswith("## ")]


def _contents(source: Path, body: list[dict]) -> str:
    headings = _headings(body)
    footer = [h for h in headings if h in FOOTER]
    if footer != list(FOOTER):
        raise BuildError(f"{source.name}: the closing sections must be {', '.join(FOOTER)} in this order; "
                         f"found {footer}")
    parts = ["0 Setup"]
    for heading in headings:
        numbered = re.match(r"## (\d+)\. (.+)", heading)
        if numbered:
            parts.append(f"{numbered[1]} {numbered[2]}")
        elif heading in FOOTER:
            parts.append(heading[3:])
    return " · ".join(parts)


def _minutes(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"about {minutes} minute{'s' * (minutes > 1)}"


def _time_line(source: Path, words: int) -> str:
    timings = json.loads(TIMINGS.read_text())
    entry = timings["notebooks"].get(source.stem)
    if entry is None:
        raise BuildError(f"{source.name}: no entry in {TIMINGS.name}; run scripts/time_notebooks.py {source.stem}")
    reading = math.ceil(words / READING_WORDS_PER_MIN)
    quick = (f"{_minutes(entry['quick_s'])} of compute at `quick` on a 2-core CPU (measured: {entry['measured_on']})"
             if entry.get("quick_s") else "compute at `quick` not measured yet (scripts/time_notebooks.py)")
    return (f"{quick}, about {entry['full_t4_min']:g} minutes at `full` on a T4 ({entry['full_t4_basis']}); "
            f"about {reading} minutes of reading.")


def _fill(text: str, values: dict, where: str) -> str:
    def value(match):
        if match[1] not in values:
            raise BuildError(f"{where}: unknown placeholder {{{{{match[1]}}}}}")
        return values[match[1]]

    return PLACEHOLDER.sub(value, text)


def _cell_id(cell: dict, seen: set) -> str:
    digest = hashlib.sha1(f"{cell['cell_type']}\n{cell['source']}".encode()).hexdigest()
    n = 0
    while (cid := digest[:8] + (f"-{n}" if n else "")) in seen:
        n += 1
    seen.add(cid)
    return cid


def _next_line(source: Path) -> str:
    later = [p for p in sources() if p.name > source.name]
    if not later:
        return "This is the last notebook of the lab."
    title, _, _ = _split_header(later[0], read_cells(later[0]))
    name = f"{later[0].stem}.ipynb"
    return f"**Next:** [{later[0].stem[:2]} · {title}]({name})"


# The setup cell's lines for a notebook that needs torchao: the release built for the torch it finds (pip cannot
# choose it; see labkit.project.TORCHAO_FOR_TORCH).
TORCHAO_INSTALL = """
if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
    TORCHAO = labkit.project.torchao_requirement()  # the torchao release built for the installed torch
    %pip install -q "{TORCHAO}"
""".rstrip("\n")


def build(source: Path) -> nbformat.NotebookNode:
    """The notebook built from ``source``: the template's cells around the source's, without outputs."""
    template = jupytext.read(TEMPLATE, fmt="py:percent")
    title, header, body = _split_header(source, read_cells(source))
    if not body or body[0]["cell_type"] != "code" or "labkit.profile()" not in body[0]["source"]:
        raise BuildError(f"{source.name}: the second cell must be the imports cell that reads labkit.profile()")
    name = f"{source.stem}.ipynb"
    extras = project.NOTEBOOK_EXTRAS.get(name, ())
    values = {
        "number": source.stem[:2], "title": title, "badges": project.badges(name), "header": header,
        "install_spec": project.install_spec(name), "next": _next_line(source),
        "torchao_install": TORCHAO_INSTALL if name in project.NEEDS_TORCHAO else "",
        "package": f"`{project.DISTRIBUTION}[{','.join(extras)}]`" if extras else f"`{project.DISTRIBUTION}`",
    }
    cells = []  # (cell, from the template)
    for cell in template.cells:
        if cell["source"].strip() == "{{body}}":
            cells.extend((c, False) for c in body)
        else:
            cells.append((dict(cell), True))
    values["contents"] = _contents(source, body)
    values["time"] = ""  # the reading time counts the words of everything else
    count = sum(words(_fill(c["source"], values, TEMPLATE.name) if t else c["source"])
                for c, t in cells if c["cell_type"] == "markdown")
    values["time"] = _time_line(source, count)
    nb = nbformat.v4.new_notebook(metadata=dict(template.metadata))
    nb.metadata.pop("jupytext", None)
    seen: set = set()
    for cell, from_template in cells:
        text = _fill(cell["source"], values, TEMPLATE.name) if from_template else cell["source"]
        make = nbformat.v4.new_markdown_cell if cell["cell_type"] == "markdown" else nbformat.v4.new_code_cell
        new = make(text, metadata=dict(cell.get("metadata", {})))
        new["id"] = _cell_id(new, seen)
        nb.cells.append(new)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The notebook as Jupyter saves it (sorted keys, sources as lists of lines)."""
    return nbformat.writes(nb) + "\n"


def difference(source: Path) -> str | None:
    """Where the committed notebook differs from the build of ``source`` (None: they agree)."""
    path = built_path(source)
    if not path.exists():
        return f"{path.name} is missing: run `make notebooks`"
    built, committed = json.loads(render(build(source))), json.loads(path.read_text())
    old, new = committed.get("cells", []), built["cells"]
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            first = next((k for k in ("cell_type", "source", "metadata", "outputs", "id") if a.get(k) != b.get(k)),
                         "the cell")
            text = "".join(a.get("source", "")) if isinstance(a.get("source"), list) else a.get("source", "")
            return f"{path.name}: cell {i} differs from its build ({first}): {text[:80]!r}; run `make notebooks`"
    if len(old) != len(new):
        return f"{path.name}: {len(old)} cells, its build has {len(new)}; run `make notebooks`"
    if committed != built:
        return f"{path.name}: its metadata differs from its build; run `make notebooks`"
    return None


def main(argv: list[str]) -> int:
    check = "--check" in argv
    names = [a for a in argv if not a.startswith("--")]
    chosen = [s for s in sources() if not names or s.stem in names or s.stem[:2] in names]
    unknown = [n for n in names if not any(n in (s.stem, s.stem[:2]) for s in sources())]
    if unknown:
        print(f"no source for {unknown}; sources: {[s.stem for s in sources()]}", file=sys.stderr)
        return 2
    problems = []
    for source in chosen:
        try:
            if check:
                problems += [d for d in [difference(source)] if d]
            else:
                built_path(source).write_text(render(build(source)))
        except BuildError as error:
            problems.append(str(error))
    print("\n".join(problems) or f"{len(chosen)} notebooks {'agree with' if check else 'built from'} their sources")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

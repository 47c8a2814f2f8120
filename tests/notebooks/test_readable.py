"""A notebook a learner can read in one sitting: at most 2,000 markdown words and 10 numbered sections on its main
path, markdown tables of at most 7 columns, and no "seed" in the sense of the material the lab started from (a
random seed keeps its ordinary meaning). Tables printed by a run are checked where a learner sees them: in the
browser test (tests/browser)."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from build_notebooks import words  # noqa: E402 - the build counts words the same way for the reading time

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_WORDS = 2000
MAX_SECTIONS = 10
MAX_TABLE_COLUMNS = 7
# "seed" as the lab's starting material: the seed's recipe, the seeds' puzzle, seed_snippet, SeedLoRALayer, ...
# A random seed (`seed=`, `seeds=(0, 1, 2)`, "repeats over seeds", `manual_seed`) is not matched.
# "the seed of the fine-tuned model" and "different seeds" are random seeds.
LEGACY_SEED = re.compile(r"(?i:\bthe seeds?\b(?! of the\b)|\bseed's\b|\bseeds')|\bseed_\w+|\bSeed[A-Z]\w*|\bSEED_\w+"
                         r"|\brec\.seed\b")
def _cells(path: Path, kind: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def markdown_words(path: Path) -> int:
    return sum(words(text) for text in _cells(path, "markdown"))


def numbered_sections(path: Path) -> list[str]:
    """The main path's numbered sections, setup (0) left out."""
    return [line for text in _cells(path, "markdown") for line in text.splitlines()
            if re.match(r"## [1-9]\d*\. ", line)]


def markdown_table_columns(path: Path) -> list[int]:
    """The column count of every markdown table (its header row)."""
    counts = []
    for text in _cells(path, "markdown"):
        lines = text.splitlines()
        for header, rule in zip(lines, lines[1:], strict=False):
            if header.lstrip().startswith("|") and re.fullmatch(r"\s*\|(\s*:?-+:?\s*\|)+\s*", rule):
                counts.append(header.strip().strip("|").count("|") + 1)
    return counts


def legacy_seed(path: Path) -> list[str]:
    return [m.group(0) for text in _cells(path, "markdown") + _cells(path, "code") for m in LEGACY_SEED.finditer(text)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_at_most_2000_markdown_words_and_10_sections(path):
    assert len(numbered_sections(path)) <= MAX_SECTIONS, numbered_sections(path)
    assert markdown_words(path) <= MAX_WORDS, f"{path.stem}: {markdown_words(path)} markdown words"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_tables_have_at_most_7_columns(path):
    columns = markdown_table_columns(path)
    assert max(columns, default=0) <= MAX_TABLE_COLUMNS, f"{path.stem}: markdown tables of {columns} columns"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_seed_in_the_sense_of_the_labs_starting_material(path):
    assert not legacy_seed(path), f"{path.stem} says {legacy_seed(path)}"


def hidden_tables(path: Path) -> list[str]:
    """``display.table(...)`` statements that are not their cell's last: it returns a styled table, which Jupyter
    shows only as the cell's value, so any earlier one in the cell is computed and never seen."""
    from IPython.core.inputtransformer2 import TransformerManager  # magics (%pip, !cmd) as the Python they run

    hidden = []
    for i, text in enumerate(_cells(path, "code")):
        body = ast.parse(TransformerManager().transform_cell(text)).body
        hidden += [f"code cell {i}: {ast.unparse(statement)[:70]}" for statement in body[:-1]
                   if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
                   and ast.unparse(statement.value.func).endswith("display.table")]
    return hidden


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_table_a_cell_makes_is_shown(path):
    assert not hidden_tables(path), f"{path.stem}: tables a learner never sees: {hidden_tables(path)}"


def test_a_table_before_the_last_statement_is_caught(tmp_path):
    notebook = tmp_path / "nb.ipynb"
    cell = {"cell_type": "code", "source": "display.table(a)\nprint(1)", "metadata": {}, "outputs": []}
    notebook.write_text(json.dumps({"cells": [cell]}))
    assert hidden_tables(notebook) == ["code cell 0: display.table(a)"]


def test_the_measures_see_what_they_measure(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["## 1. One\n", "| a | b |\n", "| --- | :-: |\n", "| 1 | 2 |\n"]},
        {"cell_type": "markdown",
         "source": ["## 2. Two words\nThe seed's recipe, a random seed, the seed of the model."]},
        {"cell_type": "code", "source": ["lab.seed_snippet(); torch.manual_seed(0); run(seed=1, seeds=(0, 1))"]}]}
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps(nb))
    assert markdown_words(path) == 3 + 5 + 5 + 5 + 4 + 11 and len(numbered_sections(path)) == 2  # pipes count
    assert markdown_table_columns(path) == [2]
    assert legacy_seed(path) == ["The seed", "seed_snippet"]

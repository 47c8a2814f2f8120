"""Labs speak in results (issue 41): the labs stay thin, every finding decides "real or noise" through
`labkit.measure.compare`, and a lab package exports its experiments, nothing private."""

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "src" / "labkit" / "labs"
spec = importlib.util.spec_from_file_location("labs_weight", ROOT / "scripts" / "labs_weight.py")
labs_weight = importlib.util.module_from_spec(spec)
spec.loader.exec_module(labs_weight)
PACKAGES = sorted(p.name for p in LABS.iterdir() if (p / "__init__.py").exists())


def test_the_labs_stay_thin():
    weight = labs_weight.weigh(LABS)
    assert weight["lines"] <= 8500, weight
    assert weight["string_share"] <= 0.38, weight
    assert weight["module_findings"] <= 10, weight


def test_the_weight_counts_what_it_says(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""Doc."""\nfrom .a import run\n__all__ = ["run"]\n')
    (tmp_path / "pkg" / "a.py").write_text('def run():\n    return "ab"\n\n\ndef run_finding():\n    return 1\n')
    weight = labs_weight.weigh(tmp_path)
    assert weight["lines"] == 9 and weight["module_findings"] == 1 and weight["lab_exports"] == 1
    assert weight["string_share"] == pytest.approx((len('"""Doc."""') + len('"run"') + len('"ab"')) / (
        len('"""Doc."""\nfrom .a import run\n__all__ = ["run"]\n') + len(
            'def run():\n    return "ab"\n\n\ndef run_finding():\n    return 1\n')))


# What a lab would write where it decides noise by hand (labkit.measure.VERDICTS words it once).
_OWN_NOISE_WORDS = re.compile(r"within the (?:measured )?noise|no (?:timing )?spread|outside the (?:p10-p90 )?spread",
                              re.IGNORECASE)


@pytest.mark.parametrize("path", sorted(LABS.rglob("*.py")), ids=lambda p: str(p.relative_to(LABS)))
def test_no_lab_words_its_own_noise_verdict(path):
    tree = ast.parse(path.read_text())
    said = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and _OWN_NOISE_WORDS.search(node.value) and not node.value.startswith(("Whether", "True", "False"))]
    docstrings = {ast.get_docstring(node, clean=False) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)}
    assert not [s for s in said if s not in docstrings], f"{path.name} words its own noise verdict; use measure.compare"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_lab_exports_its_experiments_and_nothing_private(package):
    module = importlib.import_module(f"labkit.labs.{package}")
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"labkit.labs.{package} has no __all__"
    assert not [n for n in exported if n.startswith("_")], exported
    assert not [n for n in exported if n.endswith("_finding")], f"{package}: findings are result methods"

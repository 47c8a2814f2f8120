"""How heavy `src/labkit/labs/` is: lines, the share of its characters in string literals (docstrings included, as
Python's tokenizer counts them), module-level ``*_finding`` functions, and the names the lab packages export.

    python scripts/labs_weight.py [PATH]      # PATH defaults to src/labkit/labs
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path


def weigh(root: Path) -> dict:
    lines = chars = strings = findings = exports = 0
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines += source.count("\n")
        chars += len(source)
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING or token.type in _FSTRING_TYPES:
                strings += len(token.string)
        tree = ast.parse(source)
        findings += sum(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.endswith("_finding")
                        for node in tree.body)
        if path.name == "__init__.py":  # labs/__init__.py imports no lab, so it exports nothing
            exports += len(_exported(tree))
    return {"lines": lines, "string_share": strings / max(chars, 1), "module_findings": findings,
            "lab_exports": exports}


_FSTRING_TYPES = {getattr(tokenize, name) for name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
                  if hasattr(tokenize, name)}


def _exported(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [ast.literal_eval(element) for element in node.value.elts]
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names += [alias.asname or alias.name for alias in node.names]
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
    return [n for n in names if n != "annotations"]


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/labkit/labs")
    weight = weigh(root)
    print(f"lines {weight['lines']}, string literals {weight['string_share']:.1%} of characters, "
          f"module-level *_finding functions {weight['module_findings']}, lab exports {weight['lab_exports']}")

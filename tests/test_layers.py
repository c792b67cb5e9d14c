"""The core's structure, held by tests: the import-linter contracts of pyproject.toml (layers and
no cycles), and imports inside functions only with a one-line reason."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "areno_core"


def lazy_imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, module, has_reason)`` of each import inside a function of ``path`` (imports
    under ``if TYPE_CHECKING:`` are for annotations and do not count). A reason is a comment
    on the statement's lines or on the line above it."""
    lines = path.read_text().splitlines()
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool, for_types: bool) -> None:
        for child in ast.iter_child_nodes(node):
            types = for_types or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function and not types:
                module = (
                    child.module if isinstance(child, ast.ImportFrom) else child.names[0].name
                ) or ""
                statement = lines[child.lineno - 1 : child.end_lineno]
                above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                reason = any("#" in line for line in statement) or above.startswith("#")
                found.append((child.lineno, module, reason))
            visit(child, inside, types)

    visit(ast.parse(path.read_text()), False, False)
    return found


def test_every_import_inside_a_function_says_why():
    missing = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in sorted(CORE.rglob("*.py"))
        for line, module, reason in lazy_imports(path)
        if not reason
    ]
    assert not missing, "imports inside functions need a one-line reason:\n" + "\n".join(missing)


def test_the_checker_sees_a_lazy_import_without_a_reason(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import json\n"
        "def f():\n"
        "    import os\n"
        "    # heavy: only here\n"
        "    import csv\n"
        "    import re  # light\n"
    )
    assert lazy_imports(sample) == [(5, "os", False), (7, "csv", True), (8, "re", True)]


def test_the_layer_and_no_cycle_contracts_hold():
    done = subprocess.run(
        [shutil.which("lint-imports") or "lint-imports", "--config", str(REPO / "pyproject.toml")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 kept, 0 broken" in done.stdout

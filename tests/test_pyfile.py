"""Tests for areno_core.pyfile: loading a function from ``file.py[:function]``."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from areno_core.errors import UserCodeError
from areno_core.pyfile import load_function, split_spec


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_function puts the file's directory on sys.path; undo that after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_split_spec_file_only_uses_default_name() -> None:
    assert split_spec("dir/loader.py", default_name="load_row") == ("dir/loader.py", "load_row")


def test_split_spec_file_and_function_splits_at_last_colon() -> None:
    assert split_spec("dir/a:b/loader.py:fn", default_name="x") == ("dir/a:b/loader.py", "fn")


def test_split_spec_colon_inside_path_is_not_a_function() -> None:
    assert split_spec("dir/a:b/loader.py", default_name="x") == ("dir/a:b/loader.py", "x")


def test_load_function_default_name_returns_that_function(tmp_path: Path) -> None:
    path = _write(tmp_path / "loader.py", "def load_row(row):\n    return {'n': row['n'] + 1}\n")
    fn = load_function(str(path), default_name="load_row", what="dataset loader")
    assert fn({"n": 1}) == {"n": 2}


def test_load_function_explicit_name_returns_that_function(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "rewards.py",
        "def reward_fn(x):\n    return 0.0\n\ndef exact(x):\n    return 1.0\n",
    )
    fn = load_function(f"{path}:exact", default_name="reward_fn", what="reward function")
    assert fn.__name__ == "exact"
    assert fn(None) == 1.0


def test_load_function_sibling_import_resolves_from_file_directory(tmp_path: Path) -> None:
    helper = f"helper_{uuid.uuid4().hex[:8]}"
    _write(tmp_path / "pkg" / f"{helper}.py", "SCALE = 3\n")
    path = _write(
        tmp_path / "pkg" / "loader.py",
        f"from {helper} import SCALE\n\ndef load_row(row):\n    return {{'v': row['v'] * SCALE}}\n",
    )
    fn = load_function(str(path), default_name="load_row", what="dataset loader")
    assert fn({"v": 2}) == {"v": 6}
    assert str(tmp_path / "pkg") in sys.path
    sys.modules.pop(helper, None)


def test_load_function_same_file_twice_returns_same_object(tmp_path: Path) -> None:
    path = _write(tmp_path / "loader.py", "def load_row(row):\n    return row\n")
    first = load_function(str(path), default_name="load_row", what="dataset loader")
    second = load_function(str(path), default_name="load_row", what="dataset loader")
    assert first is second
    assert first.__module__.startswith("_areno_user_loader_")


def test_load_function_edited_file_is_imported_again(tmp_path: Path) -> None:
    path = _write(tmp_path / "loader.py", "def load_row(row):\n    return 1\n")
    before = load_function(str(path), default_name="load_row", what="dataset loader")
    _write(path, "def load_row(row):\n    return 22\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    after = load_function(str(path), default_name="load_row", what="dataset loader")
    assert (before(None), after(None)) == (1, 22)


# (file name, its text or None for no file, ":function" or "", default_name, what, error)
BAD_FILES = {
    "missing-file": (
        "nope.py", None, "", "load_row", "dataset loader",
        r"^dataset loader file not found: .*nope\.py \(looked for function 'load_row'; "
        r"expected a Python file given as 'file\.py' or 'file\.py:function'",
    ),
    "not-a-py-file": (
        "loader.txt", "x = 1\n", "", "reward_fn", "reward function",
        r"^reward function '.*loader\.txt' is not a \.py file; expected a Python file "
        r"given as 'file\.py' or 'file\.py:function'",
    ),
    "invalid-function-name": (
        "loader.py", "def load_row(row):\n    return row\n", ":1bad", "load_row", "dataset loader",
        r"'1bad' is not a valid Python function name",
    ),
    "missing-import": (
        "needs.py", "import not_a_real_module_xyz\n\ndef load_row(r):\n    pass\n", "",
        "load_row", "dataset loader",
        r"^dataset loader .*needs\.py failed to import: ModuleNotFoundError: "
        r"No module named 'not_a_real_module_xyz'; the file runs at import time",
    ),
    "error-at-import-time": (
        "boom.py", "RATE = 1 / 0\n", "", "reward_fn", "reward function",
        r"boom\.py failed to import: ZeroDivisionError: division by zero",
    ),
    "missing-function-lists-callables": (
        "loader.py",
        "from os.path import join\n\n"
        "LIMIT = 3\n\n"
        "def load_gsm8k(row):\n    return row\n\n"
        "def _private(row):\n    return row\n\n"
        "class Helper:\n    pass\n",
        "", "load_row", "dataset loader",
        r"^dataset loader .*loader\.py has no function 'load_row'\. Callables defined in "
        r"that file: Helper, load_gsm8k\. Name one with 'loader\.py:function'\.$",
    ),
    "no-callables-says-none": (
        "empty.py", "VALUE = 1\n", ":reward", "reward_fn", "reward function",
        r"Callables defined in that file: none\.",
    ),
    "not-callable-names-its-type": (
        "loader.py", "load_row = {'a': 1}\n", "", "load_row", "dataset loader",
        r"^dataset loader .*loader\.py: 'load_row' is of type dict, not a function; "
        r"expected a callable named 'load_row'$",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text", "function", "default_name", "what", "error"),
    BAD_FILES.values(),
    ids=BAD_FILES.keys(),
)
def test_load_function_bad_file_or_function_says_what_is_wrong(
    tmp_path: Path, name: str, text: str | None, function: str, default_name: str, what: str,
    error: str,
) -> None:  # fmt: skip
    path = tmp_path / name
    if text is not None:
        _write(path, text)
    with pytest.raises(UserCodeError, match=error):
        load_function(f"{path}{function}", default_name=default_name, what=what)


def test_load_function_directory_named_py_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "weird.py").mkdir()
    with pytest.raises(UserCodeError, match=r"^agent function .*weird\.py is not a file"):
        load_function(str(tmp_path / "weird.py"), default_name="run_agent", what="agent function")


def test_load_function_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "broken.py", "x = 1\n\ndef load_row(row)\n    return row\n")
    with pytest.raises(
        UserCodeError, match=r"^dataset loader .*broken\.py has a syntax error at line 3: "
    ) as info:
        load_function(str(path), default_name="load_row", what="dataset loader")
    assert isinstance(info.value.__cause__, SyntaxError)
    assert not any(name.startswith("_areno_user_broken_") for name in sys.modules)

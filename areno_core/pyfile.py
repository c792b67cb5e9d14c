"""Load a function from a user's Python file given as ``file.py`` or ``file.py:function``.

This is how ``--dataset-loader-fn``, ``--reward-fn-path`` and ``--agent-fn`` reach user code::

    fn = load_function("examples/math/dataset_loader.py", default_name="load_row",
                       what="dataset loader")
    fn = load_function("rewards.py:exact_match", default_name="reward_fn", what="reward function")

The file is imported by path under a private module name (it does not need to be on
``sys.path`` or inside a package). Its directory is put on ``sys.path`` so the file can import
its sibling modules, as it could when run as a script. Every failure is a
:class:`~areno_core.errors.UserCodeError` that names the file, the function and what was
expected.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from areno_core.errors import ArenoError, ConfigError, UserCodeError
from areno_core.log import get_logger

logger = get_logger(__name__)

_MODULE_PREFIX = "_areno_user_"


def split_spec(spec: str, *, default_name: str) -> tuple[str, str]:
    """Split ``file.py:function`` into ``(file, function)``; a bare file gets ``default_name``.

    Only a colon after the ``.py`` suffix separates the function name, so a path that itself
    contains a colon still works.
    """
    text = spec.strip()
    head, sep, tail = text.rpartition(":")
    if sep and head.endswith(".py") and tail and "/" not in tail and os.sep not in tail:
        return head, tail.strip()
    return text, default_name


def load_function(spec: str, *, default_name: str, what: str) -> Callable[..., Any]:
    """Import the file named in ``spec`` and return the function it names.

    ``spec`` is ``path/to/file.py`` (the function is ``default_name``) or
    ``path/to/file.py:function``. ``what`` describes the function in error messages, for
    example ``"dataset loader"``.
    """
    file_part, name = split_spec(spec, default_name=default_name)
    expected = f"expected a Python file given as 'file.py' or 'file.py:function' (got {spec!r})"
    if not file_part:
        raise UserCodeError(f"{what}: {expected}")
    if not file_part.endswith(".py"):
        raise UserCodeError(f"{what} {file_part!r} is not a .py file; {expected}")
    if not name.isidentifier():
        raise UserCodeError(
            f"{what} {spec!r}: {name!r} is not a valid Python function name; {expected}"
        )
    path = Path(file_part).expanduser()
    if not path.exists():
        raise UserCodeError(
            f"{what} file not found: {path} (looked for function {name!r}; {expected})"
        )
    if not path.is_file():
        raise UserCodeError(f"{what} {path} is not a file; {expected}")
    path = path.resolve()
    module = _import_file(path, what=what)
    if not hasattr(module, name):
        defined = _defined_callables(module)
        listing = ", ".join(defined) if defined else "none"
        raise UserCodeError(
            f"{what} {path} has no function {name!r}. Callables defined in that file: {listing}. "
            f"Name one with '{path.name}:function'."
        )
    obj = getattr(module, name)
    if not callable(obj):
        raise UserCodeError(
            f"{what} {path}: {name!r} is of type {type(obj).__name__}, not a function; "
            f"expected a callable named {name!r}"
        )
    logger.debug("loaded %s %s from %s", what, name, path)
    return obj  # type: ignore[no-any-return]


def resolve_function(
    spec: str,
    *,
    lookup: Callable[[str], Any] | None,
    default_name: str,
    what: str,
) -> Callable[..., Any]:
    """The function a ``--dataset-loader-fn`` / ``--reward-fn-path`` / ``--agent-fn`` value
    names: ``file.py`` or ``file.py:function`` (default ``default_name``), or else a name
    looked up with ``lookup`` (the registry's, which raises a clear error for an unknown name).
    ``what`` ("dataset loader", "reward function", ...) names it in error messages."""
    spec = spec.strip()
    if ".py" in spec:
        return load_function(spec, default_name=default_name, what=what)
    if lookup is None:
        raise ConfigError(
            f"{what} {spec!r} is not a .py file and no {what} registry is available to look "
            "the name up; pass 'file.py' or 'file.py:function'"
        )
    try:
        fn = lookup(spec)
    except ArenoError:
        raise
    except LookupError as exc:
        raise ConfigError(
            f"unknown {what} {spec!r}: no plugin registered one by that name. Pass a "
            "registered name or a 'file.py[:function]' path"
        ) from exc
    if not callable(fn):
        raise UserCodeError(
            f"{what} {spec!r} from the registry is of type {type(fn).__name__}, not a function"
        )
    return fn  # type: ignore[no-any-return]


def _module_name(path: Path) -> str:
    """A module name unique to this file and its current contents (size and mtime)."""
    stat = path.stat()
    key = f"{path}\0{stat.st_mtime_ns}\0{stat.st_size}".encode()
    stem = "".join(ch if ch.isalnum() else "_" for ch in path.stem)
    return f"{_MODULE_PREFIX}{stem}_{hashlib.sha1(key).hexdigest()[:12]}"


def _import_file(path: Path, *, what: str) -> ModuleType:
    name = _module_name(path)
    cached = sys.modules.get(name)
    if cached is not None:
        return cached
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{what} {path} could not be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        where = f"line {exc.lineno}" if exc.lineno else "unknown line"
        raise UserCodeError(
            f"{what} {path} has a syntax error at {where}: {exc.msg}; fix the file and rerun"
        ) from exc
    except (Exception, SystemExit) as exc:
        del sys.modules[name]
        raise UserCodeError(
            f"{what} {path} failed to import: {type(exc).__name__}: {exc}; the file runs at "
            "import time, so every module it imports must be installed"
        ) from exc
    return module


def _defined_callables(module: ModuleType) -> list[str]:
    """Public functions and classes written in ``module`` itself (not imported into it)."""
    names = []
    for attr, value in vars(module).items():
        if attr.startswith("_") or not callable(value):
            continue
        if (inspect.isfunction(value) or inspect.isclass(value)) and getattr(
            value, "__module__", None
        ) != module.__name__:
            continue
        names.append(attr)
    return sorted(names)


__all__ = ["load_function", "split_spec"]

"""Dataset loaders: turn raw rows into the rows an algorithm trains on.

The loader contract
-------------------

A loader is a plain (not ``async``) function of one argument::

    def load_row(row: dict) -> dict | list[dict] | None:
        ...

It is called once per raw row, in dataset order, and returns

* a dict: the normalised row (for example ``{"prompt": ..., "answer": ...}`` for RL);
* a list of dicts: several rows made from this one (in order; an empty list drops it);
* ``None``: drop the row.

A loader comes from ``--dataset-loader-fn``, either as a file (``loader.py`` uses its
``load_row`` function, ``loader.py:my_loader`` names another) or as the name of a loader a
plugin registered. Without a loader the raw rows are used unchanged. What keys the result must
have depends on the algorithm: see :mod:`areno_core.data.schema`.

A loader that also takes a keyword ``env_args`` (``def load_row(row, *, env_args=None)``)
receives the run's ``--env-args`` (a dict: options of the environment library behind it, such
as a task's settings) with every row; it checks them itself. ``--env-args`` with a loader that
takes no such keyword is an error.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from areno_core.errors import ConfigError, DatasetError, UserCodeError
from areno_core.log import get_logger
from areno_core.pyfile import resolve_function

logger = get_logger(__name__)

DEFAULT_LOADER_NAME = "load_row"

Loader = Callable[[dict[str, Any]], "dict[str, Any] | list[dict[str, Any]] | None"]


def resolve_loader(
    spec: str | None, registry_lookup: Callable[[str], Callable[..., Any]] | None
) -> Callable[..., Any] | None:
    """Turn a ``--dataset-loader-fn`` value into a loader function, or None when unset.

    A spec containing ``.py`` is a file (``file.py`` or ``file.py:function``; the default
    function is ``load_row``). Anything else is the name of a registered loader, looked up with
    ``registry_lookup``, which should raise a clear :class:`ArenoError` for an unknown name.
    """
    if spec is None or not spec.strip():
        return None
    loader = resolve_function(
        spec, lookup=registry_lookup, default_name=DEFAULT_LOADER_NAME, what="dataset loader"
    )
    check_loader(loader)
    return loader


def check_loader(loader: Callable[..., Any]) -> None:
    """Raise :class:`UserCodeError` unless ``loader`` is a sync function callable as f(row)."""
    name = describe_loader(loader)
    if inspect.iscoroutinefunction(loader) or inspect.isasyncgenfunction(loader):
        raise UserCodeError(
            f"dataset loader {name} is async; a loader must be a plain function "
            "'def load_row(row: dict) -> dict | list[dict] | None'"
        )
    try:
        signature = inspect.signature(loader)
    except (TypeError, ValueError):
        return  # builtins and some C callables have no signature; trust them
    try:
        signature.bind({})
    except TypeError as exc:
        raise UserCodeError(
            f"dataset loader {name} has signature {signature}, but it is called with one "
            f"argument (the raw row dict): {exc}"
        ) from exc


def parse_env_args(text: str | None) -> dict[str, Any] | None:
    """The ``--env-args`` JSON object as a dict (None when unset); an error names a bad value."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-args expects a JSON object, got {text!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"--env-args expects a JSON object, got {text!r}")
    return value


def takes_env_args(loader: Callable[..., Any]) -> bool:
    """Whether ``loader`` accepts the keyword ``env_args``."""
    try:
        params = inspect.signature(loader).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "env_args" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in params
    )


def apply_loader(
    rows: Sequence[Mapping[str, Any]],
    loader: Callable[..., Any],
    *,
    env_args: Mapping[str, Any] | None = None,
) -> list[dict]:
    """Run ``loader`` on every row and collect what it returns (see the module docstring);
    ``env_args`` (the run's ``--env-args``) go to a loader that takes them."""
    name = describe_loader(loader)
    extra: dict[str, Any] = {}
    if env_args is not None:
        if not takes_env_args(loader):
            raise ConfigError(
                f"--env-args {json.dumps(dict(env_args))}: the dataset loader {name} takes no "
                "env_args keyword, so it has no environment options to set"
            )
        extra["env_args"] = dict(env_args)
    out: list[dict[str, Any]] = []
    dropped = 0
    for index, row in enumerate(rows):
        try:
            result = loader(row, **extra)
        except Exception as exc:
            raise DatasetError(
                f"dataset loader {name} failed on row {index}: {type(exc).__name__}: {exc}"
            ) from exc
        if result is None:
            dropped += 1
        elif isinstance(result, Mapping):
            out.append(dict(result))
        elif isinstance(result, list | tuple):
            if not result:
                dropped += 1
            for position, item in enumerate(result):
                if not isinstance(item, Mapping):
                    raise DatasetError(
                        f"dataset loader {name} returned a list for row {index} whose item "
                        f"{position} is {type(item).__name__}; every item must be a dict"
                    )
                out.append(dict(item))
        else:
            raise DatasetError(
                f"dataset loader {name} returned {type(result).__name__} for row {index}; "
                "a loader must return a dict, a list of dicts, or None to drop the row"
            )
    if not out:
        raise DatasetError(
            f"dataset loader {name} dropped all {len(rows)} rows; the dataset would be empty"
        )
    logger.info(
        "dataset loader %s: %d raw rows -> %d rows (%d dropped)", name, len(rows), len(out), dropped
    )
    return out


def describe_loader(loader: Callable[..., Any]) -> str:
    """A short name for error messages: ``function`` or ``function (file.py)``."""
    name = getattr(loader, "__qualname__", None) or getattr(loader, "__name__", None)
    if name is None:
        name = type(loader).__name__
    try:
        source = inspect.getsourcefile(loader)
    except TypeError:
        source = None
    return f"'{name}' ({source})" if source else f"'{name}'"


__all__ = [
    "DEFAULT_LOADER_NAME",
    "Loader",
    "apply_loader",
    "check_loader",
    "describe_loader",
    "parse_env_args",
    "resolve_loader",
]

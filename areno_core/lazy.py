"""Packages that hand out their names lazily (PEP 562).

A package whose ``__init__`` re-exports names from heavy modules (the model stack, the agent
endpoint) would load them for anyone importing any of its light modules. With
:func:`lazy_attributes` the package imports a name's module when the name is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``: ``homes`` maps each name to the module
    that defines it."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return __getattr__


__all__ = ["lazy_attributes"]

"""The checks every spec row of this pack starts with, whatever the library it adapts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from areno_core.errors import ConfigError, did_you_mean


def check_row_keys(row: Any, keys: Sequence[str], library: str) -> None:
    """Check that ``row`` is an object whose keys are all in ``keys``; a ConfigError naming
    ``library`` (e.g. ``"verifiers"``) and the first unknown key otherwise."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"a {library} spec row must be an object, got {row!r:.80}")
    unknown = [k for k in row if k not in keys]
    if unknown:
        raise ConfigError(
            f"{library} spec row: unknown key {unknown[0]!r}."
            f"{did_you_mean(str(unknown[0]), keys)} Keys: {', '.join(keys)}"
        )

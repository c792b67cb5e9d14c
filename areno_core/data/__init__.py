"""The dataset layer: read raw rows, apply a loader, check rows against an algorithm's schema.

A run goes through three steps::

    from areno_core.data import apply_loader, load_rows, resolve_loader, validate_rows

    rows = load_rows("gsm8k:main")                        # or a local file or directory
    loader = resolve_loader("loader.py", registry_lookup)  # None when no loader is given
    if loader is not None:
        rows = apply_loader(rows, loader)
    validate_rows(rows, spec.row_schema, algo=spec.name)

See ``docs/datasets.md`` for the accepted formats and the loader contract.
"""

from __future__ import annotations

from areno_core.data.loaders import apply_loader, check_loader, parse_env_args, resolve_loader
from areno_core.data.schema import (
    AGENTIC_SCHEMA,
    DPO_SCHEMA,
    RL_SCHEMA,
    SFT_SCHEMA,
    is_chat_preference_row,
    split_chat_preference,
    split_preference_rows,
    validate_rows,
)
from areno_core.data.sources import load_rows

__all__ = [
    "AGENTIC_SCHEMA",
    "DPO_SCHEMA",
    "RL_SCHEMA",
    "SFT_SCHEMA",
    "apply_loader",
    "check_loader",
    "is_chat_preference_row",
    "load_rows",
    "parse_env_args",
    "resolve_loader",
    "split_chat_preference",
    "split_preference_rows",
    "validate_rows",
]

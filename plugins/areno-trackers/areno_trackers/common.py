"""What the tracker sinks share: checking that a library imports."""

from __future__ import annotations

import importlib.util


def missing(module: str, extra: str) -> str | None:
    """Why ``module`` cannot be used (with the install command), or None when it imports."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed: pip install 'areno-trackers[{extra}]'"
    return None

"""Errors a user can fix. The CLI prints their message without a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


class ArenoError(Exception):
    """Base class for every error caused by user input or environment, not by a bug."""


class ConfigError(ArenoError, ValueError):
    """A run option or config file value is invalid."""


class NotAvailableError(ArenoError):
    """A flag or capability exists in the CLI but is not available in this build or machine."""


class PluginError(ArenoError):
    """A plugin registered something invalid, or two plugins registered the same name."""


class DatasetError(ArenoError, ValueError):
    """A dataset could not be loaded or a row does not match the algorithm's schema."""


class UserCodeError(ArenoError):
    """A user-supplied Python file (loader, reward, agent) could not be loaded."""


def did_you_mean(
    name: str,
    candidates: Iterable[str],
    *,
    n: int = 3,
    cutoff: float = 0.6,
    render: Callable[[str], str] = repr,
) -> str:
    """`` Did you mean 'a', 'b'?`` for the candidates close to ``name``, else ``""``.

    The one place error messages get their suggestions, so every "unknown X" reads alike.
    """

    close = difflib.get_close_matches(name, list(candidates), n=n, cutoff=cutoff)
    return f" Did you mean {', '.join(render(c) for c in close)}?" if close else ""

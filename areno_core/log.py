"""The project's logger helper. Library code logs through this; only the CLI prints."""

from __future__ import annotations

import logging

_ROOT = "areno"


def get_logger(name: str) -> logging.Logger:
    """Return a logger under the ``areno`` namespace (``areno_core.x`` -> ``areno.x``)."""
    if name.startswith("areno_core."):
        name = name[len("areno_core.") :]
    elif name == "areno_core":
        name = ""
    return logging.getLogger(f"{_ROOT}.{name}" if name else _ROOT)


def warn_once(
    logger: logging.Logger, key: str, message: str, *args: object, level: int = logging.WARNING
) -> None:
    """Log a warning (or a message of another ``level``) once per process for ``key``."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    logger.log(level, message, *args)


def warned(key: str) -> bool:
    """Whether :func:`warn_once` has already logged ``key`` in this process."""
    return key in _WARNED


_WARNED: set[str] = set()

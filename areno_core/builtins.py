"""What areno-core registers itself, through the same hooks as any plugin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_core.hookspecs import hookimpl


@hookimpl
def register_rollout_engines(register: Callable[[Any], None]) -> None:
    from areno_core.rollout.native import NATIVE_ENGINE

    register(NATIVE_ENGINE)


@hookimpl
def register_backends(register: Callable[[Any], None]) -> None:
    from areno_core.train.local import LOCAL_BACKEND

    register(LOCAL_BACKEND)

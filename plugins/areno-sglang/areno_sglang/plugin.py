"""Entry point of the ``areno-sglang`` plugin: registers the ``sglang`` rollout engine.

Declared in this package's ``pyproject.toml`` as ``[project.entry-points.areno] sglang``.
Importing it needs neither sglang nor a GPU; the engine checks what its mode needs before the
run loads a model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_core.contracts.engine import EngineSpec
from areno_core.hookspecs import hookimpl
from areno_sglang.config import SGLangEngineConfig, unavailable_reason
from areno_sglang.engine import create_sglang_engine

SGLANG_ENGINE = EngineSpec(
    name="sglang",
    summary="Samples on SGLang servers: one started on the training GPU (colocated) or yours "
    "(--sglang-url); weights pushed after every step and their version checked.",
    factory=create_sglang_engine,
    config_cls=SGLangEngineConfig,
    check=unavailable_reason,
)


@hookimpl
def register_rollout_engines(register: Callable[[Any], None]) -> None:
    """Register the ``sglang`` engine."""
    register(SGLANG_ENGINE)

"""Entry point of the ``areno-algos`` plugin: registers the six built-in algorithms.

Declared in this package's ``pyproject.toml`` as ``[project.entry-points.areno] algos``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_algos import dpo, grpo, gspo, ppo, rloo, sft
from areno_core.algorithm import AlgorithmSpec
from areno_core.hookspecs import hookimpl

ALGORITHMS: tuple[AlgorithmSpec, ...] = (
    sft.SPEC,
    dpo.SPEC,
    grpo.SPEC,
    gspo.SPEC,
    rloo.SPEC,
    ppo.SPEC,
)


@hookimpl
def register_algorithms(register: Callable[[Any], None]) -> None:
    """Register sft, dpo, grpo, gspo, rloo and ppo."""
    for spec in ALGORITHMS:
        register(spec)

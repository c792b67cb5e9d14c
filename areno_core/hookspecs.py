"""Hook specifications: the whole surface a plugin implements.

Each hook receives a ``register`` callback; call it once per thing the plugin provides.
The core validates every registration (names, types, duplicates).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "areno"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_algorithms(register: Callable[[Any], None]) -> None:
    """Register training algorithms: ``register(spec: AlgorithmSpec)``."""


@hookspec
def register_dataset_loaders(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register dataset loaders: ``register(name, loader_fn)``."""


@hookspec
def register_rewards(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register reward functions: ``register(name, reward_fn)``."""


@hookspec
def register_agents(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register agent functions: ``register(name, run_agent)``."""


@hookspec
def register_recipes(register: Callable[[Any], None]) -> None:
    """Register recipes: ``register(recipe: Recipe)``."""


@hookspec
def register_rollout_engines(register: Callable[[Any], None]) -> None:
    """Register rollout engines: ``register(spec: EngineSpec)``."""


@hookspec
def register_backends(register: Callable[[Any], None]) -> None:
    """Register training backends: ``register(spec: BackendSpec)``."""


@hookspec
def register_metric_sinks(register: Callable[[Any], None]) -> None:
    """Register metric sinks for ``--report-to``: ``register(spec: SinkSpec)``."""


@hookspec
def register_evaluators(register: Callable[[Any], None]) -> None:
    """Register how ``areno eval`` scores a recipe: ``register(spec: EvaluatorSpec)``."""

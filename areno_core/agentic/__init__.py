"""Agentic rollout: an OpenAI-compatible endpoint, the ``run_agent`` contract, and turning
multi-turn trajectories into token rows with loss masks (see docs/agentic.md).

Only the contract types are imported eagerly, so agent and plugin modules that import them stay
light; the server, trajectory and collection helpers load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentFailure,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)

_LAZY = {
    "AgentError": "areno_core.agentic.collect",
    "collect_agentic_groups": "areno_core.agentic.collect",
    "resolve_agent_fn": "areno_core.agentic.collect",
    "AgentServer": "areno_core.agentic.server",
    "ServedChoice": "areno_core.agentic.records",
    "ServedCompletion": "areno_core.agentic.records",
    "build_trajectory": "areno_core.agentic.trajectory",
    "trajectory_record": "areno_core.agentic.trajectory",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'areno_core.agentic' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AgentBatch",
    "AgentContext",
    "AgentError",
    "AgentFailure",
    "AgentItem",
    "AgentServer",
    "AgentTrajectory",
    "AgentTrajectoryTurn",
    "ServedChoice",
    "ServedCompletion",
    "build_trajectory",
    "collect_agentic_groups",
    "resolve_agent_fn",
    "trajectory_record",
]

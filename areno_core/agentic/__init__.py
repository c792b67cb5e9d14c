"""Agentic rollout: an OpenAI-compatible endpoint, the ``run_agent`` contract, and turning
multi-turn trajectories into token rows with loss masks (see docs/agentic.md).

Only the contract types are imported eagerly, so agent and plugin modules that import them stay
light; the server, trajectory and collection helpers load on first use.
"""

from __future__ import annotations

from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentFailure,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)
from areno_core.lazy import lazy_attributes

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


__getattr__ = lazy_attributes(__name__, _LAZY)


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

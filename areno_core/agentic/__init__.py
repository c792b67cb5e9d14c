"""Agentic rollout: an OpenAI-compatible endpoint, the ``run_agent`` contract, and turning
multi-turn trajectories into token rows with loss masks."""

from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)

__all__ = ["AgentBatch", "AgentContext", "AgentItem", "AgentTrajectory", "AgentTrajectoryTurn"]

"""The OpenAI tool the model calls to play its DuelGrid turn."""

from __future__ import annotations

from typing import Any

from areno_recipes_agentic.duelgrid.rules import ACTION_TYPES, DIRECTIONS
from areno_recipes_agentic.toolcalls import function_tool

TOOL_NAME = "choose_action"

_DESCRIPTION = (
    "Play your whole DuelGrid turn: a list of actions applied in order while your "
    "energy lasts. The first action that cannot be done is rejected and ends the turn."
)
_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "actions": {
            "type": "array",
            "description": "Your actions for this turn, in order.",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": list(ACTION_TYPES)},
                    "direction": {
                        "type": "string",
                        "enum": list(DIRECTIONS),
                        "description": "Only for MOVE: the direction to step.",
                    },
                },
                "required": ["type"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["actions"],
    "additionalProperties": False,
}


def choose_action_tool() -> dict[str, Any]:
    """A fresh copy of the ``choose_action`` tool schema (safe to modify)."""
    return function_tool(TOOL_NAME, _PARAMETERS, _DESCRIPTION)


__all__ = ["TOOL_NAME", "choose_action_tool"]

"""The OpenAI tool the model calls to make its tic-tac-toe move."""

from __future__ import annotations

from typing import Any

from areno_recipes_agentic.toolcalls import function_tool

TOOL_NAME = "choose_square"

_DESCRIPTION = (
    "Place your mark on one free square of the tic-tac-toe board. Squares are numbered "
    "1 to 9, left to right and top to bottom."
)
_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "square": {
            "type": "integer",
            "minimum": 1,
            "maximum": 9,
            "description": "The number of the free square to mark.",
        }
    },
    "required": ["square"],
    "additionalProperties": False,
}
# The same tool without descriptions or bounds: the schema the chat template writes into every
# prompt is a third as long, which matters for the byte-level CPU model (one token per byte).
_PARAMETERS_COMPACT: dict[str, Any] = {
    "type": "object",
    "properties": {"square": {"type": "integer"}},
    "required": ["square"],
}


def choose_square_tool(*, compact: bool = False) -> dict[str, Any]:
    """A fresh copy of the ``choose_square`` tool schema (safe to modify); ``compact`` drops
    the descriptions and bounds (the prompts of the CPU recipes)."""
    if compact:
        return function_tool(TOOL_NAME, _PARAMETERS_COMPACT)
    return function_tool(TOOL_NAME, _PARAMETERS, _DESCRIPTION)


__all__ = ["TOOL_NAME", "choose_square_tool"]

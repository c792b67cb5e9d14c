"""The OpenAI tool the model calls to make its tic-tac-toe move."""

from __future__ import annotations

import copy
from typing import Any

TOOL_NAME = "choose_square"

_CHOOSE_SQUARE: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Place your mark on one free square of the tic-tac-toe board. Squares are numbered "
            "1 to 9, left to right and top to bottom."
        ),
        "parameters": {
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
        },
    },
}


# The same tool without descriptions or bounds: the schema the chat template writes into every
# prompt is a third as long, which matters for the byte-level CPU model (one token per byte).
_CHOOSE_SQUARE_COMPACT: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "parameters": {
            "type": "object",
            "properties": {"square": {"type": "integer"}},
            "required": ["square"],
        },
    },
}


def choose_square_tool(*, compact: bool = False) -> dict[str, Any]:
    """A fresh copy of the ``choose_square`` tool schema (safe to modify); ``compact`` drops
    the descriptions and bounds (the prompts of the CPU recipes)."""
    return copy.deepcopy(_CHOOSE_SQUARE_COMPACT if compact else _CHOOSE_SQUARE)


__all__ = ["TOOL_NAME", "choose_square_tool"]

"""Tic-tac-toe reward: the model's move scored against the perfect player.

Where the move comes from:

* ``mode: "tool"`` (the default): the ``square`` argument of the first ``choose_square`` tool
  call (arguments as a JSON string or a dict; ``5``, ``5.0`` and ``"5"`` all mean square 5). A
  reply without such a call scores 0, even if its text names a square.
* ``mode: "text"``: the last ``<move>N</move>`` in the completion, after removing
  ``<think>...</think>`` blocks.

The scale, relative to what perfect play can get from the position (its minimax value ``v``
for the player to move, and the value ``m`` the chosen move leads to):

=====  ===============================================================================
score  the move
=====  ===============================================================================
1.0    optimal: keeps ``v`` and wins fastest / loses slowest (an immediate win if any)
0.6    keeps ``v`` but more slowly than the optimal moves (``m == v``)
0.3    gives up some value without losing: a winnable game drawn (``0 <= m < v``)
0.1    a legal move into a forced loss that was avoidable (``m == -1 < v``)
0.0    illegal (occupied or off the board), missing, or unreadable
=====  ===============================================================================

A multi-turn record (two or more assistant messages, as the ``tictactoe`` agent produces when
a row allows ``retries``) is read message by message: the first message whose move is legal
is scored, times ``RETRY_FACTOR`` (0.5) for each failed attempt before it, so a model that
needs the error message to find a legal square earns less than one that gets it right first.

The reward never raises: anything it cannot read scores 0.0.
"""

from __future__ import annotations

import re
from typing import Any

from areno_recipes_agentic.tictactoe.game import board_problem, is_terminal, solve
from areno_recipes_agentic.tictactoe.tools import TOOL_NAME
from areno_recipes_agentic.toolcalls import (
    AssistantTurn,
    answer_text,
    as_int,
    assistant_turns,
    first_call_arguments,
    first_named_call,
    record_row,
)

OPTIMAL = 1.0
VALUE_KEEPING = 0.6
NON_LOSING = 0.3
LOSING = 0.1
INVALID = 0.0
RETRY_FACTOR = 0.5

_MOVE_TAG = re.compile(r"<move>\s*([^<]{0,16}?)\s*</move>", re.I)


def move_from_tool_calls(record: Any) -> int | None:
    """The square of the first ``choose_square`` call of ``record``, or None."""
    found, arguments = first_call_arguments(record, TOOL_NAME)
    if not found or not isinstance(arguments, dict):
        return None
    return as_int(arguments.get("square"))


def move_from_turn(turn: AssistantTurn, mode: str = "tool") -> int | None:
    """The square one assistant message chose: its first ``choose_square`` call (tool mode) or
    its last ``<move>N</move>`` (text mode); None when there is none or it is unreadable."""
    if mode == "text":
        return move_from_text(turn.text)
    found, arguments = first_named_call(turn.tool_calls, TOOL_NAME)
    if not found or not isinstance(arguments, dict):
        return None
    return as_int(arguments.get("square"))


def move_from_text(text: str) -> int | None:
    """The square in the last ``<move>N</move>`` of ``text``, or None."""
    matches = _MOVE_TAG.findall(text)
    return as_int(matches[-1]) if matches else None


def score_move(board: str, square: int | None) -> float:
    """Score ``square`` on ``board`` for the player to move (see the module docstring)."""
    if square is None or board_problem(board) is not None or is_terminal(board):
        return INVALID
    solution = solve(board)
    move_value = solution.move_values.get(square)
    if move_value is None:
        return INVALID
    if square in solution.optimal_moves:
        return OPTIMAL
    if move_value == solution.value:
        return VALUE_KEEPING
    if move_value >= 0:
        return NON_LOSING
    return LOSING


def tictactoe_reward_fn(record: Any) -> float:
    """Score one sample of a tic-tac-toe row (``record.row`` holds ``board`` and ``mode``)."""
    try:
        row = record_row(record)
        board = row.get("board")
        if not isinstance(board, str):
            return INVALID
        mode = row.get("mode", "tool")
        turns = assistant_turns(record)
        if turns is not None:
            for attempt, turn in enumerate(turns):
                score = score_move(board, move_from_turn(turn, mode))
                if score > INVALID:
                    return score * RETRY_FACTOR**attempt
            return INVALID
        if mode == "text":
            square = move_from_text(answer_text(record))
        else:
            square = move_from_tool_calls(record)
        return score_move(board, square)
    except Exception:  # a reward must not take a run down over one odd sample
        return INVALID


__all__ = [
    "INVALID",
    "LOSING",
    "NON_LOSING",
    "OPTIMAL",
    "RETRY_FACTOR",
    "VALUE_KEEPING",
    "move_from_text",
    "move_from_tool_calls",
    "move_from_turn",
    "score_move",
    "tictactoe_reward_fn",
]

"""Dataset loader for tic-tac-toe rows: turns a position into a chat prompt.

Input row: ``board`` (required, 9 characters of X/O/.), and optionally ``player``, ``mode``
(``"tool"``, the default, or ``"text"``), ``style`` (``"full"``, the default, or
``"compact"``), ``legal_moves``, ``optimal_moves``, ``value`` and any other fields (``id``...).
Optional solved fields are recomputed and must agree when present. ``tool_choice``
(``"auto"``, ``"required"`` or ``"choose_square"``) is passed on to the agent, which sends it
with the request (tool mode only).

Output row: every input field, plus ``prompt`` (chat messages), ``player``, ``mode``,
``style``, ``legal_moves``, ``optimal_moves``, ``value``, ``solutions`` (the optimal squares as
strings) and, in tool mode, ``tools`` (the ``choose_square`` schema).

Styles: ``full`` explains the rules in a system message and draws the board as a grid with
separators (about 1,400 byte-level tokens with the tool schema); ``compact`` is one short
user message with the board as three lines of three characters (free squares show their
number) and the tool schema without descriptions (about 490 byte-level tokens), for the
small CPU model of ``agentic/tictactoe-cpu``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from areno_core.errors import DatasetError
from areno_recipes_agentic.tictactoe.game import board_problem, is_terminal, solve, to_move
from areno_recipes_agentic.tictactoe.tools import TOOL_NAME, choose_square_tool

MODES = ("tool", "text")
STYLES = ("full", "compact")
TOOL_CHOICES = ("auto", "required", TOOL_NAME)

RULES = (
    "You are playing tic-tac-toe. Two players take turns marking free squares of a 3x3 grid, "
    "X first and then O. A player who gets three of their marks in a row, a column or a "
    "diagonal wins. If all nine squares fill up with no such line, the game is a draw.\n\n"
    "Squares are numbered 1 to 9, left to right and top to bottom:\n"
    "{numbers}\n\n"
    "Play the strongest move: win now if you can, block your opponent's winning square, and "
    "otherwise keep the best result you can force."
)
TOOL_INSTRUCTION = (
    "Call the `{tool}` tool once with the number of the square you choose, for example "
    '{{"square": 5}}.'
)
TEXT_INSTRUCTION = (
    "You may think briefly, then end your reply with your move as <move>N</move>, where N is "
    "the number of the square you choose, for example <move>5</move>."
)


def render_board(board: str) -> str:
    """The board as a 3x3 grid; free squares show their number."""
    cells = [mark if mark != "." else str(i + 1) for i, mark in enumerate(board)]
    rows = [" " + " | ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
    return "\n---+---+---\n".join(rows)


def compact_board(board: str) -> str:
    """The board as three lines of three characters; free squares show their number."""
    cells = "".join(mark if mark != "." else str(i + 1) for i, mark in enumerate(board))
    return "\n".join(cells[r * 3 : r * 3 + 3] for r in range(3))


def tictactoe_prompt(
    board: str, player: str, mode: str = "tool", style: str = "full"
) -> list[dict[str, str]]:
    """The chat messages that ask the model for its move on ``board`` as ``player``."""
    if style == "compact":
        ask = f"Call {TOOL_NAME}." if mode == "tool" else "Answer <move>N</move>."
        return [{"role": "user", "content": f"You play {player}.\n{compact_board(board)}\n{ask}"}]
    opponent = "O" if player == "X" else "X"
    instruction = TOOL_INSTRUCTION.format(tool=TOOL_NAME) if mode == "tool" else TEXT_INSTRUCTION
    user = (
        f"You play {player}; your opponent plays {opponent}. Free squares show their number.\n\n"
        f"{render_board(board)}\n\n"
        f"It is your turn ({player}). {instruction}"
    )
    return [
        {"role": "system", "content": RULES.format(numbers=render_board("." * 9))},
        {"role": "user", "content": user},
    ]


def tictactoe_loader(row: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a tic-tac-toe row into a prompt row; DatasetError for a bad or finished position."""
    if not isinstance(row, Mapping):
        raise DatasetError(f"a tic-tac-toe row must be a dict, got {type(row).__name__}")
    board = row.get("board")
    problem = board_problem(board)
    if problem is not None:
        raise DatasetError(f"tic-tac-toe row {row.get('id', '?')}: bad 'board': {problem}")
    assert isinstance(board, str)
    if is_terminal(board):
        raise DatasetError(f"tic-tac-toe row {row.get('id', '?')}: the game on {board!r} is over")
    player = to_move(board)
    mode = row.get("mode") or "tool"
    if mode not in MODES:
        raise DatasetError(f"tic-tac-toe row {row.get('id', '?')}: 'mode' must be one of {MODES}")
    choice = row.get("tool_choice")
    if choice is not None and choice not in TOOL_CHOICES:
        raise DatasetError(
            f"tic-tac-toe row {row.get('id', '?')}: 'tool_choice' must be one of "
            f"{TOOL_CHOICES}, got {choice!r}"
        )
    style = row.get("style") or "full"
    if style not in STYLES:
        raise DatasetError(
            f"tic-tac-toe row {row.get('id', '?')}: 'style' must be one of {STYLES}, got {style!r}"
        )
    solution = solve(board)
    solved: dict[str, Any] = {
        "player": player,
        "legal_moves": sorted(solution.move_values),
        "optimal_moves": list(solution.optimal_moves),
        "value": solution.value,
    }
    for key, expected in solved.items():
        given = row.get(key)
        if given is not None and _normal(given) != _normal(expected):
            raise DatasetError(
                f"tic-tac-toe row {row.get('id', '?')}: {key!r} is {given!r} but the board "
                f"{board!r} gives {expected!r}"
            )
    out = dict(row)
    out.update(solved)
    out["mode"] = mode
    out["style"] = style
    out["prompt"] = tictactoe_prompt(board, player, mode, style)
    out["solutions"] = [str(m) for m in solution.optimal_moves]
    if mode == "tool":
        out["tools"] = [choose_square_tool(compact=style == "compact")]
    else:
        out.pop("tools", None)
    return out


def sft_target(row: Mapping[str, Any]) -> int:
    """The square an SFT row teaches: one of the optimal moves, picked by a fixed function of
    the board (so the same board always gets the same answer, whichever file it is in)."""
    board = str(row["board"])
    optimal = sorted(solve(board).optimal_moves)
    return optimal[int(hashlib.sha256(board.encode()).hexdigest(), 16) % len(optimal)]


def tictactoe_sft_loader(row: Mapping[str, Any]) -> dict[str, Any]:
    """A tic-tac-toe position as an SFT row: the prompt of :func:`tictactoe_loader` and, as
    ``response``, the assistant message that plays :func:`sft_target` (a ``choose_square`` call
    in tool mode, ``<move>N</move>`` in text mode). Made for the warm start of
    ``agentic/tictactoe-cpu`` (see ``agentic/tictactoe-cpu-sft``)."""
    out = tictactoe_loader(row)
    square = sft_target(out)
    if out["mode"] == "tool":
        arguments = {"square": square}
        call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}
        out["response"] = [{"role": "assistant", "content": "", "tool_calls": [call]}]
    else:
        out["response"] = [{"role": "assistant", "content": f"<move>{square}</move>"}]
    return out


def _normal(value: Any) -> Any:
    return sorted(value) if isinstance(value, list | tuple) else value


__all__ = [
    "MODES",
    "STYLES",
    "compact_board",
    "render_board",
    "sft_target",
    "tictactoe_loader",
    "tictactoe_prompt",
    "tictactoe_sft_loader",
]

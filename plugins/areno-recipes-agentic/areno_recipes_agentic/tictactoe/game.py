"""Tic-tac-toe rules and a perfect player.

A board is a 9-character string of ``"X"``, ``"O"`` and ``"."`` (empty), read row by row.
Squares are numbered 1 to 9 in the same order::

    1 | 2 | 3
    4 | 5 | 6
    7 | 8 | 9

X always moves first, so the player to move follows from the counts of marks.

The perfect player (:func:`solve`) is a memoised minimax search. Besides the game-theoretic
value (1 win, 0 draw, -1 loss for the player to move) it ranks moves by how soon they win (or
how late they lose), so when a win is available right now only the winning squares count as
optimal.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import attrs

EMPTY = "."
PLAYERS = ("X", "O")
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2),
    (3, 4, 5),
    (6, 7, 8),
    (0, 3, 6),
    (1, 4, 7),
    (2, 5, 8),
    (0, 4, 8),
    (2, 4, 6),
)
EMPTY_BOARD = EMPTY * 9


def board_problem(board: object) -> str | None:
    """Why ``board`` is not a position reachable in a real game, or None when it is."""
    if not isinstance(board, str):
        return f"a board must be a string, got {type(board).__name__}"
    if len(board) != 9:
        return f"a board has 9 squares, got {len(board)} characters"
    bad = sorted(set(board) - {"X", "O", EMPTY})
    if bad:
        return f"a board holds only 'X', 'O' and '.', found {bad}"
    xs, os_ = board.count("X"), board.count("O")
    if xs - os_ not in (0, 1):
        return f"X moves first, so X has as many marks as O or one more; got X={xs}, O={os_}"
    x_won, o_won = _has_line(board, "X"), _has_line(board, "O")
    if x_won and o_won:
        return "both players have three in a row"
    if x_won and xs != os_ + 1:
        return "X has three in a row, so X moved last, but O has as many marks as X"
    if o_won and xs != os_:
        return "O has three in a row, so O moved last, but X has more marks than O"
    return None


def is_valid_board(board: object) -> bool:
    """Whether ``board`` is a well-formed, reachable position."""
    return board_problem(board) is None


def to_move(board: str) -> str:
    """The player whose turn it is on ``board`` (ignores whether the game is over)."""
    return "X" if board.count("X") == board.count("O") else "O"


def winner(board: str) -> str | None:
    """``"X"`` or ``"O"`` when that player has three in a row, else None."""
    for player in PLAYERS:
        if _has_line(board, player):
            return player
    return None


def is_draw(board: str) -> bool:
    """The board is full and nobody has three in a row."""
    return EMPTY not in board and winner(board) is None


def is_terminal(board: str) -> bool:
    """The game is over: somebody won or the board is full."""
    return winner(board) is not None or EMPTY not in board


def legal_moves(board: str) -> list[int]:
    """The free squares (1-9) when the game is still on, else ``[]``."""
    if is_terminal(board):
        return []
    return [i + 1 for i, cell in enumerate(board) if cell == EMPTY]


def play(board: str, square: int) -> str:
    """The board after the player to move marks ``square``; ValueError when it is illegal."""
    if square not in legal_moves(board):
        raise ValueError(f"square {square} is not a legal move on board {board!r}")
    i = square - 1
    return board[:i] + to_move(board) + board[i + 1 :]


@attrs.frozen
class Solution:
    """What perfect play says about a position, from the point of view of the player to move.

    ``value`` is 1 (forced win), 0 (draw) or -1 (forced loss). ``move_values`` maps each legal
    square to the value the mover gets by playing it. ``optimal_moves`` are the squares that
    keep ``value`` and, among those, win fastest or lose slowest.
    """

    value: int
    optimal_moves: tuple[int, ...]
    move_values: Mapping[int, int]


def solve(board: str) -> Solution:
    """Solve ``board`` with memoised minimax; ValueError when the board is not reachable."""
    problem = board_problem(board)
    if problem is not None:
        raise ValueError(f"invalid tic-tac-toe board {board!r}: {problem}")
    return _solve(board)


@functools.cache
def _solve(board: str) -> Solution:
    moves = legal_moves(board)
    if not moves:
        return Solution(value=_sign(_score(board)), optimal_moves=(), move_values={})
    scores = {m: -_score(play(board, m)) for m in moves}
    best = max(scores.values())
    return Solution(
        value=_sign(best),
        optimal_moves=tuple(m for m in moves if scores[m] == best),
        move_values={m: _sign(s) for m, s in scores.items()},
    )


@functools.cache
def _score(board: str) -> int:
    """Depth-aware minimax score for the player to move.

    A lost terminal position scores ``-(free squares + 1)``, so a sooner win scores higher
    than a later one; a draw scores 0.
    """
    if winner(board) is not None:
        return -(board.count(EMPTY) + 1)  # the previous mover made the line
    if EMPTY not in board:
        return 0
    return max(-_score(play(board, m)) for m in legal_moves(board))


def reachable_positions() -> list[str]:
    """Every position that can occur in a game, terminal ones included, sorted."""
    seen: set[str] = set()
    stack = [EMPTY_BOARD]
    while stack:
        board = stack.pop()
        if board in seen:
            continue
        seen.add(board)
        stack.extend(play(board, m) for m in legal_moves(board))
    return sorted(seen)


def _has_line(board: str, player: str) -> bool:
    return any(board[a] == board[b] == board[c] == player for a, b, c in LINES)


def _sign(score: int) -> int:
    return (score > 0) - (score < 0)


__all__ = [
    "EMPTY",
    "EMPTY_BOARD",
    "LINES",
    "PLAYERS",
    "Solution",
    "board_problem",
    "is_draw",
    "is_terminal",
    "is_valid_board",
    "legal_moves",
    "play",
    "reachable_positions",
    "solve",
    "to_move",
    "winner",
]

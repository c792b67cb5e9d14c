"""Generate tic-tac-toe training positions.

Usage::

    python -m areno_recipes_agentic.tictactoe.generate --output /tmp/tictactoe.jsonl \
        --count 256 --seed 2026

Each row is a reachable position where the game is still on and it is the model's turn; the
model plays whichever side is to move (``player``). Rows carry the solved answer so a reward or
an evaluation never has to search again::

    {"id": "tictactoe-2026-00000", "board": "X.O.X....", "player": "O", "mode": "tool",
     "legal_moves": [2, 4, 6, 7, 8, 9], "optimal_moves": [9], "value": 0}
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from areno_recipes_agentic.datagen import generator_parser, write_jsonl
from areno_recipes_agentic.tictactoe.game import (
    is_terminal,
    legal_moves,
    reachable_positions,
    solve,
    to_move,
)

MODES = ("tool", "text")
STYLES = ("full", "compact")


@functools.cache
def candidate_positions(skip_trivial: bool = True) -> tuple[str, ...]:
    """Sorted non-terminal reachable positions; ``skip_trivial`` drops positions where every
    legal move is optimal (nothing to learn there, e.g. the empty board)."""
    out = []
    for board in reachable_positions():
        if is_terminal(board):
            continue
        if skip_trivial and len(solve(board).optimal_moves) == len(legal_moves(board)):
            continue
        out.append(board)
    return tuple(out)


def position_row(
    board: str,
    row_id: str,
    mode: str = "tool",
    style: str = "full",
    tool_choice: str | None = None,
) -> dict[str, Any]:
    """The dataset row for one non-terminal ``board`` (``style`` and ``tool_choice`` are
    written only when they are not the defaults)."""
    solution = solve(board)
    return {
        "id": row_id,
        "board": board,
        "player": to_move(board),
        "mode": mode,
        **({"style": style} if style != "full" else {}),
        **({"tool_choice": tool_choice} if tool_choice else {}),
        "legal_moves": legal_moves(board),
        "optimal_moves": list(solution.optimal_moves),
        "value": solution.value,
    }


def generate_positions(
    count: int,
    seed: int,
    *,
    mode: str = "tool",
    skip_trivial: bool = True,
    style: str = "full",
    exclude: Collection[str] = (),
    tool_choice: str | None = None,
) -> list[dict[str, Any]]:
    """``count`` positions drawn without repeats (until the pool runs out) with a seeded RNG.

    The same ``count``, ``seed`` and options always give the same rows. When ``count`` exceeds
    the pool of distinct positions, the pool is reshuffled and drawn again. Boards in
    ``exclude`` (a held-out split) are never drawn.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    rng = random.Random(seed)
    excluded = set(exclude)
    pool = [b for b in candidate_positions(skip_trivial) if b not in excluded]
    if count and not pool:
        raise ValueError("every candidate position is excluded; nothing to draw")
    boards: list[str] = []
    while len(boards) < count:
        order = pool[:]
        rng.shuffle(order)
        boards.extend(order[: count - len(boards)])
    return [
        position_row(b, f"tictactoe-{seed}-{i:05d}", mode, style, tool_choice)
        for i, b in enumerate(boards)
    ]


def read_boards(path: str | Path) -> set[str]:
    """The ``board`` values of a JSONL file of positions."""
    boards = set()
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                boards.add(json.loads(line)["board"])
    return boards


def main(argv: Sequence[str] | None = None) -> int:
    parser = generator_parser(
        "python -m areno_recipes_agentic.tictactoe.generate",
        "Write tic-tac-toe positions (with their perfect-play answers) as JSONL.",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="tool",
        help="'tool': answer with the choose_square tool; 'text': answer as <move>N</move>",
    )
    parser.add_argument(
        "--style",
        choices=STYLES,
        default="full",
        help="prompt style written into the rows: 'compact' for the small CPU model",
    )
    parser.add_argument(
        "--tool-choice",
        default=None,
        help="tool_choice written into the rows ('auto', 'required' or 'choose_square', "
        "which makes the endpoint start every reply with the call)",
    )
    parser.add_argument(
        "--exclude",
        nargs="+",
        default=[],
        metavar="FILE",
        help="JSONL files of positions to leave out (a held-out split)",
    )
    parser.add_argument(
        "--include-trivial",
        action="store_true",
        help="also emit positions where every legal move is optimal",
    )
    args = parser.parse_args(argv)
    if args.count < 0:
        parser.error("--count must be >= 0")
    exclude: set[str] = set()
    for path in args.exclude:
        exclude |= read_boards(path)
    rows = generate_positions(
        args.count,
        args.seed,
        mode=args.mode,
        skip_trivial=not args.include_trivial,
        style=args.style,
        exclude=exclude,
        tool_choice=args.tool_choice,
    )
    write_jsonl(rows, args.output)
    print(f"wrote {len(rows)} tic-tac-toe positions to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

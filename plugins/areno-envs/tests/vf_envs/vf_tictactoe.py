"""A multi-turn verifiers taskset for the tests: pick a tic-tac-toe square with a tool.

The task's ``vf.Toolset`` exposes ``choose_square`` (bare name: ``TOOL_PREFIX = None``); the
rubric reads the first call from the trace: 1 for an optimal square, 0.5 for another free
one, 0 otherwise. The prompts are the compact ones of areno's ``agentic/tictactoe-cpu``, so
that recipe's shipped warm start calls the tool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import verifiers.v1 as vf

# (board, player, optimal squares): positions of agentic/tictactoe-cpu's training data.
BOARDS = [
    ("OOXO...XX", "X", [6, 7]),
    ("XOOX.XOX.", "O", [5]),
    ("OXO...X.X", "O", [8]),
    ("X.O.X.O..", "O", [9]),
]


class BoardData(vf.TaskData):
    board: str
    optimal: list[int]


class Board(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    def choose_square(self, square: int) -> str:
        """Place your mark on a free square (1 to 9)."""
        return f"You marked square {square}."


def first_square(trace: vf.Trace) -> int | None:
    for message in trace.assistant_messages:
        for call in message.tool_calls or []:
            if call.name == "choose_square":
                try:
                    return int(json.loads(call.arguments)["square"])
                except (ValueError, KeyError, TypeError):
                    return None
    return None


class BoardTask(vf.Task[BoardData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Board(vf.ToolsetConfig())]

    @vf.reward
    async def move(self, task: BoardData, trace: vf.Trace) -> float:
        square = first_square(trace)
        if square in task.optimal:
            return 1.0
        free = [i + 1 for i, mark in enumerate(task.board) if mark == "."]
        return 0.5 if square in free else 0.0


class BoardConfig(vf.TasksetConfig):
    pass


def compact(board: str) -> str:
    cells = "".join(m if m != "." else str(i + 1) for i, m in enumerate(board))
    return "\n".join(cells[r : r + 3] for r in (0, 3, 6))


class BoardTaskset(vf.Taskset[BoardTask, BoardConfig]):
    def load(self) -> Iterator[BoardTask]:
        for board, player, optimal in BOARDS:
            prompt = f"You play {player}.\n{compact(board)}\nCall choose_square."
            data = BoardData(prompt=prompt, board=board, optimal=optimal)
            yield BoardTask(data, self.config.task)


__all__ = ["BoardTaskset"]

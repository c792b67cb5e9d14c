"""Tic-tac-toe reward: graded scale, tool and text modes, malformed input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from areno_recipes_agentic.tictactoe.reward import (
    move_from_text,
    score_move,
    tictactoe_reward_fn,
)

from areno_core.types import RewardRecord

# X X .   X to move: 3 wins now, 6 only draws, 7/8/9 lose to O at 6.
# O O .
# . . .
WIN_NOW = "XX.OO...."
# . . .   X to move: 1 wins now, 3 wins later (double threat), 2 only draws.
# . X .
# O O X
SLOW_WIN = "....X.OOX"


def _call(arguments: Any, name: str = "choose_square") -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_record(board: str, *calls: dict[str, Any], completion: str = "") -> RewardRecord:
    return RewardRecord(
        prompt="p", completion=completion, tool_calls=list(calls), row={"board": board}
    )


def _text_record(board: str, completion: str) -> RewardRecord:
    return RewardRecord(prompt="p", completion=completion, row={"board": board, "mode": "text"})


@pytest.mark.parametrize(
    ("board", "square", "expected"),
    [
        (WIN_NOW, 3, 1.0),  # optimal
        (SLOW_WIN, 3, 0.6),  # keeps the win, but slower
        (WIN_NOW, 6, 0.3),  # a won game only drawn
        (SLOW_WIN, 2, 0.3),
        (WIN_NOW, 7, 0.1),  # walks into a loss
        (WIN_NOW, 1, 0.0),  # occupied
        (WIN_NOW, 0, 0.0),
        (WIN_NOW, 10, 0.0),
        (WIN_NOW, None, 0.0),
        ("XXXOO....", 6, 0.0),  # game already over
    ],
)
def test_score_move_graded_scale_expected(board: str, square: int | None, expected: float) -> None:
    assert score_move(board, square) == expected


def test_tictactoe_reward_optimal_tool_call_json_string_one() -> None:
    record = _tool_record(WIN_NOW, _call(json.dumps({"square": 3})))
    assert tictactoe_reward_fn(record) == 1.0


@pytest.mark.parametrize("square", [3, "3", 3.0, " 3 "])
def test_tictactoe_reward_dict_arguments_lenient_square_one(square: Any) -> None:
    assert tictactoe_reward_fn(_tool_record(WIN_NOW, _call({"square": square}))) == 1.0


def test_tictactoe_reward_legal_drawing_move_point_three() -> None:
    assert tictactoe_reward_fn(_tool_record(WIN_NOW, _call('{"square": 6}'))) == 0.3


def test_tictactoe_reward_losing_move_point_one() -> None:
    assert tictactoe_reward_fn(_tool_record(WIN_NOW, _call('{"square": 9}'))) == 0.1


def test_tictactoe_reward_illegal_square_zero() -> None:
    assert tictactoe_reward_fn(_tool_record(WIN_NOW, _call('{"square": 4}'))) == 0.0


def test_tictactoe_reward_first_call_counts() -> None:
    record = _tool_record(WIN_NOW, _call('{"square": 7}'), _call('{"square": 3}'))
    assert tictactoe_reward_fn(record) == 0.1


def test_tictactoe_reward_other_tool_ignored() -> None:
    record = _tool_record(WIN_NOW, _call('{"square": 7}', name="look"), _call('{"square": 3}'))
    assert tictactoe_reward_fn(record) == 1.0


def test_tictactoe_reward_tool_calls_in_messages_used() -> None:
    record = RewardRecord(
        prompt="p",
        completion="",
        messages=[
            {"role": "user", "content": "move"},
            {"role": "assistant", "content": None, "tool_calls": [_call('{"square": 3}')]},
        ],
        row={"board": WIN_NOW},
    )
    assert tictactoe_reward_fn(record) == 1.0


@pytest.mark.parametrize(
    "calls",
    [
        [],
        [_call('{"square": ')],
        [_call('{"sq": 3}')],
        [_call('{"square": true}')],
        [_call('{"square": "three"}')],
        [_call("[3]")],
        [_call(None)],
        [{"function": "choose_square"}],
        ["not a dict"],
        [_call('{"square": 3.5}')],
    ],
)
def test_tictactoe_reward_malformed_tool_call_zero(calls: list[Any]) -> None:
    record = RewardRecord(prompt="p", completion="", tool_calls=calls, row={"board": WIN_NOW})
    assert tictactoe_reward_fn(record) == 0.0


def test_tictactoe_reward_tool_mode_text_answer_zero() -> None:
    record = _tool_record(WIN_NOW, completion="<move>3</move>")
    assert tictactoe_reward_fn(record) == 0.0


def test_tictactoe_reward_text_mode_last_tag_outside_think_one() -> None:
    completion = "<think>maybe <move>7</move>?</think> row: <move>1</move> no, <move> 3 </move>"
    assert tictactoe_reward_fn(_text_record(WIN_NOW, completion)) == 1.0


def test_tictactoe_reward_text_mode_missing_tag_zero() -> None:
    assert tictactoe_reward_fn(_text_record(WIN_NOW, "I play square 3")) == 0.0
    assert tictactoe_reward_fn(_text_record(WIN_NOW, "<move>three</move>")) == 0.0


def test_move_from_text_uppercase_or_empty_tag_parsed() -> None:
    assert move_from_text("<MOVE>5</MOVE>") == 5
    assert move_from_text("<move></move>") is None


@pytest.mark.parametrize(
    "record",
    [
        None,
        "garbage",
        RewardRecord(prompt="p", completion="x"),
        RewardRecord(prompt="p", completion="x", row={"board": 42}),
        RewardRecord(prompt="p", completion="x", row={"board": "OOO"}),
        RewardRecord(prompt="p", completion=None, row={"board": WIN_NOW, "mode": "text"}),  # type: ignore[arg-type]
    ],
)
def test_tictactoe_reward_garbage_record_zero(record: Any) -> None:
    assert tictactoe_reward_fn(record) == 0.0

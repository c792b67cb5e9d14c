"""Tic-tac-toe position generator and loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from areno_recipes_agentic.tictactoe.game import is_terminal, legal_moves, solve, to_move
from areno_recipes_agentic.tictactoe.generate import (
    candidate_positions,
    generate_positions,
    main,
)
from areno_recipes_agentic.tictactoe.loader import (
    compact_board,
    render_board,
    sft_target,
    tictactoe_loader,
    tictactoe_sft_loader,
)
from areno_recipes_agentic.tictactoe.tools import choose_square_tool

from areno_core.errors import DatasetError


def test_generate_positions_same_seed_identical_rows() -> None:
    assert generate_positions(50, seed=7) == generate_positions(50, seed=7)
    assert generate_positions(50, seed=7) != generate_positions(50, seed=8)


def test_generate_positions_rows_are_valid_and_solved() -> None:
    rows = generate_positions(200, seed=3)
    assert len(rows) == 200
    assert len({r["board"] for r in rows}) == 200  # no repeats while the pool lasts
    assert len({r["id"] for r in rows}) == 200
    for row in rows:
        board = row["board"]
        assert not is_terminal(board)
        assert row["player"] == to_move(board)
        assert row["legal_moves"] == [i + 1 for i, c in enumerate(board) if c == "."]
        assert row["optimal_moves"] == list(solve(board).optimal_moves)
        assert row["value"] == solve(board).value
        assert len(row["optimal_moves"]) < len(row["legal_moves"])  # trivial ones skipped
        assert row["mode"] == "tool"
    assert {r["player"] for r in rows} == {"X", "O"}


def test_generate_positions_count_above_pool_repeats_boards() -> None:
    pool = len(candidate_positions())
    rows = generate_positions(pool + 5, seed=1)
    assert len(rows) == pool + 5
    assert len({r["board"] for r in rows}) == pool


def test_generate_positions_include_trivial_allows_empty_board() -> None:
    assert "." * 9 in candidate_positions(skip_trivial=False)
    assert "." * 9 not in candidate_positions()


def test_generate_positions_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="count"):
        generate_positions(-1, seed=0)
    with pytest.raises(ValueError, match="mode"):
        generate_positions(1, seed=0, mode="voice")


def test_generate_main_writes_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "ttt.jsonl"
    assert main(["--output", str(out), "--count", "12", "--seed", "5", "--mode", "text"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == generate_positions(12, seed=5, mode="text")
    assert "wrote 12" in capsys.readouterr().out


def test_render_board_free_squares_show_numbers() -> None:
    expected = " X | 2 | 3\n---+---+---\n 4 | O | 6\n---+---+---\n 7 | 8 | X"
    assert render_board("X...O...X") == expected


def test_tictactoe_loader_tool_mode_prompt_and_fields() -> None:
    row = generate_positions(1, seed=11)[0]
    out = tictactoe_loader(row)
    assert [m["role"] for m in out["prompt"]] == ["system", "user"]
    user = out["prompt"][1]["content"]
    assert render_board(row["board"]) in user
    assert "choose_square" in user
    assert f"You play {row['player']}" in user
    assert out["tools"][0]["function"]["name"] == "choose_square"
    assert out["solutions"] == [str(m) for m in row["optimal_moves"]]
    for key in ("id", "board", "player", "legal_moves", "optimal_moves", "value", "mode"):
        assert out[key] == row[key]


def test_tictactoe_loader_text_mode_asks_for_move_tag() -> None:
    out = tictactoe_loader({"board": "XX.OO....", "mode": "text", "id": "t1"})
    assert "<move>" in out["prompt"][1]["content"]
    assert "tools" not in out
    assert out["player"] == "X"
    assert out["optimal_moves"] == [3]
    assert out["legal_moves"] == [3, 6, 7, 8, 9]
    assert out["value"] == 1
    assert out["id"] == "t1"


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"board": "XXXOO...."}, "is over"),
        ({"board": "OO......."}, "bad 'board'"),
        ({}, "bad 'board'"),
        ({"board": "XX.OO....", "optimal_moves": [6]}, "optimal_moves"),
        ({"board": "XX.OO....", "player": "O"}, "player"),
        ({"board": "XX.OO....", "mode": "voice"}, "mode"),
        ({"board": "XX.OO....", "style": "tiny"}, "'style' must be one of"),
        ({"board": "XX.OO....", "tool_choice": "resign"}, "'tool_choice' must be one of"),
    ],
)
def test_tictactoe_loader_bad_row_raises_dataset_error(row: dict, fragment: str) -> None:
    with pytest.raises(DatasetError, match=fragment):
        tictactoe_loader(row)


def test_tictactoe_loader_every_generated_row_loads() -> None:
    for row in generate_positions(100, seed=2):
        out = tictactoe_loader(row)
        assert out["legal_moves"] == legal_moves(row["board"])


def test_compact_style_is_one_short_user_message_with_compact_tool() -> None:
    out = tictactoe_loader({"board": "XX.OO....", "style": "compact"})
    assert out["prompt"] == [
        {"role": "user", "content": "You play X.\nXX3\nOO6\n789\nCall choose_square."}
    ]
    assert out["tools"] == [choose_square_tool(compact=True)]
    assert "description" not in json.dumps(out["tools"])
    assert out["style"] == "compact"
    assert compact_board("X...O...X") == "X23\n4O6\n78X"
    assert tictactoe_loader({"board": "XX.OO...."})["style"] == "full"


def test_sft_loader_response_calls_an_optimal_square_fixed_per_board() -> None:
    rows = generate_positions(60, seed=4, style="compact")
    for row in rows:
        out = tictactoe_sft_loader(row)
        (message,) = out["response"]
        (call,) = message["tool_calls"]
        square = call["function"]["arguments"]["square"]
        assert square == sft_target(row) and square in row["optimal_moves"]
        assert message["role"] == "assistant" and out["prompt"] == tictactoe_loader(row)["prompt"]
    picks = {sft_target(r) for r in rows if len(r["optimal_moves"]) > 1}
    assert len(picks) > 1  # not always the first optimal square
    text = tictactoe_sft_loader({"board": "XX.OO....", "mode": "text"})
    assert text["response"] == [{"role": "assistant", "content": "<move>3</move>"}]


def test_generate_positions_exclude_and_style(tmp_path: Path) -> None:
    held_out = tmp_path / "eval.jsonl"
    assert main(["--output", str(held_out), "--count", "40", "--seed", "1"]) == 0
    train = tmp_path / "train.jsonl"
    args = ["--output", str(train), "--count", "50", "--seed", "2", "--style", "compact"]
    args += ["--tool-choice", "choose_square"]
    assert main([*args, "--exclude", str(held_out)]) == 0
    evals = {json.loads(line)["board"] for line in held_out.read_text().splitlines()}
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    assert len(rows) == 50 and not evals & {r["board"] for r in rows}
    assert {r["style"] for r in rows} == {"compact"}
    assert {r["tool_choice"] for r in rows} == {"choose_square"}
    with pytest.raises(ValueError, match="style"):
        generate_positions(1, seed=0, style="tiny")

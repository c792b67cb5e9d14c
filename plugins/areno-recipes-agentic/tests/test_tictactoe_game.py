"""Tic-tac-toe rules and the perfect player, on hand-checked positions."""

from __future__ import annotations

import pytest
from areno_recipes_agentic.tictactoe.game import (
    EMPTY_BOARD,
    board_problem,
    is_draw,
    is_terminal,
    legal_moves,
    play,
    reachable_positions,
    solve,
    to_move,
    winner,
)


def test_solve_empty_board_is_draw_with_every_square_optimal() -> None:
    solution = solve(EMPTY_BOARD)
    assert solution.value == 0
    assert solution.optimal_moves == (1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert set(solution.move_values.values()) == {0}


def test_solve_immediate_win_lists_only_winning_square() -> None:
    # X X .      X completes the top row at 3; 6 only blocks O, 7/8/9 let O win at 6.
    # O O .
    # . . .
    solution = solve("XX.OO....")
    assert solution.value == 1
    assert solution.optimal_moves == (3,)
    assert solution.move_values == {3: 1, 6: 0, 7: -1, 8: -1, 9: -1}


def test_solve_two_immediate_wins_lists_both_squares() -> None:
    # X X .     X wins at 3 (top row) and at 7 (left column).
    # X O .
    # . O O
    solution = solve("XX.XO..OO")
    assert solution.value == 1
    assert solution.optimal_moves == (3, 7)


def test_solve_forced_block_only_blocking_square_draws() -> None:
    # X X .     O must block at 3; anything else loses to X at 3.
    # . O .
    # . . .
    solution = solve("XX..O....")
    assert to_move("XX..O....") == "O"
    assert solution.value == 0
    assert solution.optimal_moves == (3,)
    assert {m: v for m, v in solution.move_values.items() if m != 3} == dict.fromkeys(
        (4, 6, 7, 8, 9), -1
    )


def test_solve_slower_win_is_winning_but_not_optimal() -> None:
    # . . .     X wins now at 1 (diagonal 1-5-9); 3 also wins (double threat at 1 and 6)
    # . X .     but later, so only 1 is optimal.
    # O O X
    solution = solve("....X.OOX")
    assert solution.optimal_moves == (1,)
    assert solution.move_values[3] == 1
    assert solution.move_values[2] == 0


def test_solve_terminal_board_has_no_moves() -> None:
    solution = solve("XXXOO....")
    assert solution.value == -1  # O is to move and has lost
    assert solution.optimal_moves == ()


def test_winner_lines_detected_for_rows_columns_diagonals() -> None:
    assert winner("XXXOO....") == "X"
    assert winner("O..XO.X.O") == "O"
    assert winner("X..X..XOO") == "X"
    assert winner("..XOX.XO.") == "X"
    assert winner("XOXXOOOXX") is None


def test_is_draw_full_board_without_line_true() -> None:
    assert is_draw("XOXXOOOXX")
    assert is_terminal("XOXXOOOXX")
    assert not is_draw("XOXXOOOX.")


def test_legal_moves_finished_game_empty() -> None:
    assert legal_moves("XXXOO....") == []
    assert legal_moves("XO.......") == [3, 4, 5, 6, 7, 8, 9]


def test_play_occupied_square_raises() -> None:
    assert play("X........", 5) == "X...O...."
    with pytest.raises(ValueError, match="not a legal move"):
        play("X........", 1)
    with pytest.raises(ValueError):
        play("X........", 10)


@pytest.mark.parametrize(
    ("board", "fragment"),
    [
        ("XX", "9 squares"),
        ("XXA......", "holds only"),
        ("OO.......", "X moves first"),
        ("XXXOOO...", "both players"),
        ("XXXOO.O..", "X has three in a row"),
        ("OOOXX.X.X", "O has three in a row"),
        (123, "must be a string"),
    ],
)
def test_board_problem_unreachable_board_explained(board: object, fragment: str) -> None:
    problem = board_problem(board)
    assert problem is not None
    assert fragment in problem


def test_reachable_positions_count_is_known_total() -> None:
    positions = reachable_positions()
    assert len(positions) == 5478  # the well-known number of legal tic-tac-toe positions
    assert all(board_problem(b) is None for b in positions)

"""The tic-tac-toe evaluation: games against a random player and move scores, with stand-in
move pickers (the model-backed picker is exercised by the recipe tests)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from areno_recipes_agentic.tictactoe.evaluate import _square, play_games, score_positions
from areno_recipes_agentic.tictactoe.game import legal_moves, solve


class Perfect:
    def moves(self, boards: Sequence[str]) -> list[int | None]:
        return [solve(b).optimal_moves[0] for b in boards]


class Occupied:
    def moves(self, boards: Sequence[str]) -> list[int | None]:
        return [next(i + 1 for i, c in enumerate(b) if c != ".") if "X" in b or "O" in b else 5
                for b in boards]  # fmt: skip


def test_perfect_player_never_loses_to_a_random_one() -> None:
    scores = play_games(Perfect(), 60, seed=3)  # type: ignore[arg-type]
    assert scores.games == 60 and scores.loss_rate == 0.0 and scores.forfeit_rate == 0.0
    assert scores.win_rate + scores.draw_rate == 1.0
    assert scores.win_rate > 0.8  # a random opponent blunders almost every game


def test_illegal_move_forfeits_the_game() -> None:
    scores = play_games(Occupied(), 10, seed=0)  # type: ignore[arg-type]
    assert scores.forfeit_rate == 1.0 and scores.loss_rate == 1.0 and scores.win_rate == 0.0


def test_score_positions_counts_optimal_legal_and_calls() -> None:
    boards = ["XX.OO....", "X...O...."]
    scores = score_positions(Perfect(), boards)  # type: ignore[arg-type]
    assert (scores.reward, scores.optimal, scores.legal, scores.tool_call) == (1.0, 1.0, 1.0, 1.0)
    assert legal_moves(boards[0])[0] == 3


def test_square_reads_the_first_choose_square_call() -> None:
    def call(name: str, args: object) -> dict[str, object]:
        return {"function": {"name": name, "arguments": json.dumps(args)}}

    assert _square([call("other", {"square": 1}), call("choose_square", {"square": 7})]) == 7
    assert _square([call("choose_square", {"square": "4"})]) == 4
    assert _square([call("choose_square", {"square": 2.0})]) == 2
    assert _square([call("choose_square", {"square": True})]) is None
    assert _square([call("choose_square", {"cell": 3})]) is None
    assert _square([]) is None


def test_moving_average_is_a_trailing_mean() -> None:
    from areno_recipes_agentic.tictactoe.plot import moving_average

    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([], 5) == []


def test_warmstart_export_keeps_model_files_and_records_provenance(tmp_path) -> None:
    from areno_recipes_agentic.tictactoe.warmstart import export_checkpoint, sha256

    run = tmp_path / "run"
    step = run / "step_300"
    step.mkdir(parents=True)
    (run / "latest").write_text("step_300\n")
    for name, body in {
        "model.safetensors": b"weights",
        "config.json": b"{}",
        "chat_template.jinja": b"tpl",
        "trainer_state.pt": b"optimizer",
    }.items():
        (step / name).write_bytes(body)
    out = export_checkpoint(run, tmp_path / "warm")
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "model.safetensors",
        "provenance.json",
    ]
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["source_step"] == "step_300"
    assert provenance["model_sha256"] == sha256(out / "model.safetensors")

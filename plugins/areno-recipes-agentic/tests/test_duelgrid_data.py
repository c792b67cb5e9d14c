"""DuelGrid generator, loader and scripted opponent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from areno_recipes_agentic.duelgrid.generate import generate_states, main
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.policy import greedy_policy, play_scripted_turn
from areno_recipes_agentic.duelgrid.rules import (
    path_distance,
    state_from_dict,
    state_from_map,
    state_to_dict,
    state_to_text,
)

from areno_core.errors import DatasetError


def test_generate_states_same_seed_identical_rows() -> None:
    assert generate_states(30, seed=9) == generate_states(30, seed=9)
    assert generate_states(30, seed=9) != generate_states(30, seed=10)


def test_generate_states_prefix_matches_smaller_count() -> None:
    assert generate_states(40, seed=2)[:10] == generate_states(10, seed=2)


def test_generate_states_valid_varied_starts() -> None:
    rows = generate_states(150, seed=1)
    states = [state_from_dict(r["state"]) for r in rows]
    assert len({r["id"] for r in rows}) == 150
    for state in states:
        rules = state.rules
        assert state.size == 7
        assert state.to_move == "A" and state.turn == 1 and not state.is_over
        a, u = state.agent.pos, state.user.pos
        assert abs(a[0] - u[0]) + abs(a[1] - u[1]) >= 2  # never adjacent
        assert path_distance(state, a, u) is not None  # the walls leave a way through
        assert rules.energy_per_turn <= state.agent.energy <= rules.max_energy
        occupied = [i.pos for i in state.items] + list(state.traps) + [a, u]
        assert len(occupied) == len(set(occupied))
        assert not set(occupied) & state.walls
        assert state.items and state.traps and state.walls
    assert len({(s.agent.pos, s.user.pos, s.walls) for s in states}) == 150
    assert {s.agent.shielded for s in states} == {True, False}
    assert len({s.agent.hp for s in states}) > 3


def test_generate_states_size_option_and_bad_arguments() -> None:
    row = generate_states(1, seed=0, size=9)[0]
    assert row["state"]["size"] == 9
    with pytest.raises(ValueError, match="size"):
        generate_states(1, seed=0, size=3)
    with pytest.raises(ValueError, match="count"):
        generate_states(-2, seed=0)
    with pytest.raises(ValueError, match="mode"):
        generate_states(1, seed=0, mode="voice")


def test_generate_main_writes_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dg.jsonl"
    assert main(["--output", str(out), "--count", "6", "--seed", "3"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == generate_states(6, seed=3)
    assert "wrote 6" in capsys.readouterr().out


def test_duelgrid_loader_tool_mode_prompt_and_fields() -> None:
    row = generate_states(1, seed=5)[0]
    out = duelgrid_loader(row)
    assert [m["role"] for m in out["prompt"]] == ["system", "user"]
    system, user = out["prompt"][0]["content"], out["prompt"][1]["content"]
    for word in ("MOVE", "ATTACK", "RANGED_ATTACK", "PICKUP", "SHIELD", "trap"):
        assert word in system
    assert state_to_text(state_from_dict(row["state"])) in user
    assert "choose_action" in user
    assert out["tools"][0]["function"]["name"] == "choose_action"
    assert out["state"] == row["state"]
    assert out["id"] == row["id"]
    assert out["mode"] == "tool"


def test_duelgrid_loader_json_text_state_text_mode() -> None:
    row = generate_states(1, seed=5, mode="text")[0]
    row["state"] = json.dumps(row["state"])
    out = duelgrid_loader(row)
    assert isinstance(out["state"], dict)
    assert "tools" not in out
    assert '{"actions"' in out["prompt"][1]["content"]


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({}, "no 'state'"),
        ({"state": "{oops"}, "not JSON"),
        ({"state": {"size": 7}}, "units"),
        ({"state": state_to_dict(state_from_map(["A..", "...", "..U"], to_move="U"))}, "A's turn"),
        ({"state": state_to_dict(state_from_map(["A..", "...", "..U"], user={"hp": 0}))}, "over"),
        ({"state": state_to_dict(state_from_map(["A..", "...", "..U"])), "mode": "x"}, "mode"),
    ],
)
def test_duelgrid_loader_bad_row_raises_dataset_error(row: dict, fragment: str) -> None:
    with pytest.raises(DatasetError, match=fragment):
        duelgrid_loader(row)


def test_greedy_policy_chases_and_attacks() -> None:
    state = state_from_map([".....", ".A.U.", ".^#..", ".....", "....."], to_move="U")
    actions = greedy_policy(state, "U")
    assert actions == [
        {"type": "MOVE", "direction": "left"},
        {"type": "ATTACK"},
        {"type": "ATTACK"},
    ]
    after, _ = play_scripted_turn(state)
    assert after.agent.hp == 4
    assert after.to_move == "A"


def test_greedy_policy_avoids_trap_when_path_exists() -> None:
    # the straight way down passes a trap; the policy walks around it
    state = state_from_map(["U..", "^..", "A.."], to_move="U", user={"energy": 2})
    assert greedy_policy(state, "U") == [
        {"type": "MOVE", "direction": "right"},
        {"type": "MOVE", "direction": "down"},
    ]


def test_greedy_policy_picks_up_health_when_hurt() -> None:
    state = state_from_map(["A...", "....", "....", "...U"], to_move="U", user={"hp": 4})
    assert greedy_policy(state, "U")[0]["type"] == "MOVE"
    hurt = state_from_dict(
        {
            **state_to_dict(state),
            "items": [{"row": 3, "col": 3, "kind": "health"}],
        }
    )
    assert greedy_policy(hurt, "U")[0] == {"type": "PICKUP"}


def test_scripted_games_finish_deterministically() -> None:
    def play(state_dict: dict) -> tuple[str | None, int]:
        state = state_from_dict(state_dict)
        while not state.is_over:
            state, _ = play_scripted_turn(state)
        return state.winner, state.turn

    rows = generate_states(20, seed=8)
    results = [play(r["state"]) for r in rows]
    assert results == [play(r["state"]) for r in rows]
    assert all(turn <= 61 for _, turn in results)
    assert {w for w, _ in results} <= {"A", "U", None}


def test_generate_states_turns_written_and_checked(tmp_path: Path) -> None:
    assert "turns" not in generate_states(1, seed=0)[0]
    assert [r["turns"] for r in generate_states(3, seed=0, turns=4)] == [4, 4, 4]
    with pytest.raises(ValueError, match="turns"):
        generate_states(1, seed=0, turns=17)
    out = tmp_path / "dg.jsonl"
    assert main(["--output", str(out), "--count", "2", "--turns", "3"]) == 0
    assert [json.loads(line)["turns"] for line in out.read_text().splitlines()] == [3, 3]


def test_duelgrid_loader_turns_mentioned_in_prompt_and_validated() -> None:
    row = generate_states(1, seed=5)[0]
    assert "This game lasts" not in duelgrid_loader(row)["prompt"][1]["content"]
    assert "This game lasts" not in duelgrid_loader({**row, "turns": 1})["prompt"][1]["content"]
    user = duelgrid_loader({**row, "turns": 3})["prompt"][1]["content"]
    assert "up to 3 of your turns" in user
    for bad in (0, 17, "2", True, None):
        with pytest.raises(DatasetError, match="'turns'"):
            duelgrid_loader({**row, "turns": bad})

"""DuelGrid reward: the formula on hand-built turns, input sources, and robustness."""

from __future__ import annotations

import json
from typing import Any

import pytest
from areno_recipes_agentic.duelgrid.generate import generate_states
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.policy import greedy_policy
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.duelgrid.rules import (
    GameState,
    state_from_dict,
    state_from_map,
    state_to_dict,
)
from areno_recipes_agentic.duelgrid.turn import actions_from_text, score_turn

from areno_core.types import RewardRecord

# A at (1, 1) with 6 energy, U at (1, 3), a trap below A.
ARENA = [".....", ".A.U.", ".^...", ".....", "....."]
RIGHT = {"type": "MOVE", "direction": "right"}
LEFT = {"type": "MOVE", "direction": "left"}
DOWN = {"type": "MOVE", "direction": "down"}
ATTACK = {"type": "ATTACK"}
STRIKE = [RIGHT, ATTACK]


def _arena(**kwargs: Any) -> GameState:
    return state_from_map(ARENA, **kwargs)


def _row(state: GameState, mode: str = "tool") -> dict[str, Any]:
    return {"state": state_to_dict(state), "mode": mode}


def _tool_record(state: GameState, arguments: Any, completion: str = "") -> RewardRecord:
    call = {"type": "function", "function": {"name": "choose_action", "arguments": arguments}}
    return RewardRecord(prompt="p", completion=completion, tool_calls=[call], row=_row(state))


def test_score_turn_attack_components_hand_computed() -> None:
    score = score_turn(_arena(), STRIKE)
    # damage 3/6, approach 1 (dealt damage), efficiency 3/6, safety 1
    assert (score.damage, score.approach, score.pickup) == (0.5, 1.0, 0.0)
    assert (score.efficiency, score.safety) == (0.5, 1.0)
    assert score.total == pytest.approx(0.40 * 0.5 + 0.20 + 0.10 * 0.5 + 0.15)


def test_score_turn_attack_beats_walking_into_trap() -> None:
    attack = score_turn(_arena(), STRIKE).total
    trap = score_turn(_arena(), [DOWN])
    assert trap.safety == 0.0 and trap.approach == 0.0 and trap.efficiency == 0.0
    assert trap.total == 0.0
    assert attack == pytest.approx(0.6)
    assert attack > trap.total


def test_score_turn_two_attacks_beat_one() -> None:
    two = score_turn(_arena(), [RIGHT, ATTACK, ATTACK]).total
    assert two == pytest.approx(0.40 + 0.20 + 0.10 * 5 / 6 + 0.15)
    assert two > score_turn(_arena(), STRIKE).total


def test_score_turn_kill_full_damage_component() -> None:
    score = score_turn(_arena(user={"hp": 3}), STRIKE)
    assert score.damage == 1.0
    assert score.total == pytest.approx(0.8)


def test_score_turn_invalid_action_halves_score() -> None:
    score = score_turn(_arena(), [RIGHT, ATTACK, {"type": "FLY"}])
    assert score.invalid
    assert score.total == pytest.approx(0.3)


def test_score_turn_empty_sequence_safety_only() -> None:
    assert score_turn(_arena(), []).total == pytest.approx(0.15)


def test_score_turn_oscillation_scores_below_approach() -> None:
    wander = score_turn(_arena(), [LEFT, RIGHT, LEFT, RIGHT])
    assert wander.approach == 0.0
    assert wander.efficiency == pytest.approx(1 / 6)  # only the first step was to a new tile
    closer = score_turn(_arena(), [RIGHT])
    assert closer.approach == 1.0  # ends next to U
    assert closer.total > wander.total


def test_score_turn_partial_approach_fraction() -> None:
    state = state_from_map(["A....", ".....", ".....", ".....", "....U"], agent={"energy": 2})
    score = score_turn(state, [RIGHT, RIGHT])
    # walking distance 8 -> 6: closed 2 of the 7 steps needed to stand next to U
    assert score.approach == pytest.approx(2 / 7)


def test_score_turn_pickup_rewarded() -> None:
    state = state_from_map([".....", ".AHU.", ".....", ".....", "....."], agent={"hp": 5})
    with_pickup = score_turn(state, [RIGHT, {"type": "PICKUP"}, ATTACK])
    assert with_pickup.pickup == 1.0
    assert with_pickup.total == pytest.approx(0.2 + 0.2 + 0.15 + 0.10 * 4 / 6 + 0.15)
    assert with_pickup.total > score_turn(state, STRIKE).total


def test_score_turn_self_defeat_zero() -> None:
    score = score_turn(_arena(agent={"hp": 2}), [DOWN])
    assert score.died
    assert score.total == 0.0


def test_duelgrid_reward_tool_call_string_dict_and_list_arguments_equal() -> None:
    state = _arena()
    as_string = _tool_record(state, json.dumps({"actions": STRIKE}))
    as_dict = _tool_record(state, {"actions": STRIKE})
    as_list = _tool_record(state, STRIKE)
    assert duelgrid_reward_fn(as_string) == pytest.approx(0.6)
    assert duelgrid_reward_fn(as_dict) == pytest.approx(0.6)
    assert duelgrid_reward_fn(as_list) == pytest.approx(0.6)


def test_duelgrid_reward_loader_row_works() -> None:
    row = duelgrid_loader(_row(_arena()))
    call = {"function": {"name": "choose_action", "arguments": json.dumps({"actions": STRIKE})}}
    record = RewardRecord(prompt="p", completion="", tool_calls=[call], row=row)
    assert duelgrid_reward_fn(record) == pytest.approx(0.6)


def test_duelgrid_reward_tool_mode_text_fallback_halved() -> None:
    completion = "Plan: step right and hit. " + json.dumps({"actions": STRIKE})
    record = RewardRecord(prompt="p", completion=completion, row=_row(_arena()))
    assert duelgrid_reward_fn(record) == pytest.approx(0.3)


def test_duelgrid_reward_text_mode_last_json_outside_think() -> None:
    completion = (
        '<think>{"actions": [{"type": "MOVE", "direction": "down"}]}</think>'
        'Draft: {"actions": [{"type": "MOVE", "direction": "down"}]}\n'
        f"Final: ```json\n{json.dumps({'actions': STRIKE})}\n```"
    )
    record = RewardRecord(prompt="p", completion=completion, row=_row(_arena(), mode="text"))
    assert duelgrid_reward_fn(record) == pytest.approx(0.6)


def test_actions_from_text_without_actions_object_none() -> None:
    assert actions_from_text('{"move": "right"} [1, 2]') is None
    assert actions_from_text("") is None


def test_duelgrid_reward_generated_rows_in_unit_interval() -> None:
    for row in generate_states(30, seed=6):
        call = {"function": {"name": "choose_action", "arguments": {"actions": [RIGHT, ATTACK]}}}
        record = RewardRecord(prompt="p", completion="", tool_calls=[call], row=row)
        assert 0.0 <= duelgrid_reward_fn(record) <= 1.0


@pytest.mark.parametrize(
    "arguments",
    [
        "not json",
        '{"actions": "MOVE right"}',
        "{}",
        None,
        42,
        '{"actions": {"type": "ATTACK"}}',
    ],
)
def test_duelgrid_reward_unreadable_arguments_zero(arguments: Any) -> None:
    assert duelgrid_reward_fn(_tool_record(_arena(), arguments)) == 0.0


def test_duelgrid_reward_garbage_actions_invalid_floor() -> None:
    record = _tool_record(_arena(), {"actions": [1, 2, 3] * 10_000})
    assert duelgrid_reward_fn(record) == pytest.approx(0.15 * 0.5)


@pytest.mark.parametrize(
    "record",
    [
        None,
        "garbage",
        RewardRecord(prompt="p", completion='{"actions": []}'),
        RewardRecord(prompt="p", completion='{"actions": []}', row={"state": "{bad"}),
        RewardRecord(prompt="p", completion='{"actions": []}', row={"state": {"size": 7}}),
        RewardRecord(prompt="p", completion=None, row={"state": {}, "mode": "text"}),  # type: ignore[arg-type]
        RewardRecord(prompt="p", completion="{" * 5000 + "[" * 5000, row=_row(_arena(), "text")),
    ],
)
def test_duelgrid_reward_garbage_record_zero(record: Any) -> None:
    assert duelgrid_reward_fn(record) == 0.0


def test_duelgrid_reward_generated_state_has_positive_best_turn() -> None:
    row = generate_states(1, seed=0)[0]
    actions = greedy_policy(state_from_dict(row["state"]), "A")
    assert score_turn(state_from_dict(row["state"]), actions).total > 0.15

"""DuelGrid rule engine on small hand-built maps."""

from __future__ import annotations

from typing import Any

import pytest
from areno_recipes_agentic.duelgrid.generate import generate_states
from areno_recipes_agentic.duelgrid.rules import (
    Action,
    GameState,
    Rules,
    apply_actions,
    end_turn,
    parse_action,
    path_distance,
    state_from_dict,
    state_from_json,
    state_from_map,
    state_to_dict,
    state_to_json,
    state_to_text,
)

# A at (1, 1), U at (1, 3), a trap below A, a wall at (2, 2).
ARENA = [
    ".....",
    ".A.U.",
    ".^#..",
    ".....",
    ".....",
]


def _arena(**kwargs: Any) -> GameState:
    return state_from_map(ARENA, **kwargs)


def _step_right_and_pick_up(state: GameState) -> tuple[GameState, list[Any]]:
    """A moves one tile right and picks up what lies there."""
    return apply_actions(state, "A", [{"type": "MOVE", "direction": "right"}, {"type": "PICKUP"}])


def _kinds(events: list[Any]) -> list[str]:
    return [e.kind for e in events]


def test_move_right_changes_position_and_spends_one_energy() -> None:
    state = _arena()
    after, events = apply_actions(state, "A", [{"type": "MOVE", "direction": "right"}])
    assert after.agent.pos == (1, 2)
    assert after.agent.energy == state.agent.energy - 1
    assert _kinds(events) == ["move"]
    assert events[0].pos == (1, 2)


def test_move_case_insensitive_accepted() -> None:
    after, _ = apply_actions(_arena(), "A", [{"type": "move", "direction": "UP"}])
    assert after.agent.pos == (0, 1)


@pytest.mark.parametrize(
    ("lines", "direction", "reason"),
    [
        (["A#.", "...", "..U"], "right", "wall"),
        (["AU.", "...", "..."], "right", "U stands at"),
        (["A..", "...", "..U"], "up", "edge of the map"),
        (["A..", "...", "..U"], "left", "edge of the map"),
    ],
)
def test_move_blocked_rejected_state_unchanged(
    lines: list[str], direction: str, reason: str
) -> None:
    state = state_from_map(lines)
    after, events = apply_actions(state, "A", [{"type": "MOVE", "direction": direction}])
    assert after == state
    assert _kinds(events) == ["invalid"]
    assert reason in events[0].text


def test_attack_adjacent_deals_damage_and_costs_two() -> None:
    state = _arena()
    after, events = apply_actions(
        state, "A", [{"type": "MOVE", "direction": "right"}, {"type": "ATTACK"}]
    )
    assert after.user.hp == 10 - 3
    assert after.agent.energy == 6 - 1 - 2
    assert _kinds(events) == ["move", "attack", "damage"]
    assert events[1].amount == 3


def test_attack_not_adjacent_rejected() -> None:
    state = _arena()
    after, events = apply_actions(state, "A", [{"type": "ATTACK"}])
    assert after == state
    assert _kinds(events) == ["invalid"]
    assert "adjacent" in events[0].text


def test_attack_shielded_target_halved_and_shield_consumed() -> None:
    state = _arena(user={"shielded": True})
    moves = [{"type": "MOVE", "direction": "right"}, {"type": "ATTACK"}, {"type": "ATTACK"}]
    assert state.agent.energy == 6  # 1 + 2 + 2 fits
    after, events = apply_actions(state, "A", moves)
    # first hit: 3 // 2 = 1 taken, 2 absorbed; second hit: full 3
    assert after.user.hp == 10 - 1 - 3
    assert not after.user.shielded
    absorbed = [e for e in events if e.kind == "shield_absorbed"]
    assert [e.amount for e in absorbed] == [2]
    assert [e.amount for e in events if e.kind == "attack"] == [1, 3]


def test_ranged_attack_clear_line_deals_two_damage() -> None:
    state = state_from_map(["A..U", "....", "....", "...."])
    after, events = apply_actions(state, "A", [{"type": "RANGED_ATTACK"}])
    assert after.user.hp == 10 - 2
    assert after.agent.energy == 6 - 3
    assert _kinds(events) == ["ranged_attack", "damage"]


def test_ranged_attack_wall_between_rejected_with_wall_position() -> None:
    state = state_from_map(["A#.U", "....", "....", "...."])
    after, events = apply_actions(state, "A", [{"type": "RANGED_ATTACK"}])
    assert after == state
    assert events[0].kind == "invalid"
    assert "line of sight" in events[0].text
    assert "(0, 1)" in events[0].text


def test_ranged_attack_out_of_range_or_not_aligned_rejected() -> None:
    far = state_from_map(["A...U", ".....", ".....", ".....", "....."])
    _, events = apply_actions(far, "A", [{"type": "RANGED_ATTACK"}])
    assert "reaches 3 tiles" in events[0].text
    diagonal = state_from_map(["A..", ".U.", "..."])
    _, events = apply_actions(diagonal, "A", [{"type": "RANGED_ATTACK"}])
    assert "same row or column" in events[0].text


def test_pickup_health_heals_capped_and_removes_item() -> None:
    state = state_from_map(["AH.", "...", "..U"], agent={"hp": 5})
    after, events = _step_right_and_pick_up(state)
    assert after.agent.hp == 8
    assert after.items == ()
    assert events[-1].kind == "pickup" and events[-1].amount == 3
    capped = state_from_map(["AH.", "...", "..U"], agent={"hp": 9})
    after, events = _step_right_and_pick_up(capped)
    assert after.agent.hp == 10
    assert events[-1].amount == 1


def test_pickup_energy_restores_after_paying_cost() -> None:
    state = state_from_map(["AE.", "...", "..U"], agent={"energy": 3})
    after, events = _step_right_and_pick_up(state)
    # 3 - 1 (move) - 1 (pickup) + 3 = 4
    assert after.agent.energy == 4
    assert events[-1].amount == 3


@pytest.mark.parametrize(
    ("unit", "action", "message"),
    [("A", "PICKUP", "no pickup"), ("U", "SHIELD", "A's turn")],
    ids=["pickup-without-item", "wrong-unit-turn"],
)
def test_refused_action_leaves_the_state_unchanged(unit: str, action: str, message: str) -> None:
    state = _arena()
    after, events = apply_actions(state, unit, [{"type": action}])
    assert after == state
    assert message in events[0].text


def test_walking_over_item_does_not_collect_it() -> None:
    state = state_from_map(["AH.", "...", "..U"])
    after, _ = apply_actions(
        state,
        "A",
        [{"type": "MOVE", "direction": "right"}, {"type": "MOVE", "direction": "right"}],
    )
    assert len(after.items) == 1


def test_trap_entered_costs_two_hp() -> None:
    state = _arena()
    after, events = apply_actions(state, "A", [{"type": "MOVE", "direction": "down"}])
    assert after.agent.hp == 8
    assert _kinds(events) == ["move", "trap"]
    assert events[1].amount == 2


def test_trap_with_shield_halved_and_shield_consumed() -> None:
    state = _arena(agent={"shielded": True})
    after, _ = apply_actions(state, "A", [{"type": "MOVE", "direction": "down"}])
    assert after.agent.hp == 9
    assert not after.agent.shielded


def test_shield_raised_costs_two_and_second_shield_rejected() -> None:
    state = _arena()
    after, events = apply_actions(state, "A", [{"type": "SHIELD"}, {"type": "SHIELD"}])
    assert after.agent.shielded
    assert after.agent.energy == 4
    assert _kinds(events) == ["shield", "invalid"]
    assert "already up" in events[1].text


def test_not_enough_energy_rejected_and_energy_kept() -> None:
    state = _arena(agent={"energy": 2})
    after, events = apply_actions(
        state, "A", [{"type": "MOVE", "direction": "right"}, {"type": "ATTACK"}]
    )
    assert after.agent.pos == (1, 2)
    assert after.agent.energy == 1
    assert after.user.hp == 10
    assert events[-1].kind == "invalid"
    assert "costs 2 energy but A has 1" in events[-1].text


def test_invalid_action_stops_rest_of_sequence() -> None:
    state = _arena()
    actions = [
        {"type": "MOVE", "direction": "up"},
        {"type": "MOVE", "direction": "up"},  # off the map
        {"type": "MOVE", "direction": "right"},
    ]
    after, events = apply_actions(state, "A", actions)
    assert after.agent.pos == (0, 1)
    assert after.agent.energy == 5
    assert _kinds(events) == ["move", "invalid"]
    assert events[1].index == 1


def test_kill_ends_game_and_skips_remaining_actions() -> None:
    state = state_from_map(["AU.", "...", "..."], user={"hp": 3})
    after, events = apply_actions(
        state, "A", [{"type": "ATTACK"}, {"type": "MOVE", "direction": "down"}]
    )
    assert after.user.hp == 0
    assert after.is_over and after.winner == "A"
    assert _kinds(events) == ["attack", "damage", "defeated", "skipped"]
    assert after.agent.pos == (0, 0)


def test_too_many_actions_rejected_at_limit() -> None:
    rules = Rules(max_actions=2, max_energy=20)
    state = state_from_map(ARENA, rules=rules)
    moves = [{"type": "MOVE", "direction": d} for d in ("left", "down", "down")]
    after, events = apply_actions(state, "A", moves)
    assert after.agent.pos == (2, 0)
    assert events[-1].kind == "invalid" and "at most 2" in events[-1].text


@pytest.mark.parametrize(
    "actions",
    [
        "MOVE up",
        {"type": "MOVE"},
        [None],
        [{"type": 5}],
        [{"type": "TELEPORT"}],
        [{"type": "MOVE"}],
        [{"type": "MOVE", "direction": "north"}],
        [{"direction": "up"}],
        [["MOVE", "up"]],
    ],
)
def test_apply_actions_garbage_rejected_without_raising(actions: Any) -> None:
    state = _arena()
    after, events = apply_actions(state, "A", actions)
    assert after == state
    assert _kinds(events) == ["invalid"]


def test_parse_action_returns_normalised_action() -> None:
    assert parse_action({"type": " ranged_attack ", "direction": "up"}) == Action("RANGED_ATTACK")
    assert parse_action({"type": "MOVE", "direction": "Left"}) == Action("MOVE", "left")


def test_end_turn_refills_energy_up_to_cap_and_swaps() -> None:
    state = _arena(user={"energy": 1})
    after = end_turn(state)
    assert after.to_move == "U"
    assert after.turn == 2
    assert after.user.energy == 5
    again = end_turn(end_turn(state))
    assert again.agent.energy == 6  # capped at max_energy
    assert again.to_move == "A"


def test_path_distance_goes_around_walls() -> None:
    state = state_from_map(["A#U", ".#.", "..."])
    assert path_distance(state, state.agent.pos, state.user.pos) == 6
    walled = state_from_map(["A#U", "##.", "..."])
    assert path_distance(walled, walled.agent.pos, walled.user.pos) is None


def test_state_to_text_renders_map_and_stats() -> None:
    state = state_from_map(["AH.", ".#^", "E.U"], agent={"hp": 7, "energy": 4})
    text = state_to_text(state)
    assert "    0 1 2\n 0  A H .\n 1  . # ^\n 2  E . U" in text
    assert "A (you): row 0, col 0, hp 7/10, energy 4/6, shield down" in text
    assert "U (opponent): row 2, col 2, hp 10/10, energy 6/6, shield down" in text
    assert text.startswith("Turn 1, A to move.")


def test_state_dict_round_trip_equal() -> None:
    for row in generate_states(20, seed=4):
        state = state_from_dict(row["state"])
        assert state_from_dict(state_to_dict(state)) == state
        assert state_from_json(state_to_json(state)) == state
        assert state_to_dict(state) == row["state"]


def test_state_from_dict_partial_rules_take_defaults() -> None:
    data = state_to_dict(_arena())
    data["rules"] = {"attack_damage": 5}
    state = state_from_dict(data)
    assert state.rules == Rules(attack_damage=5)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d.update(size=2), "size"),
        (lambda d: d["units"]["A"].update(row=2, col=2), "inside a wall"),
        (lambda d: d["units"]["A"].update(row=1, col=3), "same tile"),
        (lambda d: d["units"]["A"].update(hp=True), "integer"),
        (lambda d: d["units"]["A"].update(energy=99), "energy"),
        (lambda d: d["units"].pop("U"), "units"),
        (lambda d: d.update(rules={"laser": 1}), "unknown rules"),
        (lambda d: d.update(walls=[[9, 9]]), "outside"),
        (lambda d: d.update(items=[{"row": 0, "col": 0, "kind": "gold"}]), "kind"),
        (lambda d: d.update(to_move="B"), "to_move"),
    ],
)
def test_state_from_dict_bad_state_raises_value_error(change: Any, fragment: str) -> None:
    data = state_to_dict(_arena())
    change(data)
    with pytest.raises(ValueError, match=fragment):
        state_from_dict(data)


def test_state_from_json_not_json_raises_value_error() -> None:
    with pytest.raises(ValueError, match="JSON"):
        state_from_json("{nope")

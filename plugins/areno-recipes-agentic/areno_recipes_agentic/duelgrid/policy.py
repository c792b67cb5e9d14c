"""A scripted DuelGrid opponent: chase and hit, greedily and deterministically.

Each step of its turn it picks the first of these that applies and that it can afford:

1. pick up a useful item it stands on (health when hurt, energy when not full);
2. when adjacent: ATTACK, or raise a SHIELD when it cannot afford an attack;
3. when it could walk next to the foe and still afford an ATTACK: step along a shortest
   path (trap-free if one exists);
4. RANGED_ATTACK when the foe is in line of sight and range;
5. otherwise step toward the foe.

It stops when nothing applies. Ties between paths are broken in the order up, down, left,
right, so the same state always gives the same actions.
"""

from __future__ import annotations

from typing import Any

from areno_recipes_agentic.duelgrid.rules import (
    GameState,
    apply_actions,
    end_turn,
    first_step,
    line_of_sight_blocker,
    path_distance,
)


def greedy_policy(state: GameState, unit: str) -> list[dict[str, Any]]:
    """The action sequence the scripted opponent plays for ``unit`` from ``state``."""
    actions: list[dict[str, Any]] = []
    current = state
    for _ in range(state.rules.max_actions):
        if current.is_over:
            break
        action = _next_action(current, unit)
        if action is None:
            break
        after, events = apply_actions(current, unit, [action])
        if any(e.kind == "invalid" for e in events):
            break
        actions.append(action)
        current = after
    return actions


def play_scripted_turn(state: GameState) -> tuple[GameState, list[dict[str, Any]]]:
    """Play the unit to move with :func:`greedy_policy`, then hand the turn over."""
    unit = state.to_move
    actions = greedy_policy(state, unit)
    after, _ = apply_actions(state, unit, actions)
    return end_turn(after), actions


def _next_action(state: GameState, unit: str) -> dict[str, Any] | None:
    rules = state.rules
    me, foe = state.unit(unit), state.other(unit)
    energy = me.energy
    item = state.item_at(me.pos)
    if item is not None and energy >= rules.pickup_cost:
        useful = me.hp < rules.max_hp if item.kind == "health" else energy < rules.max_energy
        if useful:
            return {"type": "PICKUP"}
    distance = path_distance(state, me.pos, foe.pos)
    if distance == 1:
        if energy >= rules.attack_cost:
            return {"type": "ATTACK"}
        if not me.shielded and energy >= rules.shield_cost:
            return {"type": "SHIELD"}
        return None
    step = _step_toward(state, unit)
    if (
        distance is not None
        and step is not None
        and (distance - 1) * rules.move_cost + rules.attack_cost <= energy
    ):
        return {"type": "MOVE", "direction": step}
    aligned = me.row == foe.row or me.col == foe.col
    in_range = abs(me.row - foe.row) + abs(me.col - foe.col) <= rules.ranged_range
    if (
        aligned
        and in_range
        and energy >= rules.ranged_cost
        and line_of_sight_blocker(state, me.pos, foe.pos) is None
    ):
        return {"type": "RANGED_ATTACK"}
    if step is not None and energy >= rules.move_cost:
        return {"type": "MOVE", "direction": step}
    return None


def _step_toward(state: GameState, unit: str) -> str | None:
    me, foe = state.unit(unit), state.other(unit)
    step = first_step(state, me.pos, foe.pos, avoid=state.traps)
    if step is None:
        step = first_step(state, me.pos, foe.pos)
    return step


__all__ = ["greedy_policy", "play_scripted_turn"]

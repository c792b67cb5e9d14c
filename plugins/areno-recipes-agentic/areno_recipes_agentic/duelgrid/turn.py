"""One DuelGrid turn, scored: the rule engine plays the actions and the components of the
reward are measured (see :mod:`areno_recipes_agentic.duelgrid.reward` for the formula), and
the ways a completion names its actions (tool-call arguments or a JSON object in text)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from areno_recipes_agentic.duelgrid.rules import (
    AGENT,
    USER,
    Event,
    GameState,
    apply_actions,
    path_distance,
)

WEIGHTS: Mapping[str, float] = {
    "damage": 0.40,
    "approach": 0.20,
    "pickup": 0.15,
    "efficiency": 0.10,
    "safety": 0.15,
}
INVALID_FACTOR = 0.5
TEXT_FALLBACK_FACTOR = 0.5
_MAX_JSON_STARTS = 64


@attrs.frozen
class TurnScore:
    """The score of one turn and its parts (see the module docstring)."""

    total: float
    damage: float
    approach: float
    pickup: float
    efficiency: float
    safety: float
    invalid: bool
    died: bool
    state: GameState
    events: tuple[Event, ...]


def score_turn(state: GameState, actions: Sequence[Any]) -> TurnScore:
    """Apply ``actions`` for A to ``state`` and score the outcome (factor 1)."""
    rules = state.rules
    after, events = apply_actions(state, AGENT, actions)
    invalid = any(e.kind == "invalid" for e in events)
    died = after.agent.hp <= 0 < state.agent.hp

    dealt = sum(e.amount for e in events if e.kind == "damage" and e.unit == USER)
    defeated = after.user.hp <= 0
    damage = 1.0 if defeated else min(1.0, dealt / max(1, 2 * rules.attack_damage))

    d_before = path_distance(state, state.agent.pos, state.user.pos)
    d_after = path_distance(after, after.agent.pos, after.user.pos)
    if dealt > 0 or d_after == 1:
        approach = 1.0
    elif d_before is None or d_after is None or d_before <= 1:
        approach = 0.0
    else:
        approach = clip_unit((d_before - d_after) / (d_before - 1))

    gained = sum(e.amount for e in events if e.kind == "pickup" and e.unit == AGENT)
    pickup = min(1.0, gained / max(1, rules.health_restore, rules.energy_restore))

    available = state.agent.energy
    useful = 0
    visited = {state.agent.pos}
    for event in events:
        if event.unit != AGENT:
            continue
        if event.kind == "move" and event.pos is not None:
            if event.pos not in visited and event.pos not in state.traps:
                useful += event.energy
            visited.add(event.pos)
        elif event.kind in ("attack", "ranged_attack", "shield") or (
            event.kind == "pickup" and event.amount > 0
        ):
            useful += event.energy
    efficiency = 1.0 if available <= 0 else min(1.0, useful / available)

    trap_loss = sum(e.amount for e in events if e.kind == "trap" and e.unit == AGENT)
    safety = 1.0 - min(1.0, trap_loss / max(1, rules.trap_damage))

    parts = {
        "damage": damage,
        "approach": approach,
        "pickup": pickup,
        "efficiency": efficiency,
        "safety": safety,
    }
    total = sum(WEIGHTS[k] * v for k, v in parts.items())
    if invalid:
        total *= INVALID_FACTOR
    if died:
        total = 0.0
    return TurnScore(
        total=clip_unit(total),
        damage=damage,
        approach=approach,
        pickup=pickup,
        efficiency=efficiency,
        safety=safety,
        invalid=invalid,
        died=died,
        state=after,
        events=tuple(events),
    )


def actions_from_arguments(arguments: Any) -> list[Any] | None:
    """The action list in decoded tool arguments: ``{"actions": [...]}`` or a bare list."""
    if isinstance(arguments, Mapping):
        arguments = arguments.get("actions")
    return list(arguments) if isinstance(arguments, list) else None


def actions_from_text(text: str) -> list[Any] | None:
    """The ``actions`` list of the last JSON object in ``text`` that has one, or None."""
    decoder = json.JSONDecoder()
    starts = [i for i, ch in enumerate(text) if ch == "{"][-_MAX_JSON_STARTS:]
    for start in reversed(starts):
        try:
            value, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict) and isinstance(value.get("actions"), list):
            return list(value["actions"])
    return None


def clip_unit(value: float) -> float:
    """``value`` clipped to [0, 1]."""
    return min(1.0, max(0.0, float(value)))


__all__ = [
    "INVALID_FACTOR",
    "TEXT_FALLBACK_FACTOR",
    "WEIGHTS",
    "TurnScore",
    "actions_from_arguments",
    "actions_from_text",
    "clip_unit",
    "score_turn",
]

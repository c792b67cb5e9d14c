"""DuelGrid reward: play the model's turn with the rule engine and score what happened.

Where the actions come from:

* ``mode: "tool"`` (the default): the ``actions`` argument of the first ``choose_action`` tool
  call (arguments as a JSON string or a dict; a bare list is taken as the actions). Without
  such a call, a JSON object ``{"actions": [...]}`` in the completion text is used instead and
  the score is multiplied by ``TEXT_FALLBACK_FACTOR`` (0.5).
* ``mode: "text"``: the last JSON object with an ``actions`` list in the completion (after
  removing ``<think>...</think>``), at full weight.

The actions are applied for ``A`` to the row's ``state`` (one turn; the opponent does not
reply). With ``E`` the energy A had at the start of the turn, the components, each in [0, 1]:

* ``damage``: 1 when U is defeated, else ``min(1, dealt / (2 * attack_damage))``;
* ``approach``: 1 when A dealt damage or ends next to U; otherwise the share of the walking
  distance to U that A closed, ``(d_before - d_after) / (d_before - 1)`` clipped to [0, 1]
  (0 when A started next to U and walked away, or there is no path);
* ``pickup``: ``min(1, gained / max(health_restore, energy_restore))``, where ``gained`` is
  the hit points and energy the pickups actually added;
* ``efficiency``: energy spent on useful actions over ``E`` (1 when ``E`` is 0). Attacks,
  shields, pickups that gain something and moves onto a tile A has not stood on this turn
  (and that is not a trap) are useful; back-and-forth steps and trap steps are not;
* ``safety``: ``1 - min(1, trap hit points lost / trap_damage)``.

``reward = 0.40 damage + 0.20 approach + 0.15 pickup + 0.10 efficiency + 0.15 safety``,
halved when an action was rejected (the valid actions before it still count), times the
text-fallback factor where it applies. A turn in which A dies scores 0; no readable action
list scores 0; an empty list scores 0.15 when A is not next to U.

A multi-turn record (two or more assistant messages, as the ``duelgrid`` agent produces) is
replayed from the row's state with :func:`~areno_recipes_agentic.duelgrid.episode.score_episode`:
each reply is scored as above on the state it was made in, the scripted opponent answers
between replies, and the turn scores are averaged, with one extra 0 when the opponent's reply
defeats A. The reward never raises.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from areno_recipes_agentic.duelgrid.loader import read_state
from areno_recipes_agentic.duelgrid.rules import (
    AGENT,
    USER,
    Event,
    GameState,
    apply_actions,
    path_distance,
)
from areno_recipes_agentic.duelgrid.tools import TOOL_NAME
from areno_recipes_agentic.toolcalls import (
    answer_text,
    assistant_turns,
    first_call_arguments,
    record_row,
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
        approach = _clip((d_before - d_after) / (d_before - 1))

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
        total=_clip(total),
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


def duelgrid_reward_fn(record: Any) -> float:
    """Score one sample of a DuelGrid row (``record.row`` holds ``state`` and ``mode``)."""
    try:
        row = record_row(record)
        state = read_state(row.get("state"))
        turns = assistant_turns(record)
        if turns is not None:
            from areno_recipes_agentic.duelgrid.episode import score_episode

            return score_episode(state, turns, row.get("mode", "tool")).total
        factor = 1.0
        if row.get("mode", "tool") == "text":
            actions = actions_from_text(answer_text(record))
        else:
            found, arguments = first_call_arguments(record, TOOL_NAME)
            if found:
                actions = actions_from_arguments(arguments)
            else:
                actions = actions_from_text(answer_text(record))
                factor = TEXT_FALLBACK_FACTOR
        if actions is None:
            return 0.0
        return _clip(score_turn(state, actions).total * factor)
    except Exception:  # a reward must not take a run down over one odd sample
        return 0.0


def _clip(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


__all__ = [
    "INVALID_FACTOR",
    "TEXT_FALLBACK_FACTOR",
    "WEIGHTS",
    "TurnScore",
    "actions_from_arguments",
    "actions_from_text",
    "duelgrid_reward_fn",
    "score_turn",
]

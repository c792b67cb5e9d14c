"""Dataset loader for DuelGrid rows: turns a state into a chat prompt for unit ``A``.

Input row: ``state`` (required; a state dict or its JSON text, with ``A`` to move and the game
not over), optionally ``mode`` (``"tool"``, the default, or ``"text"``), ``turns`` (how many
rounds the ``duelgrid`` agent plays, 1 to 16; when above 1 the prompt says the game goes on)
and any other fields.

Output row: every input field, with ``state`` normalised to a dict, plus ``mode``, ``prompt``
(system + user chat messages) and, in tool mode, ``tools`` (the ``choose_action`` schema).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from areno_core.errors import DatasetError
from areno_recipes_agentic.duelgrid.rules import (
    AGENT,
    GameState,
    Rules,
    state_from_dict,
    state_to_dict,
    state_to_text,
)
from areno_recipes_agentic.duelgrid.tools import TOOL_NAME, choose_action_tool

MODES = ("tool", "text")
MAX_ROW_TURNS = 16

TOOL_INSTRUCTION = (
    "Plan your whole turn, then call the `{tool}` tool once with your actions, for example "
    '{{"actions": [{{"type": "MOVE", "direction": "left"}}, {{"type": "ATTACK"}}]}}.'
)
TEXT_INSTRUCTION = (
    "Plan your whole turn, then end your reply with one JSON object holding your actions, for "
    'example {"actions": [{"type": "MOVE", "direction": "left"}, {"type": "ATTACK"}]}.'
)


def rules_text(rules: Rules) -> str:
    """The rules of DuelGrid with this state's numbers, addressed to the player of ``A``."""
    return (
        "You are playing DuelGrid, a turn-based duel on a square grid. You control unit A; "
        "your opponent controls unit U. Reduce U's hit points to 0 before it does the same "
        "to you.\n\n"
        "Each turn you spend energy on a list of actions, done in order:\n"
        f"- MOVE with a direction (up, down, left or right): step one tile; {rules.move_cost} "
        "energy. You cannot step into a wall (#), onto U or off the map. Up goes toward "
        "row 0, left toward column 0.\n"
        f"- ATTACK: hit U for {rules.attack_damage} damage when it is on a tile directly next to "
        f"you (not diagonal); {rules.attack_cost} energy.\n"
        f"- RANGED_ATTACK: hit U for {rules.ranged_damage} damage when it is in your row or "
        f"column, at most {rules.ranged_range} tiles away, with no wall in between; "
        f"{rules.ranged_cost} energy.\n"
        f"- PICKUP: collect the pickup on your tile; H heals {rules.health_restore} hit points, "
        f"E gives {rules.energy_restore} energy (up to your maximum); {rules.pickup_cost} "
        "energy. Walking over a pickup does not collect it.\n"
        f"- SHIELD: the next damage you take is halved (rounded down); {rules.shield_cost} "
        "energy. Only one shield can be up at a time.\n\n"
        f"Stepping onto a trap (^) costs {rules.trap_damage} hit points, every time. At the "
        f"start of each turn a unit gains {rules.energy_per_turn} energy, up to "
        f"{rules.max_energy}; at most {rules.max_actions} actions fit in one turn. The first "
        "action that cannot be done (too little energy, blocked, no target) is rejected and "
        "ends your turn, so plan carefully."
    )


def turn_instruction(mode: str = "tool") -> str:
    """How to answer: call the tool (tool mode) or end with a JSON object (text mode)."""
    return TOOL_INSTRUCTION.format(tool=TOOL_NAME) if mode == "tool" else TEXT_INSTRUCTION


def duelgrid_prompt(state: GameState, mode: str = "tool", turns: int = 1) -> list[dict[str, str]]:
    """The chat messages asking the model to play ``A``'s turn in ``state``.

    With ``turns`` above 1 the user message says the game goes on for that many of A's turns,
    with U's reply and the new state shown after each one.
    """
    more = ""
    if turns > 1:
        more = (
            f"\n\nThis game lasts up to {turns} of your turns. After each one you will see "
            "what your actions did, U's reply and the new state."
        )
    text = state_to_text(state, viewer=AGENT)
    user = f"The current state:\n\n{text}{more}\n\nYour turn. {turn_instruction(mode)}"
    return [
        {"role": "system", "content": rules_text(state.rules)},
        {"role": "user", "content": user},
    ]


def read_state(value: Any) -> GameState:
    """A state from a row's ``state`` value (dict or JSON text); ValueError when it is bad."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"'state' is text but not JSON: {exc}") from exc
    return state_from_dict(value)


def duelgrid_loader(row: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a DuelGrid row into a prompt row; DatasetError for a bad or finished state."""
    if not isinstance(row, Mapping):
        raise DatasetError(f"a DuelGrid row must be a dict, got {type(row).__name__}")
    row_id = row.get("id", "?")
    if "state" not in row:
        raise DatasetError(f"DuelGrid row {row_id} has no 'state'; keys: {sorted(row)}")
    try:
        state = read_state(row["state"])
    except ValueError as exc:
        raise DatasetError(f"DuelGrid row {row_id}: bad 'state': {exc}") from exc
    if state.to_move != AGENT:
        raise DatasetError(f"DuelGrid row {row_id}: it must be A's turn, not {state.to_move}'s")
    if state.is_over:
        raise DatasetError(f"DuelGrid row {row_id}: the game is already over")
    mode = row.get("mode") or "tool"
    if mode not in MODES:
        raise DatasetError(f"DuelGrid row {row_id}: 'mode' must be one of {MODES}")
    turns = row.get("turns", 1)
    if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= MAX_ROW_TURNS:
        raise DatasetError(
            f"DuelGrid row {row_id}: 'turns' must be an integer from 1 to {MAX_ROW_TURNS}, "
            f"got {turns!r}"
        )
    out = dict(row)
    out["state"] = state_to_dict(state)
    out["mode"] = mode
    out["prompt"] = duelgrid_prompt(state, mode, turns)
    if mode == "tool":
        out["tools"] = [choose_action_tool()]
    else:
        out.pop("tools", None)
    return out


__all__ = [
    "MAX_ROW_TURNS",
    "MODES",
    "duelgrid_loader",
    "duelgrid_prompt",
    "read_state",
    "rules_text",
    "turn_instruction",
]

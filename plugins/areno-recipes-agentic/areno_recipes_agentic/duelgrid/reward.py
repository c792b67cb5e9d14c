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

from typing import Any

from areno_recipes_agentic.duelgrid.episode import score_episode
from areno_recipes_agentic.duelgrid.loader import read_state
from areno_recipes_agentic.duelgrid.tools import TOOL_NAME
from areno_recipes_agentic.duelgrid.turn import (
    TEXT_FALLBACK_FACTOR,
    actions_from_arguments,
    actions_from_text,
    clip_unit,
    score_turn,
)
from areno_recipes_agentic.toolcalls import (
    answer_text,
    assistant_turns,
    first_call_arguments,
    record_row,
)


def duelgrid_reward_fn(record: Any) -> float:
    """Score one sample of a DuelGrid row (``record.row`` holds ``state`` and ``mode``)."""
    try:
        row = record_row(record)
        state = read_state(row.get("state"))
        turns = assistant_turns(record)
        if turns is not None:
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
        return clip_unit(score_turn(state, actions).total * factor)
    except Exception:  # a reward must not take a run down over one odd sample
        return 0.0


__all__ = ["duelgrid_reward_fn"]

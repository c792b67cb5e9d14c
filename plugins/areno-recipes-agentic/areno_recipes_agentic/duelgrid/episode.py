"""DuelGrid games as the model plays them: reading a reply, playing a round, scoring a game.

The agent (which plays the game while it talks to the model), the reward (which replays the
game from the row's state and the model's messages) and the browser UI all go through these
functions, so a reply is read and the game advances in exactly the same way everywhere.

A *round* is the model's turn as ``A`` followed, unless the game ended, by the scripted
opponent's reply as ``U`` (:func:`~areno_recipes_agentic.duelgrid.policy.greedy_policy`); after
it, ``A`` is to move again with its per-turn energy. Nothing here is random.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from areno_recipes_agentic.duelgrid.policy import greedy_policy
from areno_recipes_agentic.duelgrid.rules import (
    AGENT,
    USER,
    Event,
    GameState,
    apply_actions,
    end_turn,
    state_to_text,
)
from areno_recipes_agentic.duelgrid.tools import TOOL_NAME
from areno_recipes_agentic.duelgrid.turn import (
    TEXT_FALLBACK_FACTOR,
    actions_from_arguments,
    actions_from_text,
    score_turn,
)
from areno_recipes_agentic.toolcalls import AssistantTurn, first_named_call

# How many rounds an episode plays when the row does not say (``row["turns"]``), and at most.
DEFAULT_TURNS = 2
MAX_TURNS = 16


@attrs.frozen
class TurnChoice:
    """The actions one reply chose and where they came from.

    ``source`` is ``"tool"`` (a ``choose_action`` call), ``"text"`` (a JSON object in the
    reply text) or ``"none"``; ``actions`` is None when nothing readable was found.
    ``factor`` is what the turn's score is multiplied by: the text fallback of tool mode
    counts half.
    """

    actions: tuple[Any, ...] | None
    source: Literal["tool", "text", "none"]
    factor: float = 1.0


def read_choice(turn: AssistantTurn, mode: str = "tool") -> TurnChoice:
    """The actions of one assistant message, read as the reward reads them."""
    if mode == "text":
        actions = actions_from_text(turn.text)
        return TurnChoice(_tuple(actions), "text" if actions is not None else "none")
    found, arguments = first_named_call(turn.tool_calls, TOOL_NAME)
    if found:
        return TurnChoice(_tuple(actions_from_arguments(arguments)), "tool")
    actions = actions_from_text(turn.text)
    if actions is None:
        return TurnChoice(None, "none")
    return TurnChoice(_tuple(actions), "text", TEXT_FALLBACK_FACTOR)


@attrs.frozen
class Round:
    """What one round did: A's actions and events, then U's (empty when the game ended)."""

    before: GameState
    agent_actions: tuple[Any, ...]
    agent_events: tuple[Event, ...]
    user_actions: tuple[Any, ...]
    user_events: tuple[Event, ...]
    after: GameState
    user_played: bool = False

    @property
    def lost_in_reply(self) -> bool:
        """A survived its own turn but U's reply defeated it."""
        return bool(self.user_events) and self.after.winner == USER

    @property
    def over(self) -> bool:
        return self.after.is_over


def play_round(state: GameState, actions: Sequence[Any]) -> Round:
    """A plays ``actions`` in ``state`` (A to move), then U replies with the scripted policy."""
    if state.to_move != AGENT:
        raise ValueError(f"a round starts with A to move, not {state.to_move}")
    after_a, a_events = apply_actions(state, AGENT, list(actions))
    if after_a.is_over:
        return Round(state, tuple(actions), tuple(a_events), (), (), after_a)
    handed = end_turn(after_a)
    if handed.is_over:  # the turn limit
        return Round(state, tuple(actions), tuple(a_events), (), (), handed)
    u_actions = greedy_policy(handed, USER)
    after_u, u_events = apply_actions(handed, USER, u_actions)
    after = after_u if after_u.is_over else end_turn(after_u)
    return Round(
        state, tuple(actions), tuple(a_events), tuple(u_actions), tuple(u_events), after, True
    )


def applied_prefix(actions: Sequence[Any], events: Sequence[Event]) -> list[Any]:
    """The part of ``actions`` the engine looked at: up to and including a rejected action
    (replaying the prefix gives the same state and events), without skipped ones."""
    for event in events:
        if event.kind == "invalid":
            return list(actions[: event.index + 1])
        if event.kind == "skipped":
            return list(actions[: event.index])
    return list(actions)


def round_entries(played: Round) -> list[dict[str, Any]]:
    """The round as game-record entries ``{"unit", "actions"}``: A's turn, then U's when U
    played (possibly doing nothing). See :func:`replay`."""
    own = applied_prefix(played.agent_actions, played.agent_events)
    entries = [{"unit": AGENT, "actions": own}]
    if played.user_played:
        entries.append({"unit": USER, "actions": list(played.user_actions)})
    return entries


@attrs.frozen
class Frame:
    """One turn of a replayed game: who played what, what happened, the state after it."""

    unit: str
    actions: tuple[Any, ...]
    events: tuple[Event, ...]
    state: GameState


def replay(start: GameState, entries: Sequence[Any], *, max_entries: int = 1000) -> list[Frame]:
    """Replay a game record: from ``start``, each entry ``{"unit", "actions"}`` is one turn of
    that unit; its actions are applied, then the turn is handed over unless the game is over.
    ValueError for a malformed entry, an entry for the unit not to move, or a turn after the
    game ended. Only the first ``max_entries`` entries are read."""
    frames: list[Frame] = []
    state = start
    for number, entry in enumerate(list(entries)[:max_entries], start=1):
        if not isinstance(entry, Mapping):
            raise ValueError(f"turn {number}: expected an object, got {type(entry).__name__}")
        unit, actions = entry.get("unit"), entry.get("actions", [])
        if unit not in (AGENT, USER):
            raise ValueError(f"turn {number}: 'unit' must be 'A' or 'U', got {unit!r}")
        if not isinstance(actions, list):
            raise ValueError(f"turn {number}: 'actions' must be a list")
        if state.is_over:
            raise ValueError(f"turn {number}: the game was already over")
        if state.to_move != unit:
            raise ValueError(f"turn {number}: it is {state.to_move}'s turn, not {unit}'s")
        after, events = apply_actions(state, unit, actions)
        state = after if after.is_over else end_turn(after)
        frames.append(Frame(unit, tuple(actions), tuple(events), state))
    return frames


@attrs.frozen
class EpisodeScore:
    """The score of a multi-turn game and its per-round parts."""

    total: float
    turn_scores: tuple[float, ...]
    rounds: tuple[Round, ...]
    final: GameState


def score_episode(
    state: GameState, turns: Sequence[AssistantTurn], mode: str = "tool"
) -> EpisodeScore:
    """Replay the model's replies round by round from ``state`` and average the turn scores.

    Each reply is scored with :func:`~areno_recipes_agentic.duelgrid.reward.score_turn` on the
    state it was made in (times the text-fallback factor; 0 when unreadable, and then A does
    nothing that turn). When U's reply defeats A, one more 0 is averaged in. Replies after the
    game ended are ignored, and at most ``MAX_TURNS`` are read.
    """
    scores: list[float] = []
    rounds: list[Round] = []
    for turn in turns[:MAX_TURNS]:
        if state.is_over or state.to_move != AGENT:
            break
        choice = read_choice(turn, mode)
        actions = choice.actions or ()
        if choice.actions is None:
            scores.append(0.0)
        else:
            scores.append(score_turn(state, actions).total * choice.factor)
        played = play_round(state, actions)
        rounds.append(played)
        state = played.after
        if played.lost_in_reply:
            scores.append(0.0)
    total = sum(scores) / len(scores) if scores else 0.0
    return EpisodeScore(min(1.0, max(0.0, total)), tuple(scores), tuple(rounds), state)


# -- messages -------------------------------------------------------------------------------


def describe_events(events: Sequence[Event]) -> list[str]:
    """One line per event, rejected actions spelled out."""
    lines = []
    for event in events:
        if event.kind == "invalid":
            lines.append(
                f"- action {event.index + 1} rejected: {event.text}; the rest of the turn "
                "was skipped"
            )
        else:
            lines.append(f"- {event.text}")
    return lines


def agent_outcome(choice: TurnChoice, played: Round) -> str:
    """What A's own turn did, addressed to the model."""
    if choice.actions is None:
        return "No action list could be read from your reply, so you did nothing this turn."
    lines = describe_events(played.agent_events)
    if not lines:
        return "You did nothing this turn."
    fallback = choice.source == "text" and choice.factor < 1.0  # tool mode, no tool call
    head = "Your actions were read from your reply text. " if fallback else ""
    return head + "What happened:\n" + "\n".join(lines)


def opponent_report(played: Round) -> str:
    """U's reply and the resulting state, addressed to the model."""
    if played.user_actions or played.user_events:
        names = ", ".join(_action_name(a) for a in played.user_actions) or "nothing"
        head = f"U played: {names}.\n" + "\n".join(describe_events(played.user_events))
    elif not played.after.is_over:
        head = "U did nothing on its turn."
    else:  # the game ended during A's turn
        head = ""
    text = state_to_text(played.after, viewer=AGENT)
    return f"{head}\n\nThe current state:\n\n{text}".strip()


def _action_name(action: Any) -> str:
    if isinstance(action, Mapping):
        kind = str(action.get("type", "?"))
        direction = action.get("direction")
        return f"{kind} {direction}" if direction else kind
    return json.dumps(action, default=str)


def _tuple(actions: list[Any] | None) -> tuple[Any, ...] | None:
    return tuple(actions) if actions is not None else None


__all__ = [
    "DEFAULT_TURNS",
    "MAX_TURNS",
    "EpisodeScore",
    "Frame",
    "Round",
    "TurnChoice",
    "agent_outcome",
    "applied_prefix",
    "describe_events",
    "opponent_report",
    "play_round",
    "read_choice",
    "replay",
    "round_entries",
    "score_episode",
]

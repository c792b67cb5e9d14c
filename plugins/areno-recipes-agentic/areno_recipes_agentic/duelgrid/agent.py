"""DuelGrid agent: the policy plays A for several rounds against the scripted opponent U.

    areno train --recipe agentic/duelgrid            # the agent is registered as "duelgrid"
    areno train ... --agent-fn duelgrid              # or by file: .../duelgrid/agent.py

For each sample the agent keeps the conversation and the game state. Each round:

1. ask the endpoint for A's turn (the row's prompt first, with the ``choose_action`` tool in
   tool mode);
2. read the reply as the reward reads it (``episode.read_choice``) and play the round with the
   rule engine (``episode.play_round``): A's actions, then U's scripted reply;
3. unless the game is over or this was the last round, append the assistant reply, a tool
   message per tool call (the first ``choose_action`` call gets what A's actions did; a reply
   without a call gets that as a user message instead) and a user message with U's reply, the
   new state and "your turn".

It plays ``row["turns"]`` rounds (default 2, at most 16), fewer when the game ends, and returns
an ``AgentTrajectory`` with one turn per request and the whole conversation, the last reply's
results included, as its ``messages``; ``metadata["game"]`` is the game record the browser UI
replays. Tool and user messages are observations: the core masks them from the loss unless
``--train-tool-results``. The reward replays the same rounds from the row's state (so a loss
in the opponent's last reply counts). A row with ``"turns": 1`` is the single-turn game: one
``AgentTrajectoryTurn``, scored like a direct rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)
from areno_recipes_agentic.agents import assistant_message, run_samples, tool_results
from areno_recipes_agentic.duelgrid.episode import (
    DEFAULT_TURNS,
    MAX_TURNS,
    Round,
    TurnChoice,
    agent_outcome,
    opponent_report,
    play_round,
    read_choice,
    round_entries,
)
from areno_recipes_agentic.duelgrid.loader import read_state, turn_instruction
from areno_recipes_agentic.duelgrid.rules import state_to_dict
from areno_recipes_agentic.duelgrid.tools import TOOL_NAME, choose_action_tool
from areno_recipes_agentic.toolcalls import message_turn


async def run_agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
    """Play every sample of ``batch`` for ``row["turns"]`` rounds (default 2)."""
    return await run_samples(ctx, batch, lambda client, item: play_sample(client, ctx, item))


async def play_sample(
    client: Any, ctx: AgentContext, item: AgentItem
) -> AgentTrajectoryTurn | AgentTrajectory:
    """Play one sample's game; see the module docstring."""
    row = item.row
    mode = row.get("mode") or "tool"
    start = read_state(row.get("state"))
    state = start
    rounds = row_turns(row)
    extra: dict[str, Any] = {"tools": [choose_action_tool()]} if mode == "tool" else {}
    messages: list[Mapping[str, Any]] = list(item.messages)
    turns: list[AgentTrajectoryTurn] = []
    entries: list[dict[str, Any]] = []
    for number in range(1, rounds + 1):
        response = await client.chat.completions.create(model=ctx.model, messages=messages, **extra)
        turns.append(AgentTrajectoryTurn(item=item, messages=list(messages), response=response))
        reply = assistant_message(response)
        choice = read_choice(message_turn(reply), mode)
        played = play_round(state, choice.actions or ())
        state = played.after
        entries += round_entries(played)
        last = number == rounds or played.over
        messages = [*messages, reply, *round_messages(reply, choice, played, mode, last=last)]
        if last:
            break
    metadata = {
        "rounds": len(turns),
        "winner": state.winner,
        "game": {"id": row.get("id"), "state": state_to_dict(start), "turns": entries},
    }
    if rounds == 1:  # the single-turn game: scored like a direct rollout
        return attrs.evolve(turns[0], metadata=metadata)
    return AgentTrajectory(item=item, turns=turns, metadata=metadata, messages=messages)


def row_turns(row: Mapping[str, Any]) -> int:
    """How many rounds to play for ``row``: ``row["turns"]`` (default 2), clipped to 1-16."""
    value = row.get("turns", DEFAULT_TURNS)
    if isinstance(value, bool) or not isinstance(value, int):
        return DEFAULT_TURNS
    return max(1, min(MAX_TURNS, value))


def round_messages(
    reply: Mapping[str, Any], choice: TurnChoice, played: Round, mode: str, *, last: bool
) -> list[dict[str, Any]]:
    """The messages that follow the model's ``reply`` in a round.

    Tool results first (OpenAI requires an answer to every tool call): the first
    ``choose_action`` call gets the outcome of A's actions, other calls say they were ignored.
    Then one user message with the outcome (when no call carried it), U's reply and the new
    state, and, unless ``last``, the request for the next turn.
    """
    outcome = agent_outcome(choice, played)
    out, told = tool_results(
        reply.get("tool_calls") or (), TOOL_NAME, outcome if mode == "tool" else None, "turn"
    )
    parts = [] if told else [outcome]
    parts.append(opponent_report(played))
    if played.over:
        parts.append(f"The game is over. Winner: {played.after.winner or 'nobody'}.")
    elif not last:
        parts.append(f"Your turn. {turn_instruction(mode)}")
    out.append({"role": "user", "content": "\n\n".join(parts)})
    return out


__all__ = ["play_sample", "round_messages", "row_turns", "run_agent"]

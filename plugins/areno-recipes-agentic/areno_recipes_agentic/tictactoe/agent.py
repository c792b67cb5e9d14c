"""Tic-tac-toe agent: ask the policy for its move through the OpenAI-compatible endpoint.

    areno train --recipe agentic/tictactoe           # the agent is registered as "tictactoe"
    areno train ... --agent-fn tictactoe             # or by file: .../tictactoe/agent.py

Each sample is one chat completion with the row's prompt and, in tool mode, the
``choose_square`` tool: one ``AgentTrajectoryTurn`` per sample, which the reward scores.

Forced calls: a row with ``"tool_choice": "choose_square"`` sends
``tool_choice={"type": "function", "function": {"name": "choose_square"}}``, so the endpoint
starts every reply with the call and the model only writes its arguments (the CPU recipe's
rows do this: a third of the tokens to sample and train, and a call format that RL cannot
erode). ``"required"`` and ``"auto"`` are passed through as they are.

Retries (multi-turn): a row with ``"retries": N`` (or the ``tictactoe-retry`` agent, N = 1)
gives the model up to N more attempts when its move cannot be played (no ``choose_square``
call, unreadable arguments, an occupied or out-of-range square). The agent answers the failed
call with a tool message saying what was wrong (a user message in text mode or when there was
no call) and asks again; the sample becomes an ``AgentTrajectory`` of all attempts. The tool
and user messages are observations, so they are masked from the loss; the reward scores the
first legal move and halves it per failed attempt (``tictactoe.reward.RETRY_FACTOR``).
Legal but weak moves are never retried, so the agent leaks nothing about move quality.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)
from areno_recipes_agentic.agents import assistant_message, run_samples, tool_results
from areno_recipes_agentic.tictactoe.game import legal_moves
from areno_recipes_agentic.tictactoe.reward import move_from_turn
from areno_recipes_agentic.tictactoe.tools import TOOL_NAME, choose_square_tool
from areno_recipes_agentic.toolcalls import call_name, message_turn

MAX_RETRIES = 3


async def run_agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
    """One move per sample; ``row["retries"]`` extra attempts after an unplayable move."""
    return await run_samples(ctx, batch, lambda client, item: play_sample(client, ctx, item))


async def run_agent_with_retry(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
    """Like :func:`run_agent`, with one retry unless the row sets ``retries`` itself."""
    return await run_samples(
        ctx, batch, lambda client, item: play_sample(client, ctx, item, default_retries=1)
    )


async def play_sample(
    client: Any, ctx: AgentContext, item: AgentItem, *, default_retries: int = 0
) -> AgentTrajectoryTurn | AgentTrajectory:
    """Ask for a move (and again after an unplayable one, up to the row's retries)."""
    row = item.row
    mode = row.get("mode") or "tool"
    board = str(row.get("board", ""))
    retries = _retries(row, default_retries)
    tools = row.get("tools") or [choose_square_tool()]
    extra: dict[str, Any] = {"tools": list(tools)} if mode == "tool" else {}
    if mode == "tool" and row.get("tool_choice"):
        extra["tool_choice"] = tool_choice(str(row["tool_choice"]))
    messages: list[Mapping[str, Any]] = list(item.messages)
    turns: list[AgentTrajectoryTurn] = []
    for attempt in range(retries + 1):
        response = await client.chat.completions.create(model=ctx.model, messages=messages, **extra)
        turns.append(AgentTrajectoryTurn(item=item, messages=list(messages), response=response))
        reply = assistant_message(response)
        problem = move_problem(board, reply, mode)
        if problem is None or attempt == retries:
            break
        messages = [*messages, reply, *feedback_messages(reply, problem, mode)]
    if len(turns) == 1:
        return turns[0]
    conversation = [*messages, assistant_message(turns[-1].response)]
    return AgentTrajectory(
        item=item, turns=turns, metadata={"attempts": len(turns)}, messages=conversation
    )


def tool_choice(value: str) -> Any:
    """The request's ``tool_choice`` for a row's value: ``"auto"``, ``"required"``, ``"none"``
    as they are; a function name as a named choice."""
    if value in ("auto", "required", "none"):
        return value
    return {"type": "function", "function": {"name": value}}


def move_problem(board: str, reply: Mapping[str, Any], mode: str = "tool") -> str | None:
    """Why the move in ``reply`` cannot be played on ``board``, or None when it can."""
    turn = message_turn(reply)
    square = move_from_turn(turn, mode)
    free = legal_moves(board) if len(board) == 9 else []
    free_text = ", ".join(str(m) for m in free)
    if square is None:
        if mode == "text":
            return (
                "I could not find your move. End your reply with <move>N</move>, N being a "
                f"free square: {free_text}."
            )
        if not any(call_name(c) == TOOL_NAME for c in turn.tool_calls):
            return f"You did not call `{TOOL_NAME}`. Call it once with a free square: {free_text}."
        return (
            f'The arguments of `{TOOL_NAME}` could not be read; send {{"square": N}} with N a '
            f"free square: {free_text}."
        )
    if square not in free:
        return f"Square {square} is not a free square. The free squares are: {free_text}."
    return None


def feedback_messages(reply: Mapping[str, Any], problem: str, mode: str) -> list[dict[str, Any]]:
    """The messages that answer an unplayable move: one tool message per tool call of
    ``reply`` (the first ``choose_square`` call gets ``problem``), or a user message when the
    move was not a tool call."""
    calls = list(reply.get("tool_calls") or ())
    if mode != "tool" or not calls:
        return [{"role": "user", "content": f"{problem} Try again."}]
    out, answered = tool_results(calls, TOOL_NAME, f"Error: {problem} Try again.", "reply")
    if not answered:
        out.append({"role": "user", "content": f"{problem} Try again."})
    return out


def _retries(row: Mapping[str, Any], default: int) -> int:
    value = row.get("retries", default)
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return max(0, min(MAX_RETRIES, value))


__all__ = [
    "MAX_RETRIES",
    "feedback_messages",
    "move_problem",
    "play_sample",
    "run_agent",
    "run_agent_with_retry",
    "tool_choice",
]

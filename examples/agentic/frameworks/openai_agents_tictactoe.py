"""A tic-tac-toe player written with the OpenAI Agents SDK, trained by areno unchanged.

    pip install -e ".[agents]"    # openai-agents, langgraph, langchain-openai
    areno train --recipe agentic/tictactoe-cpu --algo grpo \
        --agent-fn examples/agentic/frameworks/openai_agents_tictactoe.py \
        --max-prompt-tokens 1024 --save-path runs/agents-sdk

The agent is plain Agents SDK code: an ``Agent`` with a ``@function_tool``, run by ``Runner``
against an ``AsyncOpenAI`` client. The only areno-specific lines point the client at the
sample's own URL (``ctx.get_base_url(item)``) and return a reward per sample: areno builds the
training rows from what that URL served, so the agent never handles token data.

The episode is multi-turn: the first reply is a forced ``choose_square`` call (the SDK resets
``tool_choice`` after a tool call, so the model is then free to answer), the tool places the
mark and describes the board, and the model replies to that. The reward is 1 for an optimal
square, 0.5 for another legal one, 0 otherwise.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # the SDK would otherwise export traces to api.openai.com


def square_reward(row: dict[str, Any], square: int | None) -> float:
    if square in row.get("optimal_moves", ()):
        return 1.0
    return 0.5 if square in row.get("legal_moves", ()) else 0.0


async def play(ctx: Any, item: Any) -> float:
    board = list(item.row["board"])
    moves: list[int] = []

    @function_tool
    def choose_square(square: int) -> str:
        """Place your mark on a free square (1 to 9, left to right, top to bottom)."""
        moves.append(square)
        if not 1 <= square <= 9 or board[square - 1] != ".":
            return f"Square {square} is not free."
        board[square - 1] = item.row["player"]
        return "Board now: " + "".join(board)

    client = AsyncOpenAI(base_url=ctx.get_base_url(item), api_key=ctx.api_key, max_retries=0)
    model = OpenAIChatCompletionsModel(model=ctx.model, openai_client=client)
    agent = Agent(
        name="tictactoe",
        model=model,
        tools=[choose_square],
        model_settings=ModelSettings(tool_choice="choose_square"),
    )
    try:
        await Runner.run(
            agent,
            [dict(m) for m in item.messages],
            max_turns=3,
            run_config=RunConfig(tracing_disabled=True),
        )
    except MaxTurnsExceeded:
        pass  # the model kept calling the tool; its first move is scored all the same
    finally:
        await client.close()
    return square_reward(item.row, moves[0] if moves else None)


async def run_agent(ctx: Any, batch: Any) -> list[Any]:
    # play makes its own client, so run_each runs each sample on an event loop of its own: one
    # that blocks (a synchronous call somewhere in the framework) is dropped at its timeout
    # while the others finish.
    return await ctx.run_each(batch, lambda item: play(ctx, item))

"""A tic-tac-toe player written with smolagents, trained by areno unchanged.

    pip install -e ".[agents]"    # openai-agents, langgraph, langchain-openai, smolagents
    areno train --recipe agentic/tictactoe-cpu --algo grpo --temperature 0.3 \
        --agent-fn examples/agentic/frameworks/smolagents_tictactoe.py \
        --max-prompt-tokens 1024 --save-path runs/smolagents

The agent is smolagents' own ``ToolCallingAgent`` with a ``@tool``, talking to the policy
through its OpenAI-compatible model class (``OpenAIServerModel``) pointed at the sample's own
URL (``ctx.get_base_url(item)``), with ``stream_outputs=True``, so every reply arrives as
streamed chunks and smolagents puts the tool call together from them. It returns a reward per
sample; areno builds the rows from what the URL served.

The episode is multi-turn: the model calls ``choose_square``, smolagents runs it and sends the
observation back, and the model is asked for its next call. The reward is 1 for an optimal
first square, 0.5 for another legal one, 0 otherwise.

How it differs from the other framework examples:

* smolagents is synchronous: ``agent.run`` blocks until the episode ends. ``ctx.run_each``
  runs each sample on a thread with an event loop of its own (``play`` makes its own model
  object), so the samples still play at the same time and one that hangs is dropped at its
  timeout without holding up the others;
* smolagents sends its history back as text (``Calling tools: [...]``, ``Observation: ...``)
  rather than as the assistant messages the endpoint returned, so a request that follows a
  tool call does not extend the earlier one token for token: areno trains each such request as
  a conversation of its own (see "Branches" in docs/agentic.md), every sampled token once, all
  with the sample's reward;
* the settings suit the recipe's 0.8M-parameter model, which was trained on prompts without a
  system message and with the tool named in ``tool_choice`` (it cannot pick a tool by name):
  an empty system prompt (``prompt_templates``, smolagents' documented way to change it) and a
  named ``tool_choice``, which ``OpenAIServerModel`` forwards to the API. It forwards it to
  every request, so the last one, which asks for a final answer without tools, is answered
  ``400`` (as OpenAI answers a ``tool_choice`` without ``tools``), and smolagents ends the run
  with that error as its answer. A real model needs neither setting.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from smolagents import AgentLogger, LogLevel, OpenAIServerModel, ToolCallingAgent, tool


def square_reward(row: dict[str, Any], square: int | None) -> float:
    if square in row.get("optimal_moves", ()):
        return 1.0
    return 0.5 if square in row.get("legal_moves", ()) else 0.0


def build_agent(ctx: Any, item: Any, moves: list[int]) -> ToolCallingAgent:
    board = list(item.row["board"])

    @tool
    def choose_square(square: int) -> str:
        """Place your mark on a free square.

        Args:
            square: The square to mark, 1 to 9, left to right and top to bottom.
        """
        moves.append(square)
        if not 1 <= square <= 9 or board[square - 1] != ".":
            return f"Square {square} is not free."
        board[square - 1] = item.row["player"]
        return "Board now: " + "".join(board)

    model = OpenAIServerModel(
        model_id=ctx.model,
        api_base=ctx.get_base_url(item),
        api_key=ctx.api_key,
        client_kwargs={"max_retries": 0},
        tool_choice={"type": "function", "function": {"name": "choose_square"}},
    )
    agent = ToolCallingAgent(
        tools=[choose_square],
        model=model,
        max_steps=2,
        stream_outputs=True,
        logger=AgentLogger(level=LogLevel.OFF, console=Console(quiet=True)),  # many at once
    )
    agent.prompt_templates["system_prompt"] = ""  # the recipe's model knows no system prompt
    return agent


async def play(ctx: Any, item: Any) -> float:
    moves: list[int] = []
    agent = build_agent(ctx, item, moves)
    task = item.messages[-1]["content"]  # "You play X.\n<board>\nCall choose_square."
    agent.run(task)  # synchronous: blocks this sample's own thread only (see above)
    return square_reward(item.row, moves[0] if moves else None)


async def run_agent(ctx: Any, batch: Any) -> list[Any]:
    return await ctx.run_each(batch, lambda item: play(ctx, item))

"""A tic-tac-toe player written with LangGraph and ``langchain-openai``, trained by areno
unchanged.

    pip install -e ".[agents]"    # openai-agents, langgraph, langchain-openai
    areno train --recipe agentic/tictactoe-cpu --algo grpo \
        --agent-fn examples/agentic/frameworks/langgraph_tictactoe.py \
        --max-prompt-tokens 1024 --save-path runs/langgraph

The graph is LangGraph's tool-calling loop: a model node (``ChatOpenAI`` with the tool bound)
and a ``ToolNode``, joined by ``tools_condition``. The first model call forces the
``choose_square`` tool, later ones leave the choice to the model. The only areno-specific
line points ``ChatOpenAI`` at the sample's own URL (``ctx.get_base_url(item)``); the agent
returns nothing, so areno builds the rows from what that URL served and the run's reward
function (``tictactoe``) scores the final conversation.
"""

from __future__ import annotations

import contextlib
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


def build_graph(llm: ChatOpenAI, item: Any) -> Any:
    board = list(item.row["board"])

    @tool
    def choose_square(square: int) -> str:
        """Place your mark on a free square (1 to 9, left to right, top to bottom)."""
        if not 1 <= square <= 9 or board[square - 1] != ".":
            return f"Square {square} is not free."
        board[square - 1] = item.row["player"]
        return "Board now: " + "".join(board)

    tools = [choose_square]
    first = llm.bind_tools(tools, tool_choice="choose_square")
    later = llm.bind_tools(tools)

    async def model(state: MessagesState) -> dict[str, Any]:
        answered = any(isinstance(m, AIMessage) for m in state["messages"])
        reply = await (later if answered else first).ainvoke(state["messages"])
        return {"messages": [reply]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


async def play(ctx: Any, item: Any) -> None:
    llm = ChatOpenAI(
        model=ctx.model, base_url=ctx.get_base_url(item), api_key=ctx.api_key, max_retries=0
    )
    graph = build_graph(llm, item)
    # Two model turns at most: the forced move, then the model's reply (or another call).
    # If the model keeps calling the tool, the conversation so far is scored.
    with contextlib.suppress(GraphRecursionError):
        await graph.ainvoke({"messages": [dict(m) for m in item.messages]}, {"recursion_limit": 4})


async def run_agent(ctx: Any, batch: Any) -> list[Any]:
    # play makes its own client, so run_each runs each sample on an event loop of its own: one
    # that blocks (a synchronous call somewhere in the framework) is dropped at its timeout
    # while the others finish.
    return await ctx.run_each(batch, lambda item: play(ctx, item))

"""Coding agent: the policy may run Python through a tool for a few turns, then answers.

    areno train ... --agent-fn examples/agentic/coding/run_agent.py

For each sample the agent sends the row's prompt to the run's OpenAI-compatible endpoint
(``ctx.get_base_url()``, model ``ctx.model``, key ``ctx.api_key``) with one tool,
``run_python(code)``. While the model calls it, the agent runs the code in a sandboxed
subprocess (``coding_sandbox.run_python``: fresh temp dir, ``python -I``, ``TOOL_TIMEOUT_S``
seconds) and sends back the exit status, stdout and stderr as a tool message. The last of
``MAX_TURNS`` requests is made with ``tool_choice="none"``, so the conversation always ends
with an answer. The sample is an ``AgentTrajectory`` of every request; tool messages are
observations and are masked from the loss. ``reward.py`` scores the final reply.

The OpenAI client, the per-sample concurrency and failure handling, and reading a reply back
into a message come from the agentic pack (``areno_recipes_agentic.agents``).
"""

import asyncio

from areno_recipes_agentic.agents import assistant_message, run_samples, tool_call_id
from areno_recipes_agentic.toolcalls import call_arguments, call_name
from coding_sandbox import run_python

from areno_core.agentic import AgentTrajectory, AgentTrajectoryTurn

MAX_TURNS = 4
TOOL_TIMEOUT_S = 5.0
RUN_PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": (
            "Run a Python 3 program in a fresh interpreter (standard library only, no network, "
            f"{TOOL_TIMEOUT_S:g} s limit) and return its exit status, stdout and stderr."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program to run"}},
            "required": ["code"],
        },
    },
}


async def run_agent(ctx, batch):
    """The default function ``--agent-fn`` calls once per step with all of its samples."""
    return await run_samples(ctx, batch, lambda client, item: solve(client, ctx, item))


async def solve(client, ctx, item):
    """One sample: ask, run the requested code, and ask again, up to ``MAX_TURNS`` requests."""
    messages = list(item.messages)
    turns = []
    tool_runs = 0
    for turn in range(MAX_TURNS):
        last = turn == MAX_TURNS - 1
        response = await client.chat.completions.create(
            model=ctx.model,
            messages=messages,
            tools=[RUN_PYTHON_TOOL],  # kept in every request so the prompt only grows
            **({"tool_choice": "none"} if last else {}),
        )
        turns.append(AgentTrajectoryTurn(item=item, messages=list(messages), response=response))
        reply = assistant_message(response)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls or last:
            break
        for index, call in enumerate(calls):
            output = await call_tool(call)
            tool_runs += 1
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": tool_call_id(call, f"call_{turn}_{index}"),
                    "content": output,
                }
            )
    return AgentTrajectory(
        item=item, turns=turns, messages=messages, metadata={"tool_runs": tool_runs}
    )


async def call_tool(call):
    """The tool message text for one tool call; never raises."""
    if call_name(call) != "run_python":
        return f"error: unknown tool {call_name(call)!r}; the only tool is run_python"
    arguments = call_arguments(call)
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str):
        return 'error: call run_python with a JSON object like {"code": "print(1 + 1)"}'
    try:
        result = await asyncio.to_thread(run_python, code, timeout_s=TOOL_TIMEOUT_S)
    except Exception as exc:  # e.g. no free process slots; tell the model, keep the sample
        return f"error: could not run the code: {type(exc).__name__}: {exc}"
    return result.describe()

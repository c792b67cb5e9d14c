"""The ``vf`` agent: multi-turn verifiers episodes played through areno's endpoint.

For each sample it rebuilds the task, opens its tool servers (:mod:`areno_envs.vf.tools`)
and runs verifiers' chat loop (the ``null`` harness's: send the conversation with the tools;
answer every tool call with the tool's result; stop at a reply without tool calls) against
the sample's own endpoint URL with an OpenAI client, at most ``max_turns`` model calls. It
returns nothing: areno builds the rows from what the endpoint served, and the ``vf`` reward
scores the conversation the endpoint recorded.
"""

from __future__ import annotations

from typing import Any

from areno_envs.vf.library import taskset_class, taskset_config
from areno_envs.vf.loader import ROW_KEY
from areno_envs.vf.reward import task_of
from areno_envs.vf.tools import open_tools, tool_message


def _tool_choice(value: str) -> Any:
    if value in ("auto", "required", "none"):
        return value
    return {"type": "function", "function": {"name": value}}


async def play(ctx: Any, item: Any) -> None:
    """One episode of the sample's task against ``ctx.get_base_url(item)``."""
    meta = item.row[ROW_KEY]
    task = task_of(item.row)
    tools = await open_tools(
        task, taskset_class(meta["taskset"]), taskset_config(meta["taskset"], meta["config"])
    )
    names = [schema["function"]["name"] for schema in tools.schemas]
    if meta["tool_choice"] not in ("auto", "required", "none", *names):
        raise ValueError(
            f"the spec row's tool_choice {meta['tool_choice']!r} is not 'auto', 'required', "
            f"'none' or one of the task's tools: {', '.join(names) or 'none'}"
        )
    messages = [dict(m) for m in item.messages]
    # An AsyncOpenAI on the process's shared TLS context (openai is imported here, 1-2 s, only
    # when a vf agent plays).
    client = ctx.openai_client(item, max_retries=0)
    try:
        for turn in range(int(meta["max_turns"])):
            extra: dict[str, Any] = {}
            if tools.schemas:
                extra["tools"] = tools.schemas
                extra["tool_choice"] = _tool_choice(meta["tool_choice"] if turn == 0 else "auto")
            completion = await client.chat.completions.create(
                model=ctx.model, messages=messages, **extra
            )
            reply = completion.choices[0].message
            messages.append(reply.model_dump(exclude_none=True))
            if not reply.tool_calls:
                return
            for call in reply.tool_calls:
                content = await tools.call(call.function.name, call.function.arguments)
                messages.append(dict(tool_message(call.id, call.function.name, content)))
    finally:
        await client.close()


async def run_agent(ctx: Any, batch: Any) -> list[Any]:
    """Every sample of ``batch``, each on an event loop of its own."""
    return await ctx.run_each(batch, lambda item: play(ctx, item), isolate=True)

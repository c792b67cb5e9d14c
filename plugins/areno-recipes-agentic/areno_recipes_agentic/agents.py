"""Plumbing shared by the pack's agents: the OpenAI client, running every sample of a batch
concurrently, and turning a chat-completion response back into a conversation message.

An agent here is ``async def run_agent(ctx, batch)`` (see ``areno_core.agentic.types``): it
plays each sample of ``batch`` against the policy behind ``ctx.get_base_url()`` and returns one
``AgentTrajectoryTurn`` or ``AgentTrajectory`` per sample.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from areno_core.agentic.types import AgentBatch, AgentContext, AgentItem
from areno_recipes_agentic.toolcalls import call_name


def make_client(ctx: AgentContext) -> Any:
    """An ``openai.AsyncOpenAI`` client for the endpoint of ``ctx`` (on the process's shared
    TLS context where the core offers it: ``ctx.openai_client``)."""
    factory = getattr(ctx, "openai_client", None)
    if callable(factory):
        return factory(timeout=ctx.timeout_s)
    import openai  # optional at import time: only agents need it

    return openai.AsyncOpenAI(
        base_url=ctx.get_base_url(), api_key=ctx.api_key, timeout=ctx.timeout_s
    )


async def run_samples(
    ctx: AgentContext,
    batch: AgentBatch,
    play: Callable[[Any, AgentItem], Awaitable[Any]],
) -> list[Any]:
    """``await play(client, item)`` for every sample of ``batch``, at most
    ``ctx.max_concurrency`` at a time, with one client shared by all and closed at the end.

    With a core context that offers ``run_each``, a sample that raises or times out becomes an
    ``AgentFailure`` (dropped from training) instead of failing the batch; otherwise the first
    error propagates.
    """
    client = make_client(ctx)
    try:
        run_each = getattr(ctx, "run_each", None)
        if callable(run_each):
            return list(await run_each(batch, lambda item: play(client, item)))
        limit = asyncio.Semaphore(max(1, ctx.max_concurrency))

        async def one(item: AgentItem) -> Any:
            async with limit:
                return await play(client, item)

        return list(await asyncio.gather(*(one(item) for item in batch.iter_samples())))
    finally:
        await client.close()


def assistant_message(response: Any, choice_index: int = 0) -> dict[str, Any]:
    """The assistant message of one choice of a chat-completion ``response`` as a plain dict,
    ready to be appended to the conversation: ``role``, ``content`` (``""`` when empty) and,
    when the model called tools, ``tool_calls`` in OpenAI form. ``response`` may be the
    client's object or its dict form; anything unreadable gives an empty assistant message.
    """
    data = _plain(response)
    choices = data.get("choices") if isinstance(data, Mapping) else None
    message: Any = None
    if isinstance(choices, list) and 0 <= choice_index < len(choices):
        choice = _plain(choices[choice_index])
        if isinstance(choice, Mapping):
            message = _plain(choice.get("message"))
    if not isinstance(message, Mapping):
        message = {}
    content = message.get("content")
    out: dict[str, Any] = {
        "role": "assistant",
        "content": content if isinstance(content, str) else "",
    }
    calls = [_plain(c) for c in message.get("tool_calls") or ()]
    calls = [dict(c) for c in calls if isinstance(c, Mapping)]
    if calls:
        out["tool_calls"] = calls
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    return out


def tool_call_id(call: Mapping[str, Any], fallback: str) -> str:
    """The ``id`` of a tool call, or ``fallback`` when it has none."""
    value = call.get("id")
    return value if isinstance(value, str) and value else fallback


def tool_results(
    calls: Iterable[Mapping[str, Any]], tool: str, answer: str | None, unit: str
) -> tuple[list[dict[str, Any]], bool]:
    """One tool message per call of a reply (OpenAI requires an answer to every tool call):
    the first call of ``tool`` gets ``answer`` (unless it is None), later calls of ``tool`` say
    that only the first of a ``unit`` counts, calls of any other tool say there is none.
    Returns the messages and whether ``answer`` was given."""
    out: list[dict[str, Any]] = []
    answered = False
    for i, call in enumerate(calls):
        name = call_name(call)
        if name == tool and not answered and answer is not None:
            content, answered = answer, True
        elif name == tool:
            content = f"Ignored: only the first `{tool}` call of a {unit} counts."
        else:
            content = f"Error: there is no tool {name!r}; the only tool is `{tool}`."
        call_id = tool_call_id(call, f"call_{i}")
        out.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return out, answered


def _plain(value: Any) -> Any:
    """Pydantic objects of the OpenAI client as dicts; anything else unchanged."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, Mapping):
        return dump(exclude_none=True)
    return value


__all__ = ["assistant_message", "make_client", "run_samples", "tool_call_id"]

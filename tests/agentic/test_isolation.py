"""Which per-sample functions ``ctx.run_each`` runs on event loops of their own, and what a
sample that blocks its thread costs the others."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any

import httpx
import openai

from areno_core.agentic.isolation import shared_loop_object, still_blocked
from areno_core.agentic.types import AgentBatch, AgentContext, AgentFailure, AgentItem


def _batch(count: int) -> AgentBatch:
    items = tuple(
        AgentItem(row={}, messages=({"role": "user", "content": "hi"},), prompt_index=i,
                  sample_index=0)
        for i in range(count)
    )  # fmt: skip
    return AgentBatch(items=items, n_samples=1)


def _ctx(timeout_s: float = 30.0) -> AgentContext:
    return AgentContext(base_url="http://127.0.0.1:9/v1", api_key="k", timeout_s=timeout_s)


class _Framework:
    """A framework object holding its model, which holds the client (as Agents SDK's do)."""

    def __init__(self, client: Any) -> None:
        self.model = {"settings": [1, 2], "client": client}


def test_shared_loop_object_finds_clients_and_asyncio_objects_made_outside() -> None:
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    lock = asyncio.Lock()
    ctx = _ctx()

    async def closes_over_client(item: AgentItem) -> None:
        await client.models.list()

    async def takes(item: AgentItem, session: Any = None) -> None: ...

    async def own_client(item: AgentItem) -> None:
        async with openai.AsyncOpenAI(base_url=ctx.get_base_url(item), api_key=ctx.api_key):
            pass

    framework = _Framework(httpx.AsyncClient())
    assert shared_loop_object(closes_over_client) is client
    assert shared_loop_object(lambda item: closes_over_client(item)) is client
    assert shared_loop_object(functools.partial(takes, session=lock)) is lock
    assert isinstance(shared_loop_object(lambda item: takes(item, framework)), httpx.AsyncClient)
    assert shared_loop_object(own_client) is None
    assert shared_loop_object(lambda item: own_client(item)) is None
    module = {"client": client}  # a global the function reads, here inside a comprehension
    exec("async def reads_global(item):\n    return [client for _ in range(1)]", module)
    assert shared_loop_object(module["reads_global"]) is client
    # a sync client is safe to share between threads
    sync = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    assert shared_loop_object(lambda item: takes(item, sync)) is None


def test_run_each_isolates_by_default_so_a_blocked_sample_stalls_only_itself() -> None:
    ctx = _ctx(timeout_s=1.0)
    release = threading.Event()
    loops: dict[int, int] = {}

    async def play(item: AgentItem) -> float:
        loops[item.prompt_index] = id(asyncio.get_running_loop())
        if item.prompt_index == 0:
            release.wait(30)  # blocks its own thread; no await point
        await asyncio.sleep(0.05)
        return float(item.prompt_index)

    async def agent() -> list[Any]:
        results = await ctx.run_each(_batch(3), play)
        return [results, id(asyncio.get_running_loop())]

    started = time.monotonic()
    try:
        (results, agent_loop) = asyncio.run(agent())
        assert time.monotonic() - started < 1.0 + 2.0 + 1.0  # its timeout, then its grace
        assert still_blocked(ctx.sample_threads, 0.1) == 1
    finally:
        release.set()
    assert isinstance(results[0], AgentFailure) and results[0].kind == "timeout"
    assert "still blocked 2 s after being cancelled" in results[0].error
    assert [r.reward for r in results[1:]] == [1.0, 2.0]
    assert len(set(loops.values())) == 3 and agent_loop not in loops.values()
    assert still_blocked(ctx.sample_threads, 5.0) == 0


def test_run_each_shares_the_agents_loop_when_fn_uses_a_client_made_outside() -> None:
    ctx = _ctx()

    async def agent() -> tuple[set[int], int, int]:
        client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key)
        loops: set[int] = set()

        async def play(item: AgentItem) -> None:
            assert client.api_key == "k"
            loops.add(id(asyncio.get_running_loop()))

        await ctx.run_each(_batch(2), play)
        shared = len(ctx.sample_threads)
        await ctx.run_each(_batch(2), play, isolate=True)  # asked for: no looking
        await client.close()
        return loops, id(asyncio.get_running_loop()), shared

    loops, agent_loop, shared = asyncio.run(agent())
    assert shared == 0 and len(ctx.sample_threads) == 2
    assert agent_loop in loops and len(loops) == 3

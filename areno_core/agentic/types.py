"""The objects an agent function sees and returns.

Any OpenAI-compatible client or agent framework pointed at a sample's own URL,
``ctx.get_base_url(item)``, is enough: the endpoint records what it serves to each sample, so
the per-sample function may return only a reward (or nothing, for the run's reward function)::

    async def run_agent(ctx, batch):
        async def play(item):
            llm = ChatOpenAI(model=ctx.model, base_url=ctx.get_base_url(item), api_key=ctx.api_key)
            ...  # any framework, any number of turns and tool calls
            return reward

        return await ctx.run_each(batch, play)

Agents may also return the turns themselves, naming each response they received:

    async def run_agent(ctx: AgentContext, batch: AgentBatch):
        client = openai.AsyncOpenAI(base_url=ctx.get_base_url(), api_key=ctx.api_key)
        turns = []
        for item in batch.iter_samples():
            response = await client.chat.completions.create(
                model=ctx.model, messages=item.messages, tools=item.row.get("tools")
            )
            turns.append(AgentTrajectoryTurn(item=item, messages=item.messages, response=response))
        return turns

To run the samples concurrently, with one sample's crash, timeout or blocking call not costing
the others, let :meth:`AgentContext.run_each` drive a per-sample coroutine that makes its own
client (each sample then runs on an event loop of its own)::

    async def run_agent(ctx, batch):
        async def play(item):
            async with ctx.openai_client(item) as client:  # an AsyncOpenAI, cheap to make
                ...  # several turns; return AgentTrajectory(item=item, turns=[...])

        return await ctx.run_each(batch, play)
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

from areno_core.agentic import clients
from areno_core.agentic.isolation import run_isolated, shared_loop_object
from areno_core.log import get_logger, warn_once

logger = get_logger(__name__)


@attrs.frozen
class AgentItem:
    """One (prompt, sample) task: the loader's row, its prompt, and where it belongs."""

    row: Mapping[str, Any]
    messages: tuple[Mapping[str, Any], ...]
    prompt_index: int
    sample_index: int
    base_url: str = attrs.field(default="", eq=False)
    """This sample's own endpoint URL: every request through it is recorded as this
    sample's, so the agent may return just a reward, or nothing (see docs/agentic.md)."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.prompt_index, self.sample_index)


@attrs.frozen
class AgentContext:
    """How an agent reaches the policy: a local OpenAI-compatible endpoint."""

    base_url: str
    api_key: str
    model: str = "policy"
    max_concurrency: int = 64
    timeout_s: float = 300.0

    finished: list[Any] = attrs.field(factory=list, eq=False, repr=False)
    """What :meth:`run_each` has finished so far. When ``run_agent`` as a whole times out or
    raises, the core still keeps these results (and counts the other samples as failed)."""
    sample_threads: list[threading.Thread] = attrs.field(factory=list, eq=False, repr=False)
    """The threads :meth:`run_each` ran isolated samples on; the core counts those still
    blocked at the end of the step (``rollout/agent_blocked_samples``)."""

    def get_base_url(self, item: AgentItem | None = None) -> str:
        """The endpoint URL: ``item``'s own (requests through it are recorded as that
        sample's) when given, else the shared one."""
        if item is not None and item.base_url:
            return item.base_url
        return self.base_url

    def openai_client(self, item: AgentItem | None = None, **kwargs: Any) -> Any:
        """A new ``openai.AsyncOpenAI`` for ``item``'s URL (or the shared one), made for one
        sample: it shares a TLS context built once per process, so it costs about 0.5 ms of
        CPU time to make instead of about 50 ms (:mod:`areno_core.agentic.clients`). Make it
        inside the per-sample function, like any client, and close it there (``async
        with``). ``kwargs`` go to ``AsyncOpenAI`` (``timeout``, ``max_retries``, ...)."""
        return clients.openai_client(self.get_base_url(item), self.api_key, **kwargs)

    def http_client(self, **kwargs: Any) -> Any:
        """A new ``httpx.AsyncClient`` on the shared TLS context, for a framework that takes
        one (``ChatOpenAI(http_async_client=...)``, ``AsyncOpenAI(http_client=...)``); the
        same saving as :meth:`openai_client`. ``kwargs`` go to the client."""
        return clients.http_client(**kwargs)

    async def run_each(
        self,
        batch: AgentBatch,
        fn: Callable[[AgentItem], Awaitable[Any]],
        *,
        max_concurrency: int | None = None,
        timeout_s: float | None = None,
        isolate: bool | None = None,
    ) -> list[Any]:
        """Run ``await fn(item)`` for every sample of ``batch`` concurrently.

        ``fn`` returns the sample's turns (a turn, a trajectory, a list of them), its reward
        (a number: the rows are built from what ``item.base_url`` served) or None (the same,
        scored by the run's reward function); numbers and None come back as
        ``AgentTrajectory(item=item, reward=...)`` without turns.

        At most ``max_concurrency`` (default: ``self.max_concurrency``) samples run at once and
        each gets ``timeout_s`` seconds (default: ``self.timeout_s``). A sample that raises,
        times out or returns something else than a turn, a trajectory, a list of them or None
        becomes an :class:`AgentFailure` instead of failing the whole batch. Results are
        returned in batch order.

        Each sample runs on a thread with an event loop of its own (``isolate``, by default
        whenever that is safe), so a sample that blocks (``time.sleep``, a synchronous HTTP
        client, a socket read) stalls only itself and is dropped at its timeout while the
        others finish. That is safe when ``fn`` creates what it awaits on (the OpenAI client,
        the framework's model object), since an async client belongs to the event loop it is
        used on. When ``fn`` reaches one made outside it (an ``AsyncOpenAI``, an
        ``httpx.AsyncClient``, an asyncio lock or queue, through its closure, defaults or
        ``self``), the samples share the agent's event loop instead: the per-sample timeout
        then interrupts ``await`` points only, and a sample that blocks stalls every sample.
        ``isolate=True`` or ``False`` decides without looking. The deadline of the whole agent
        function holds regardless (see docs/agentic.md).
        """
        limit = asyncio.Semaphore(max(1, max_concurrency or self.max_concurrency))
        budget = self.timeout_s if timeout_s is None else timeout_s
        if isolate is None:
            isolate = _may_isolate(fn)

        async def one(item: AgentItem) -> Any:
            async with limit:
                try:
                    if isolate:
                        result: Any = await run_isolated(fn, item, budget, self.sample_threads)
                    else:
                        result = await asyncio.wait_for(fn(item), budget)
                except TimeoutError as exc:
                    why = str(exc) or f"sample timed out after {budget:g} s"
                    result = AgentFailure(item=item, kind="timeout", error=why)
                except Exception as exc:
                    result = AgentFailure(
                        item=item, kind="error", error="".join(traceback.format_exception(exc))
                    )
            problem = result_problem(result)
            if problem is not None:
                result = AgentFailure(item=item, kind="error", error=f"the sample {problem}")
            elif result is None or is_reward(result):
                result = AgentTrajectory(
                    item=item, reward=None if result is None else float(result)
                )
            self.finished.append(result)
            return result

        return list(await asyncio.gather(*(one(item) for item in batch.iter_samples())))


def _may_isolate(fn: Callable[[AgentItem], Awaitable[Any]]) -> bool:
    """Whether ``run_each`` may run ``fn``'s samples on event loops of their own: ``fn``
    reaches no async client or asyncio object made outside it. Says once why not."""
    shared = shared_loop_object(fn, skip=(AgentContext, AgentBatch, AgentItem))
    if shared is None:
        return True
    warn_once(
        logger,
        "agentic.shared_loop_object",
        "ctx.run_each: the per-sample function uses a %s made outside it, so its samples share "
        "the agent's event loop, and a sample that blocks it (time.sleep, a synchronous "
        "client) stalls them all until the agent's deadline. Create the client inside the "
        "function to run each sample on an event loop of its own, or pass isolate=False to "
        "keep one shared client (see docs/agentic.md)",
        type(shared).__name__,
        level=logging.INFO,
    )
    return False


def is_reward(value: Any) -> bool:
    """Whether ``value`` is a reward an agent returned: a real number (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def result_problem(value: Any) -> str | None:
    """Why ``value`` is not something an agent may return for a sample (None when it is): a
    turn, a trajectory, a failure, None, a reward (a number), or a list or tuple of turns,
    trajectories and failures."""
    if value is None or isinstance(value, AgentTrajectoryTurn | AgentTrajectory | AgentFailure):
        return None
    if is_reward(value):
        if not math.isfinite(value):
            return f"returned the reward {value!r}; a reward must be a finite number"
        return None
    if isinstance(value, list | tuple):
        for entry in value:
            if is_reward(entry):
                return "returned a list holding a number; return the reward alone"
            problem = result_problem(entry)
            if problem is not None:
                return problem
        return None
    return (
        f"returned a {type(value).__name__}; expected a reward (a number), None, "
        "AgentTrajectoryTurn, AgentTrajectory, AgentFailure, or a list of turns"
    )


@attrs.frozen
class AgentBatch:
    """The rows of one step, each to be sampled ``n_samples`` times."""

    items: tuple[AgentItem, ...]
    n_samples: int

    def iter_samples(self) -> Iterator[AgentItem]:
        """Every (row, sample) task of the step: batch-size x n-samples items."""
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@attrs.frozen
class AgentTrajectoryTurn:
    """One chat-completion call: the messages sent and the response received.

    ``response`` is the OpenAI response object (or its dict form) returned by the endpoint;
    the endpoint's extension field carries the prompt and completion token ids and logprobs,
    so the token row is rebuilt exactly. ``reward`` may be set by the agent itself; otherwise
    the run's reward function scores the trajectory.
    """

    item: AgentItem
    messages: Sequence[Mapping[str, Any]]
    response: Any
    reward: float | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    choice_index: int = 0
    """Which choice of ``response`` this turn continued with (requests with ``n > 1``)."""


@attrs.frozen
class AgentTrajectory:
    """All turns of one sample, in order. Without turns, the sample's rows are built from what
    its own URL (``item.base_url``) served, and ``reward`` (when set) is shared by them."""

    item: AgentItem
    turns: Sequence[AgentTrajectoryTurn] = ()
    reward: float | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    messages: Sequence[Mapping[str, Any]] = ()
    """Optional: the whole conversation at the end, including tool results that came after
    the last turn. The reward record's ``messages`` use it when given."""


@attrs.frozen
class AgentFailure:
    """A sample the agent could not finish (returned by :meth:`AgentContext.run_each`, or by an
    agent itself). It is dropped from training and counted in ``rollout/agent_errors``."""

    item: AgentItem
    kind: Literal["timeout", "error"]
    error: str

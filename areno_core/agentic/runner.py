"""Run an agent function with a deadline that holds, whatever the agent does.

    outcome = run_agent_fn(agent_fn, ctx, batch, timeout_s=300.0)
    outcome.values      # what the agent returned or yielded (when it finished)
    outcome.finished    # what ctx.run_each had finished by the end (always)

The agent runs on a thread of its own with its own event loop. The caller waits at most
``timeout_s``; then the agent's task is cancelled (cooperative code, ``await``-ing the endpoint,
stops there and may clean up) and, if the thread has not ended ``grace_s`` later (code blocked
in ``time.sleep``, a synchronous HTTP client, ``subprocess.run``...), it is abandoned: the step
goes on with what had finished, and the thread is left to end on its own. Python cannot kill a
thread, so an abandoned agent still runs (the endpoint it talks to is gone by then, so its
requests fail); :func:`abandoned_agents` counts those still alive.

A watchdog coroutine measures how long the agent's event loop was blocked (time in which no
other coroutine could run: every sample of the step waits). It is reported as
``blocked_s``/``longest_block_s`` so blocking code shows up in the metrics and the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import attrs

from areno_core.log import get_logger

logger = get_logger(__name__)

# A loop that misses its heartbeat by more than this counts as blocked.
BLOCK_THRESHOLD_S = 0.2
HEARTBEAT_S = 0.05
# How often a waiting caller's ``progress`` callback runs.
PROGRESS_S = 0.05

_abandoned: list[threading.Thread] = []
_abandoned_lock = threading.Lock()  # batches in flight at once may abandon and count together


def abandoned_agents() -> int:
    """Agent threads abandoned at their deadline that are still running."""
    with _abandoned_lock:
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        return len(_abandoned)


@attrs.define
class AgentOutcome:
    """How an agent function ended and what it produced."""

    values: list[Any] = attrs.Factory(list)
    """What the agent returned (one entry) or yielded (one per item), in order."""
    finished: list[Any] = attrs.Factory(list)
    """What ``ctx.run_each`` had finished, snapshot at the end."""
    error: str | None = None
    """The traceback when the agent raised, or why it was stopped."""
    timed_out: bool = False
    abandoned: bool = False
    """The agent ignored cancellation and its thread was left running."""
    completed: bool = False
    """The agent function returned (or its generator ended) normally."""
    seconds: float = 0.0
    blocked_s: float = 0.0
    longest_block_s: float = 0.0


@attrs.define
class _State:
    outcome: AgentOutcome
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[Any] | None = None
    last_beat: float = 0.0
    lock: threading.Lock = attrs.Factory(threading.Lock)


async def _heartbeat(state: _State) -> None:
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        state.last_beat = time.monotonic()
        await asyncio.sleep(HEARTBEAT_S)
        lag = loop.time() - before - HEARTBEAT_S
        if lag > BLOCK_THRESHOLD_S:
            with state.lock:
                state.outcome.blocked_s += lag
                state.outcome.longest_block_s = max(state.outcome.longest_block_s, lag)


async def _main(agent_fn: Callable[..., Any], ctx: Any, batch: Any, state: _State) -> None:
    state.loop = asyncio.get_running_loop()
    state.task = asyncio.current_task()
    watchdog = asyncio.ensure_future(_heartbeat(state))
    outcome = state.outcome
    try:
        value = agent_fn(ctx, batch)
        if inspect.isawaitable(value):
            value = await value
        if hasattr(value, "__aiter__"):
            async for entry in value:
                outcome.values.append(entry)
        else:
            outcome.values.append(value)
        outcome.completed = True
    except asyncio.CancelledError:
        pass  # the deadline passed; the caller records it
    except Exception as exc:
        outcome.error = "".join(traceback.format_exception(exc))
    finally:
        watchdog.cancel()


def _wait(done: threading.Event, deadline: float, progress: Callable[[], None] | None) -> bool:
    """Wait for ``done`` until ``deadline`` (monotonic), calling ``progress`` meanwhile."""
    if progress is None:
        return done.wait(max(0.0, deadline - time.monotonic()))
    while not done.wait(max(0.0, min(PROGRESS_S, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return False
        progress()
    return True


def run_agent_fn(
    agent_fn: Callable[..., Any],
    ctx: Any,
    batch: Any,
    *,
    timeout_s: float,
    grace_s: float = 2.0,
    progress: Callable[[], None] | None = None,
) -> AgentOutcome:
    """Run ``agent_fn(ctx, batch)`` to completion or to its deadline (see the module
    docstring). Never raises for what the agent does; errors are in the outcome.

    ``progress``, when given, is called on the waiting thread about every
    ``PROGRESS_S`` seconds while the agent runs (its time counts against the deadline)."""
    outcome = AgentOutcome()
    state = _State(outcome, last_beat=time.monotonic())
    done = threading.Event()

    def target() -> None:
        try:
            asyncio.run(_main(agent_fn, ctx, batch, state))
        except BaseException as exc:
            if outcome.error is None and not outcome.completed:
                outcome.error = "".join(traceback.format_exception(exc))
        finally:
            done.set()

    started = time.monotonic()
    thread = threading.Thread(target=target, name="areno-agent", daemon=True)
    thread.start()
    if not _wait(done, started + timeout_s, progress):
        outcome.timed_out = True
        stuck = time.monotonic() - state.last_beat
        loop, task = state.loop, state.task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)
        if not done.wait(grace_s):
            outcome.abandoned = True
            with _abandoned_lock:
                _abandoned.append(thread)
            if stuck > BLOCK_THRESHOLD_S:
                with state.lock:
                    outcome.blocked_s += stuck
                    outcome.longest_block_s = max(outcome.longest_block_s, stuck)
        why = f"the agent function timed out after {timeout_s:g} s"
        if outcome.abandoned:
            why += (
                f" and did not stop within {grace_s:g} s of being cancelled (blocking code?); "
                "its thread was abandoned"
            )
        outcome.error = why if outcome.error is None else f"{why}\n{outcome.error}"
    outcome.seconds = time.monotonic() - started
    with state.lock:  # an abandoned agent may still append to these: hand back copies
        return attrs.evolve(
            outcome,
            values=list(outcome.values),
            finished=list(getattr(ctx, "finished", ())),
        )


__all__ = ["AgentOutcome", "abandoned_agents", "run_agent_fn"]

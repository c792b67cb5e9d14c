"""Run one sample of an agent on a thread with an event loop of its own.

    if shared_loop_object(fn) is None:       # fn makes its own clients: safe to isolate
        result = await run_isolated(fn, item, budget, threads)

A sample that blocks its thread (``time.sleep``, a synchronous HTTP client, a socket read
without a timeout) then stalls only itself: the caller's loop keeps serving the other samples,
and at the deadline the sample is dropped. Python cannot kill a thread, so a blocked sample's
thread is left to end on its own; :func:`still_blocked` finds those at the end of a step.

Isolation is only safe when ``fn`` creates what it awaits on: an async client (``AsyncOpenAI``,
``httpx.AsyncClient``), an ``asyncio.Lock`` or a queue belongs to the event loop it was first
used on, and several loops sharing one fail at random ("bound to a different event loop").
:func:`shared_loop_object` looks for such objects among what ``fn`` closes over, so
:meth:`~areno_core.agentic.types.AgentContext.run_each` isolates every sample unless one is
found.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import threading
import time
import types
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

ISOLATED_GRACE_S = 2.0
"""How long a sample's thread gets to end once its task was cancelled at the deadline."""

# Objects of the asyncio module that belong to one event loop.
_ASYNCIO_BOUND = (
    asyncio.AbstractEventLoop,
    asyncio.Future,
    asyncio.Lock,
    asyncio.Event,
    asyncio.Condition,
    asyncio.Semaphore,
    asyncio.Queue,
    asyncio.Barrier,
    asyncio.StreamReader,
    asyncio.StreamWriter,
)
# Packages whose ``Async*`` classes (clients, their resources, streams) hold a connection pool
# or transports tied to the loop that first used them; aiohttp's session too.
_ASYNC_CLIENT_PACKAGES = frozenset({"openai", "httpx", "httpcore", "anyio", "aiohttp"})
_BOUND_CLASS_NAMES = frozenset({("aiohttp", "ClientSession")})
_LEAF_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), type)
_LEAF_TYPES += (types.ModuleType, types.BuiltinFunctionType, threading.Thread)

# How far, and through how many objects, to look from ``fn``: a client captured by a closure is
# one step away, one held by a framework object (an agent holding its model holding the client)
# three or four.
MAX_DEPTH = 5
MAX_OBJECTS = 5000


def _bound_to_a_loop(value: Any) -> bool:
    if isinstance(value, _ASYNCIO_BOUND):
        return True
    for cls in type(value).__mro__:
        package = cls.__module__.partition(".")[0]
        if package in _ASYNC_CLIENT_PACKAGES and cls.__name__.startswith("Async"):
            return True
        if (package, cls.__name__) in _BOUND_CLASS_NAMES:
            return True
    return False


def _children(value: Any, skip: tuple[type, ...]) -> Iterable[Any]:
    """What ``value`` holds that ``fn`` might await on: closure cells, default arguments, the
    module globals a function reads, bound ``self``, ``functools.partial`` arguments, container
    entries, attributes."""
    if isinstance(value, (*_LEAF_TYPES, *skip)):
        return ()
    if isinstance(value, types.FunctionType):
        cells = []
        for cell in value.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                cells.append(cell.cell_contents)
        named = _global_names(value.__code__)
        used = [value.__globals__[name] for name in named if name in value.__globals__]
        return (*cells, *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values(), *used)
    if isinstance(value, types.MethodType):
        return (value.__func__, value.__self__)
    if isinstance(value, functools.partial):
        return (value.func, *value.args, *value.keywords.values())
    if isinstance(value, dict):
        return tuple(value.values())
    if isinstance(value, list | tuple | set | frozenset | collections.deque):
        return tuple(value)
    found: list[Any] = []
    with contextlib.suppress(Exception):  # objects that hide their attributes
        found.extend(object.__getattribute__(value, "__dict__").values())
    for cls in type(value).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in ("__dict__", "__weakref__"):
                with contextlib.suppress(Exception):  # an unset slot
                    found.append(object.__getattribute__(value, name))
    return found


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the functions, lambdas and comprehensions in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def shared_loop_object(fn: Any, *, skip: tuple[type, ...] = ()) -> Any:
    """The first object bound to an event loop (an async client, an asyncio primitive) that
    ``fn`` reaches through what it closes over, its defaults, the globals it reads, its
    ``self`` or its partial arguments, nearest first; None when there is none (or the search
    gives up, after :data:`MAX_OBJECTS` objects). Instances of ``skip`` are not searched."""
    seen: set[int] = set()
    queue: collections.deque[tuple[Any, int]] = collections.deque([(fn, 0)])
    while queue and len(seen) < MAX_OBJECTS:
        value, depth = queue.popleft()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if depth and _bound_to_a_loop(value):
            return value
        if depth < MAX_DEPTH:
            queue.extend((child, depth + 1) for child in _children(value, skip))
    return None


async def run_isolated(
    fn: Callable[[Any], Awaitable[Any]],
    item: Any,
    budget: float,
    threads: list[threading.Thread] | None = None,
) -> Any:
    """``await fn(item)`` on a thread with an event loop of its own, within ``budget``
    seconds; the thread is appended to ``threads``. At the deadline (or when the caller is
    cancelled) the sample's task is cancelled; if its thread is still blocked
    :data:`ISOLATED_GRACE_S` later, it is left to end on its own and :class:`TimeoutError` is
    raised all the same."""
    caller = asyncio.get_running_loop()
    answer: asyncio.Future[tuple[bool, Any]] = caller.create_future()
    inner: dict[str, Any] = {}

    def deliver(outcome: tuple[bool, Any]) -> None:
        if not answer.done():
            answer.set_result(outcome)

    async def main() -> Any:
        inner["loop"], inner["task"] = asyncio.get_running_loop(), asyncio.current_task()
        return await fn(item)

    def target() -> None:
        try:
            outcome: tuple[bool, Any] = (True, asyncio.run(main()))
        except BaseException as exc:
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed
            caller.call_soon_threadsafe(deliver, outcome)

    def cancel() -> None:
        loop, task = inner.get("loop"), inner.get("task")
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)

    thread = threading.Thread(target=target, name=f"areno-sample-{item.key}", daemon=True)
    if threads is not None:
        threads.append(thread)
    thread.start()
    try:
        ok, value = await asyncio.wait_for(asyncio.shield(answer), budget)
    except TimeoutError:
        cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(answer), ISOLATED_GRACE_S)
        if not answer.done():
            raise TimeoutError(
                f"sample timed out after {budget:g} s and was still blocked "
                f"{ISOLATED_GRACE_S:g} s after being cancelled (time.sleep, a synchronous "
                "call?); its thread was left to end on its own"
            ) from None
        raise TimeoutError from None
    except asyncio.CancelledError:
        cancel()
        raise
    if not ok:
        if isinstance(value, asyncio.CancelledError):
            raise RuntimeError("the sample's task was cancelled") from None
        raise value
    return value


_left_running: list[threading.Thread] = []
_left_running_lock = threading.Lock()  # batches in flight at once may add and count together


def still_blocked(threads: Iterable[threading.Thread], grace_s: float) -> int:
    """How many of ``threads`` still run after up to ``grace_s`` seconds (all together):
    samples blocked in code that ignored their cancellation. Those are left to end on their
    own and counted by :func:`blocked_samples_left`."""
    deadline = time.monotonic() + grace_s
    alive = []
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            alive.append(thread)
    with _left_running_lock:
        _left_running.extend(alive)
    return len(alive)


def blocked_samples_left() -> int:
    """Threads of blocked samples, left behind by earlier steps, that still run."""
    with _left_running_lock:
        _left_running[:] = [t for t in _left_running if t.is_alive()]
        return len(_left_running)


__all__ = [
    "ISOLATED_GRACE_S",
    "blocked_samples_left",
    "run_isolated",
    "shared_loop_object",
    "still_blocked",
]

"""uvicorn's HTTP/1.1 protocol with a deadline on every request head.

uvicorn has no timeout for reading a request's headers, and its ``limit_concurrency`` counts
every open connection, half-sent ones included: 1,100 connections that send their headers a
byte at a time (and never a key) made every authenticated request fail with ``503``. The
endpoint therefore runs uvicorn without ``limit_concurrency`` and with this protocol, which

* closes a connection whose request head (request line and headers) is not complete
  ``head_timeout_s`` after it started (the connection was opened, or the first byte of a
  further request arrived on a kept-alive one), however slowly it keeps sending;
* refuses connections beyond ``max_open`` open at once (closed as soon as they are accepted),
  so a flood cannot exhaust the process's file descriptors.

The limit on requests in flight is the app's (:class:`areno_core.agentic.asgi.Guard`), after
the key is checked, so only authenticated requests count against it. Idle kept-alive
connections are closed by uvicorn's own ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0
MAX_OPEN_CONNECTIONS = 4096


class HeadTimeoutH11Protocol(H11Protocol):
    """See the module docstring; :func:`protocol_class` sets the two limits."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    max_open: int = MAX_OPEN_CONNECTIONS
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_open:
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and not self._in_request():
            self._arm()  # the first bytes of a further request on a kept-alive connection
        super().data_received(data)
        if self._in_request():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        """A request head has been read and its response is not complete yet."""
        cycle: Any = self.cycle
        return cycle is not None and not cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expire(self) -> None:
        self._head_timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()


def protocol_class(
    *, head_timeout_s: float = HEAD_TIMEOUT_S, max_open: int = MAX_OPEN_CONNECTIONS
) -> type[HeadTimeoutH11Protocol]:
    """A :class:`HeadTimeoutH11Protocol` with these limits, for ``uvicorn.Config(http=...)``."""
    if head_timeout_s <= 0 or max_open < 1:
        raise ValueError(
            f"head_timeout_s must be positive and max_open at least 1, got {head_timeout_s} "
            f"and {max_open}"
        )
    return type(
        "HeadTimeoutH11Protocol",
        (HeadTimeoutH11Protocol,),
        {"head_timeout_s": float(head_timeout_s), "max_open": int(max_open)},
    )


__all__ = ["HEAD_TIMEOUT_S", "MAX_OPEN_CONNECTIONS", "HeadTimeoutH11Protocol", "protocol_class"]

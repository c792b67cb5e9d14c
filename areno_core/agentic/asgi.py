"""The HTTP side of the agent endpoint: a Starlette app behind a guard, served by uvicorn.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/chat/completions`` (JSON or,
with ``stream: true``, server-sent events). :class:`Guard` is plain ASGI middleware that runs
before any route: it answers ``401`` to a request without the right bearer key, ``404`` /
``405`` to anything but the three routes, ``400`` to a malformed ``Content-Length`` and ``413``
to a declared body over the limit, all without reading a byte of the body (the connection is
then closed). The chat route reads the body under the same limit (for chunked uploads too)
and within ``body_timeout_s``, validates it, and waits for the scheduler, racing the answer
against the client's disconnect and the request's deadline.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from areno_core.agentic.schema import ChatRequest, RequestError, parse_chat_request
from areno_core.agentic.sse import StreamingEndpoint, sse_events
from areno_core.log import get_logger

logger = get_logger(__name__)

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class EndpointJob(Protocol):
    """What the app reads and sets of one request in flight
    (:class:`areno_core.agentic.server.Job` is the real one)."""

    model: str
    response_id: str
    created: int
    deadline: float
    tokens: asyncio.Queue[tuple[int, int, float | None]] | None


class Endpoint(StreamingEndpoint, Protocol):
    """What the app asks of the endpoint it serves (:class:`areno_core.agentic.server.AgentServer`
    is the real one): its limits and key, and the life of a request (cancelling it and the
    streamed text and logprobs come from :class:`~areno_core.agentic.sse.StreamingEndpoint`)."""

    api_key: str
    in_flight: int
    max_connections: int
    max_body_bytes: int
    body_timeout_s: float
    timeout_s: float
    model_name: str
    streams_tokens: bool
    stats: dict[str, float]

    def sample_of(self, segment: str) -> tuple[int, int] | None: ...

    def models_payload(self) -> dict[str, Any]: ...

    def prepare(
        self, request: ChatRequest, *, sample: tuple[int, int] | None = None
    ) -> EndpointJob: ...

    async def render(self, job: Any) -> None: ...

    def submit(self, job: Any) -> asyncio.Future[tuple[int, dict[str, Any]]]: ...


ROUTES = {"/v1/models": "GET", "/v1/chat/completions": "POST"}
SAMPLE_PREFIX = "/sample/"  # /sample/<segment>/v1/...: a request of one sample (see server.py)
MODEL_PREFIX = "/v1/models/"
MAX_QUERY_BYTES = 1024  # no route takes a query; OpenAI clients send none


def bearer_token(header: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if header is None:
        return None
    try:
        text = header.decode("latin-1").strip()
    except UnicodeDecodeError:
        return None
    scheme, _, token = text.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _expected_method(path: str) -> str | None:
    path = path.rstrip("/") or "/"
    if path in ROUTES:
        return ROUTES[path]
    if path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
        return "GET"
    return None


async def _send_json(
    send: Send, status: int, payload: Mapping[str, Any], *, close: bool = False, extra=()
) -> None:
    body = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-content-type-options", b"nosniff"),
        *extra,
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Guard:
    """Key, route, method and declared body size, checked before the body is read."""

    def __init__(self, app: ASGIApp, server: Endpoint) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers: dict[bytes, list[bytes]] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.lower(), []).append(value)
        auth = headers.get(b"authorization", [None])[0]
        token = bearer_token(auth)
        if token is None or not hmac.compare_digest(token.encode(), self.server.api_key.encode()):
            error = RequestError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <ctx.api_key>'",
                code="invalid_api_key",
            )
            await _send_json(
                send, 401, error.payload(), close=True, extra=[(b"www-authenticate", b"Bearer")]
            )
            return
        query = scope.get("query_string") or b""
        if len(query) > MAX_QUERY_BYTES:
            error = RequestError(
                414,
                f"the query string is {len(query)} bytes; at most {MAX_QUERY_BYTES} are accepted",
            )
            await _send_json(send, 414, error.payload(), close=True)
            return
        if self.server.in_flight >= self.server.max_connections:
            error = RequestError(
                503,
                f"{self.server.in_flight} requests are being served, the most this endpoint "
                "takes at once; retry later",
            )
            await _send_json(send, 503, error.payload(), close=True)
            return
        self.server.in_flight += 1
        try:
            await self._route(scope, receive, send, headers)
        finally:
            self.server.in_flight -= 1

    async def _route(
        self, scope: Scope, receive: Receive, send: Send, headers: Mapping[bytes, list[bytes]]
    ) -> None:
        path, method = scope["path"], scope["method"]
        sample: tuple[int, int] | None = None
        if path.startswith(SAMPLE_PREFIX):
            segment, _, rest = path[len(SAMPLE_PREFIX) :].partition("/")
            sample = self.server.sample_of(segment)
            if sample is None:
                error = RequestError(404, f"no sample {segment!r} on this endpoint")
                await _send_json(send, 404, error.payload(), close=method != "GET")
                return
            path = "/" + rest
            scope = {**scope, "path": path, "raw_path": path.encode(), "areno.sample": sample}
        expected = _expected_method(path)
        if expected is None:
            error = RequestError(
                404, f"unknown path {path!r}; served: /v1/models, /v1/chat/completions"
            )
            await _send_json(send, 404, error.payload(), close=method != "GET")
            return
        if method != expected:
            error = RequestError(405, f"{path} takes {expected}, not {method}")
            await _send_json(
                send, 405, error.payload(), close=True, extra=[(b"allow", expected.encode())]
            )
            return
        lengths = headers.get(b"content-length", [])
        if lengths:
            text = lengths[0].decode("latin-1").strip()
            if not text.isdigit() or any(v != lengths[0] for v in lengths):
                error = RequestError(400, f"malformed Content-Length header {text!r}")
                await _send_json(send, 400, error.payload(), close=True)
                return
            if int(text) > self.server.max_body_bytes:
                error = RequestError(
                    413,
                    f"the request body is {int(text)} bytes; at most "
                    f"{self.server.max_body_bytes} are accepted",
                )
                await _send_json(send, 413, error.payload(), close=True)
                return
        await self.app(scope, receive, send)


def build_app(server: Endpoint) -> ASGIApp:
    """The endpoint's ASGI app for ``server``."""
    from starlette.applications import (
        Starlette,  # the endpoint's web stack loads only when an endpoint starts
    )
    from starlette.requests import (  # the endpoint's web stack loads only when an endpoint starts
        ClientDisconnect,
        Request,
    )
    from starlette.responses import (  # the endpoint's web stack loads only when an endpoint starts
        JSONResponse,
        Response,
        StreamingResponse,
    )
    from starlette.routing import (
        Route,  # the endpoint's web stack loads only when an endpoint starts
    )

    headers = {"x-content-type-options": "nosniff", "cache-control": "no-store"}

    def error_response(exc: RequestError) -> Response:
        close = {"connection": "close"} if exc.status in (408, 413) else {}
        return JSONResponse(exc.payload(), status_code=exc.status, headers={**headers, **close})

    async def models(request: Request) -> Response:
        return JSONResponse(server.models_payload(), headers=headers)

    async def model(request: Request) -> Response:
        name = request.url.path.rstrip("/")[len(MODEL_PREFIX) :]
        if name != server.model_name:
            exc = RequestError(404, f"no model {name!r}", param="model")
            return error_response(exc)
        return JSONResponse(server.models_payload()["data"][0], headers=headers)

    async def chat(request: Request) -> Response:
        loop = asyncio.get_running_loop()
        try:
            try:
                body = await _read_body(request, server.max_body_bytes, server.body_timeout_s)
            except ClientDisconnect:
                return Response(status_code=499)  # the client left mid-body; nobody reads this
            parsed = parse_chat_request(body)
            job = server.prepare(parsed, sample=request.scope.get("areno.sample"))
            job.deadline = loop.time() + server.timeout_s
            try:
                await asyncio.wait_for(server.render(job), job.deadline - loop.time())
            except TimeoutError:
                server.cancel(job, timed_out=True)
                return JSONResponse(server.timeout_payload(), status_code=504, headers=headers)
            if parsed.wants_stream and server.streams_tokens:
                job.tokens = asyncio.Queue()
            future = server.submit(job)
        except RequestError as exc:
            if exc.status != 499:
                server.stats["errors"] += 1
            return error_response(exc)
        if parsed.wants_stream:
            include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
            return StreamingResponse(
                sse_events(server, job, future, include_usage),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        outcome = await _answer(server, job, future, request)
        if outcome is None:  # the client left; nobody reads this
            return Response(status_code=499)
        status, payload = outcome
        return JSONResponse(payload, status_code=status, headers=headers)

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{name:path}", model, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )
    return Guard(app, server)


async def _read_body(request: Any, limit: int, timeout_s: float) -> bytes:
    async def read() -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {timeout_s:g} s") from None


async def _disconnected(request: Any) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _answer(
    server: Endpoint, job: EndpointJob, future: asyncio.Future[Any], request: Any
) -> tuple[int, dict[str, Any]] | None:
    """The scheduler's answer; None when the client left first (the job is cancelled)."""
    loop = asyncio.get_running_loop()
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {future, gone},
            timeout=max(0.0, job.deadline - loop.time()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        gone.cancel()
    if future in done:
        return future.result()
    server.cancel(job, timed_out=gone not in done)
    if gone in done:
        logger.debug("agent endpoint: a client disconnected; its request was cancelled")
        return None
    return 504, server.timeout_payload()


__all__ = ["Guard", "bearer_token", "build_app"]

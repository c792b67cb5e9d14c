"""Server-sent events for a streamed chat completion (``stream: true``).

    async for event in sse_events(server, job, future, include_usage=False):
        ...  # "data: {chat.completion.chunk}\\n\\n", ..., "data: [DONE]\\n\\n"

While the engine samples, every batch of tokens it reports becomes one ``chat.completion.chunk``
per choice whose text grew (``AgentServer.stream_text`` says what may be shown already), with
the ``logprobs`` of the tokens that text completes when the request asked for them. When the
completion is done, per choice one chunk carries the rest: the content not sent yet, the tool
calls (each with its ``index``, as the OpenAI client accumulates them) and the remaining
logprobs; one more its ``finish_reason`` and the ``areno`` extension. Then the usage chunk
when asked for, and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Protocol

import attrs

SSE_KEEPALIVE_S = 15.0


class StreamingJob(Protocol):
    """What a stream reads of its request (:class:`areno_core.agentic.server.Job`)."""

    model: str
    response_id: str
    created: int
    deadline: float
    tokens: asyncio.Queue[tuple[int, int, float | None]] | None


class StreamingEndpoint(Protocol):
    """What a stream asks of the endpoint (:class:`areno_core.agentic.server.AgentServer`)."""

    def cancel(self, job: Any, *, timed_out: bool) -> None: ...

    def timeout_payload(self) -> dict[str, Any]: ...

    def stream_text(self, job: Any, tokens: Sequence[int]) -> str: ...

    def stream_logprobs(
        self, job: Any, tokens: Sequence[int], values: Sequence[float | None], start: int, text: str
    ) -> tuple[int, list[dict[str, Any]] | None]: ...


@attrs.define
class ChoiceStream:
    """One choice of a stream so far: what was sampled and what was sent of it."""

    tokens: list[int] = attrs.Factory(list)
    values: list[float | None] = attrs.Factory(list)
    """The logprob of each token (None when the engine did not report it)."""
    text: str = ""
    """The content sent so far."""
    covered: int = 0
    """How many leading tokens' logprobs were sent."""


def _event(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def sse_events(
    server: StreamingEndpoint,
    job: StreamingJob,
    future: asyncio.Future[Any],
    include_usage: bool,
) -> AsyncIterator[str]:
    """The events of one streamed request: text as it is sampled (when the engine reports
    tokens), keep-alive comments while waiting, then the rest of each choice, then ``[DONE]``.
    Errors after the stream has started arrive as an event with an ``error`` object, which the
    OpenAI client raises. A stream that ends early cancels its request."""
    loop = asyncio.get_running_loop()
    finished = False
    streams: dict[int, ChoiceStream] = {}
    try:
        while True:
            remaining = job.deadline - loop.time()
            if remaining <= 0:
                server.cancel(job, timed_out=True)
                yield _event(server.timeout_payload())
                break
            waiters: set[asyncio.Future[Any]] = {future}
            getter = asyncio.ensure_future(job.tokens.get()) if job.tokens is not None else None
            if getter is not None:
                waiters.add(getter)
            done, _ = await asyncio.wait(
                waiters,
                timeout=min(remaining, SSE_KEEPALIVE_S),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if getter is not None and getter not in done:
                getter.cancel()
            if getter is not None and getter in done:
                for chunk in _sampled_chunks(server, job, getter.result(), streams):
                    yield _event(chunk)
                if not future.done():
                    continue
            if not done:
                yield ": keep-alive\n\n"
                continue
            status, payload = future.result()
            if status != 200:
                yield _event(payload)
            else:
                sent = {index: s.text for index, s in streams.items()}
                covered = {index: s.covered for index, s in streams.items()}
                for chunk in stream_chunks(
                    payload, include_usage=include_usage, sent=sent, logprobs_sent=covered
                ):
                    yield _event(chunk)
            break
        yield "data: [DONE]\n\n"
        finished = True
    finally:
        if not finished and not future.done():
            server.cancel(job, timed_out=False)


def _sampled_chunks(
    server: StreamingEndpoint,
    job: StreamingJob,
    first: tuple[int, int, float | None],
    streams: dict[int, ChoiceStream],
) -> list[dict[str, Any]]:
    """Take ``first`` and every token already queued; one chunk per choice whose text grew,
    with the logprobs of the tokens that text completes."""
    entries = [first]
    assert job.tokens is not None
    while not job.tokens.empty():
        entries.append(job.tokens.get_nowait())
    for choice, token, value in entries:
        stream = streams.setdefault(choice, ChoiceStream())
        stream.tokens.append(token)
        stream.values.append(value)
    chunks = []
    for choice in sorted({c for c, _, _ in entries}):
        stream = streams[choice]
        text = server.stream_text(job, stream.tokens)
        if len(text) <= len(stream.text) or not text.startswith(stream.text):
            continue
        first_text = not stream.text
        delta, stream.text = text[len(stream.text) :], text
        stream.covered, logprobs = server.stream_logprobs(
            job, stream.tokens, stream.values, stream.covered, text
        )
        chunks.append(_content_chunk(job, choice, delta, logprobs, first=first_text))
    return chunks


def _content_chunk(
    job: StreamingJob,
    choice: int,
    text: str,
    logprobs: list[dict[str, Any]] | None,
    *,
    first: bool,
) -> dict[str, Any]:
    delta: dict[str, Any] = {"content": text}
    if first:
        delta = {"role": "assistant", "content": text, "refusal": None}
    return {
        "id": job.response_id,
        "object": "chat.completion.chunk",
        "created": job.created,
        "model": job.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": choice,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "finish_reason": None,
            }
        ],
    }


def stream_chunks(
    payload: Mapping[str, Any],
    *,
    include_usage: bool,
    sent: Mapping[int, str] | None = None,
    logprobs_sent: Mapping[int, int] | None = None,
) -> Iterator[dict[str, Any]]:
    """A ``chat.completion`` payload as ``chat.completion.chunk`` objects: per choice, one
    chunk with the message (role, content, tool calls with their ``index``, logprobs) and one
    with its ``finish_reason`` and the ``areno`` extension; then the usage chunk when asked
    for. ``sent``: the content already streamed per choice, and ``logprobs_sent`` how many
    leading logprob entries; only the rest is sent (the role too only when nothing was)."""
    sent, logprobs_sent = sent or {}, logprobs_sent or {}
    base = {
        "id": payload["id"],
        "object": "chat.completion.chunk",
        "created": payload["created"],
        "model": payload["model"],
        "system_fingerprint": None,
    }
    extra = {"usage": None} if include_usage else {}
    for choice in payload["choices"]:
        index, message = choice["index"], choice["message"]
        content, before = message.get("content"), sent.get(index, "")
        delta: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if before:
            # Streamed text is a prefix of the content unless a reply that started as text
            # turned into a call with whitespace around it; the client then keeps what it got.
            rest = content[len(before) :] if content and content.startswith(before) else ""
            delta = {"content": rest} if rest else {}
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": k, **call} for k, call in enumerate(message["tool_calls"])
            ]
        logprobs = choice.get("logprobs")
        if logprobs is not None and logprobs_sent.get(index):
            logprobs = {**logprobs, "content": logprobs["content"][logprobs_sent[index] :]}
        yield {
            **base,
            "choices": [
                {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
            ],
            **extra,
        }
        yield {
            **base,
            "choices": [
                {
                    "index": index,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": choice["finish_reason"],
                    "areno": choice["areno"],
                }
            ],
            **extra,
        }
    if include_usage:
        yield {**base, "choices": [], "usage": payload["usage"]}


__all__ = ["SSE_KEEPALIVE_S", "ChoiceStream", "sse_events", "stream_chunks"]

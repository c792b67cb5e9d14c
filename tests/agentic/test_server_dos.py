"""Denial of service against the agent endpoint, on 127.0.0.1 only and bounded in count and
time: a flood of keyless connections that send their headers slowly, string-typed numbers,
and a huge query string."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Any

import openai

from areno_core.agentic.server import AgentServer
from areno_core.types import SamplingParams

from .test_server_http import MESSAGES, _body, _exchange, _post_head

FLOOD = 1100


def _server(engine: Any, tokenizer: Any, **kw: Any) -> AgentServer:
    return AgentServer(
        engine, tokenizer, sampling_defaults=SamplingParams(max_new_tokens=16), timeout_s=30, **kw
    )


def test_slow_keyless_headers_do_not_starve_authenticated_requests(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer, head_timeout_s=4.0) as server:
        flood: list[socket.socket] = []
        stop = threading.Event()
        try:
            for _ in range(FLOOD):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                flood.append(sock)

            def trickle() -> None:  # one more header line per connection every 0.5 s
                while not stop.wait(0.5):
                    for sock in flood:
                        with contextlib.suppress(OSError):
                            sock.send(b"X-Slow: 1\r\n")

            sender = threading.Thread(target=trickle, daemon=True)
            sender.start()
            latencies = []
            with openai.OpenAI(
                base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=10
            ) as client:
                for _ in range(6):
                    started = time.monotonic()
                    reply = client.chat.completions.create(model="policy", messages=MESSAGES)
                    latencies.append(time.monotonic() - started)
                    assert reply.choices[0].message.content == "ok"
                    time.sleep(0.2)
            assert max(latencies) < 1.0, latencies
            # The flood's heads never complete: 4 s after they started, every connection is
            # closed by the server, although each kept sending.
            time.sleep(4.5)
            deadline = time.monotonic() + 5.0
            open_ = list(flood)
            while open_ and time.monotonic() < deadline:
                open_ = [sock for sock in open_ if _still_open(sock)]
                time.sleep(0.2)
            assert not open_, f"{len(open_)} slow connections are still open"
        finally:
            stop.set()
            for sock in flood:
                sock.close()


def _still_open(sock: socket.socket) -> bool:
    """Whether the server has not closed ``sock`` (nothing to read yet)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_string_typed_numbers_are_refused_like_openai(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer) as server:
        for field, value in (("max_tokens", "10"), ("temperature", "0.5"), ("stream", 1)):
            body = _body(**{field: value})
            status, _, payload, _ = _exchange(
                server, _post_head(server, f"Content-Length: {len(body)}\r\n"), body
            )
            error = json.loads(payload)["error"]
            assert status == 400, (field, payload)
            assert error["param"] == field and json.dumps(value) in error["message"]
        assert engine.calls == []


def test_huge_query_string_is_refused(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer) as server:
        for size, expected in ((100_000, (400, 414)), (2_000, (414,))):
            head = (
                f"GET /v1/models?{'q' * size} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {server.api_key}\r\n\r\n"
            ).encode()
            status, _, _, _ = _exchange(server, head)
            assert status in expected, (size, status)
        head = (
            f"GET /v1/models?a=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {server.api_key}\r\n\r\n"
        ).encode()
        assert _exchange(server, head)[0] == 200

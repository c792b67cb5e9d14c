"""HTTP-level defences of the agent endpoint: key before body, size and time limits,
cancellation of abandoned work, and a small request not waiting behind a large one."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import openai
import pytest

from areno_core.agentic.server import AgentServer
from areno_core.types import SamplingParams

MESSAGES = [{"role": "user", "content": "Your move."}]


def _server(engine: Any, tokenizer: Any, **kw: Any) -> AgentServer:
    kw.setdefault("timeout_s", 30)
    return AgentServer(engine, tokenizer, sampling_defaults=SamplingParams(max_new_tokens=16), **kw)


def _exchange(
    server: AgentServer, head: bytes, body: bytes = b"", *, wait_s: float = 10.0
) -> tuple[int, dict[str, str], bytes, float]:
    """Send raw bytes, read one response; (status, headers, body, seconds to the answer)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=wait_s)
    started = time.monotonic()
    try:
        sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        header_blob, _, rest = data.partition(b"\r\n\r\n")
        lines = header_blob.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])
        }
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, headers, rest, time.monotonic() - started
    finally:
        sock.close()


def _post_head(server: AgentServer, extra: str, *, key: str | None = None) -> bytes:
    key = server.api_key if key is None else key
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "policy", "messages": MESSAGES, **fields}).encode()


def test_wrong_key_with_huge_declared_body_is_refused_before_reading(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer) as server:
        head = _post_head(server, "Content-Length: 50000000\r\n", key="wrong")
        status, headers, body, seconds = _exchange(server, head)
    assert status == 401 and seconds < 5.0
    assert headers.get("connection") == "close"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_declared_body_over_limit_returns_413_without_reading(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer, max_body_bytes=1000) as server:
        status, _headers, body, seconds = _exchange(
            server, _post_head(server, "Content-Length: 1001\r\n")
        )
    assert status == 413 and seconds < 5.0
    assert "at most 1000" in json.loads(body)["error"]["message"]
    assert engine.calls == []


def test_chunked_body_over_limit_returns_413(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    chunk = b"x" * 600
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
    with _server(engine, byte_tokenizer, max_body_bytes=1000) as server:
        status, _, body, _ = _exchange(
            server, _post_head(server, "Transfer-Encoding: chunked\r\n"), chunked
        )
    assert status == 413
    assert "limit of 1000 bytes" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("length", ["abc", "-5"])
def test_malformed_content_length_returns_400(byte_tokenizer: Any, scripted, length: str) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer) as server:
        status, _, _, seconds = _exchange(
            server, _post_head(server, f"Content-Length: {length}\r\n")
        )
    assert status == 400 and seconds < 5.0


def test_slow_body_times_out_with_408(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer, body_timeout_s=0.5) as server:
        status, _, body, seconds = _exchange(
            server, _post_head(server, "Content-Length: 100\r\n"), b'{"model"'
        )
    assert status == 408 and 0.4 < seconds < 5.0
    assert "did not arrive within 0.5 s" in json.loads(body)["error"]["message"]


def test_lowercase_bearer_scheme_is_accepted(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer) as server:
        head = (
            f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"authorization: bearer {server.api_key}\r\n\r\n"
        ).encode()
        status, headers, body, _ = _exchange(server, head)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "policy"
    assert headers["x-content-type-options"] == "nosniff"


def test_text_over_prompt_bound_is_refused_before_rendering(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    server = _server(engine, byte_tokenizer, max_prompt_tokens=50)
    rendered: list[int] = []
    original = server._prompts.render
    server._prompts.render = lambda m, t, gen=True: rendered.append(len(m)) or original(m, t, gen)
    client_messages = [{"role": "user", "content": "y" * 5000}]
    with server, pytest.raises(openai.BadRequestError) as caught:
        openai.OpenAI(
            base_url=server.base_url, api_key=server.api_key, max_retries=0
        ).chat.completions.create(model="policy", messages=client_messages)
    assert caught.value.code == "context_length_exceeded"
    assert "5000 characters" in str(caught.value)
    assert rendered == [] and engine.calls == []


def test_prompt_over_token_limit_is_refused_before_generation(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer, max_prompt_tokens=100) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "z" * 300}]
            )
    assert caught.value.code == "context_length_exceeded"
    assert "max_prompt_tokens=100" in str(caught.value)
    assert engine.calls == []


def test_small_request_is_not_stuck_behind_a_huge_one(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    big = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i}"}
        for i in range(1501)
    ]
    finished: dict[str, float] = {}
    with _server(engine, byte_tokenizer) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)

        def ask(name: str, messages: list[dict[str, str]]) -> None:
            client.chat.completions.create(model="policy", messages=messages)
            finished[name] = time.monotonic()

        big_thread = threading.Thread(target=ask, args=("big", big))
        big_thread.start()
        time.sleep(0.05)
        started = time.monotonic()
        ask("small", MESSAGES)
        big_thread.join()
    assert finished["small"] < finished["big"]
    assert finished["small"] - started < 2.0


def test_client_disconnect_cancels_its_queued_request(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok", delay_s=0.8)
    with _server(engine, byte_tokenizer) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
        busy = threading.Thread(
            target=client.chat.completions.create, kwargs={"model": "policy", "messages": MESSAGES}
        )
        busy.start()
        time.sleep(0.2)  # the first request is being generated now
        body = _body(messages=[{"role": "user", "content": "abandoned"}])
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(_post_head(server, f"Content-Length: {len(body)}\r\n") + body)
        time.sleep(0.2)
        sock.close()
        busy.join()
        time.sleep(0.3)
        assert server.stats["cancelled"] == 1.0
    prompts = [byte_tokenizer.decode(p) for call in engine.calls for p in call[0]]
    assert len(prompts) == 1 and "abandoned" not in prompts[0]


def test_timed_out_request_is_not_generated(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "late", delay_s=0.8)
    with _server(engine, byte_tokenizer, timeout_s=0.3) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
        errors: list[int] = []

        def ask(content: str) -> None:
            try:
                client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": content}]
                )
            except openai.APIStatusError as exc:
                errors.append(exc.status_code)

        first = threading.Thread(target=ask, args=("first",))
        first.start()
        time.sleep(0.1)
        ask("second")
        first.join()
        time.sleep(1.0)  # long enough for a second generate() call, if one were made
        assert server.stats["timeouts"] == 2.0
    assert errors == [504, 504]
    assert len(engine.calls) == 1


def test_fifty_concurrent_clients_are_answered_in_few_engine_calls(
    byte_tokenizer: Any, scripted
) -> None:
    import asyncio

    engine = scripted(byte_tokenizer, "ok", delay_s=0.05)
    with _server(engine, byte_tokenizer, batch_wait_s=0.05) as server:

        async def ask_all() -> list[Any]:
            async with openai.AsyncOpenAI(
                base_url=server.base_url, api_key=server.api_key, max_retries=0
            ) as client:
                return await asyncio.gather(
                    *(
                        client.chat.completions.create(
                            model="policy", messages=[{"role": "user", "content": f"q{i}"}]
                        )
                        for i in range(50)
                    )
                )

        replies = asyncio.run(ask_all())
        assert len(server.records) == 50
    assert {r.choices[0].message.content for r in replies} == {"ok"}
    assert len(engine.calls) < 25


def _conversation(count: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Play."}]
    for i in range(count):
        messages.append({"role": "user", "content": f"move {i}"})
        messages.append({"role": "assistant", "content": f"ok {i}"})
    messages.append({"role": "user", "content": "last"})
    return messages


def test_prompt_building_renders_linear_not_quadratic_in_messages(byte_tokenizer: Any) -> None:
    from areno_core.agentic.prompt import PromptBuilder
    from areno_core.models.chat import encode_prompt

    def rendered_messages(count: int) -> tuple[int, Any]:
        builder = PromptBuilder(byte_tokenizer)
        seen: list[int] = []
        original = builder.render
        builder.render = lambda m, t, gen=True: seen.append(len(m)) or original(m, t, gen)
        prompt = builder.build(_conversation(count), [])
        return sum(seen), prompt

    small, _ = rendered_messages(50)
    large, prompt = rendered_messages(400)
    # Each message is rendered a bounded number of times (in windows of a few messages), plus
    # one rendering of the whole conversation: linear. Rendering every prefix would make 8x
    # the messages cost 64x the work.
    assert large < 10 * small
    assert large < 12 * 802
    messages = _conversation(400)
    assert prompt.ids == encode_prompt(byte_tokenizer, messages)
    roles = [s["role"] for s in prompt.spans]
    assert roles == [m["role"] for m in messages] + ["generation_prompt"]
    assert [s["message_index"] for s in prompt.spans[:-1]] == list(range(len(messages)))

"""The OpenAI-compatible agent endpoint, driven by the official ``openai`` client."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from typing import Any

import openai
import pytest

from areno_core.agentic.server import AgentServer
from areno_core.agentic.trajectory import turn_tokens
from areno_core.agentic.types import AgentItem, AgentTrajectoryTurn
from areno_core.models.chat import apply_chat_template, encode_prompt
from areno_core.types import SamplingParams

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "choose_square",
            "description": "Play a square.",
            "parameters": {"type": "object", "properties": {"square": {"type": "integer"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You play tic-tac-toe."},
    {"role": "user", "content": "Your move."},
]
CALL = '<tool_call>{"name": "choose_square", "arguments": {"square": 5}}</tool_call>'


def _client(server: AgentServer, api_key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key=api_key or server.api_key, max_retries=0, timeout=30
    )


def _server(engine: Any, tokenizer: Any, **kw: Any) -> AgentServer:
    sampling = kw.pop("sampling", SamplingParams(max_new_tokens=128))
    return AgentServer(engine, tokenizer, sampling_defaults=sampling, timeout_s=30, **kw)


def _raw(server: AgentServer, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        connection.request(method, path, body=body, headers=headers)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


# -- the tiny random policy --------------------------------------------------------------------


def test_models_list_with_key_returns_policy(tiny_policy: Any) -> None:
    _model, tokenizer, engine = tiny_policy
    with _server(engine, tokenizer) as server:
        models = _client(server).models.list()
        assert [m.id for m in models.data] == ["policy"]
        assert server.base_url.startswith("http://127.0.0.1:")


def test_chat_without_tools_on_tiny_model_returns_exact_tokens(tiny_policy: Any) -> None:
    _model, tokenizer, engine = tiny_policy
    with _server(engine, tokenizer, sampling=SamplingParams(max_new_tokens=16)) as server:
        reply = _client(server).chat.completions.create(model="policy", messages=MESSAGES)
        choice = reply.choices[0]
        ext = choice.areno
        assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
        assert ext["prompt_token_ids"] == encode_prompt(tokenizer, MESSAGES)
        assert len(ext["token_ids"]) == len(ext["logprobs"]) == reply.usage.completion_tokens
        assert 1 <= len(ext["token_ids"]) <= 16
        assert all(lp <= 0.0 for lp in ext["logprobs"])
        assert choice.finish_reason == ext["finish_reason"] in ("stop", "length")
        body = ext["token_ids"][:-1] if ext["finish_reason"] == "stop" else ext["token_ids"]
        assert choice.message.content == tokenizer.decode(body, skip_special_tokens=True)
        assert choice.message.tool_calls is None
        assert [s["role"] for s in ext["prompt_spans"]] == ["system", "user", "generation_prompt"]
        assert ext["prompt_spans"][-1]["end"] == len(ext["prompt_token_ids"])
        record = server.records[reply.id].choices[0]
        assert list(record.token_ids) == ext["token_ids"]


def test_chat_with_tools_and_n2_on_tiny_model_returns_two_samples(tiny_policy: Any) -> None:
    _model, tokenizer, engine = tiny_policy
    with _server(engine, tokenizer) as server:
        reply = _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS, n=2, temperature=1.0, max_tokens=12
        )
        assert [c.index for c in reply.choices] == [0, 1]
        first, second = (c.areno for c in reply.choices)
        assert first["prompt_token_ids"] == second["prompt_token_ids"]
        assert first["token_ids"] != second["token_ids"]
        assert all(len(c.areno["token_ids"]) <= 12 for c in reply.choices)
        prompt = tokenizer.decode(first["prompt_token_ids"])
        assert '"name": "choose_square"' in prompt and "# Tools" in prompt
        assert reply.usage.completion_tokens == len(first["token_ids"]) + len(second["token_ids"])
    item = AgentItem(row={}, messages=tuple(MESSAGES), prompt_index=0, sample_index=0)
    turn = AgentTrajectoryTurn(item=item, messages=MESSAGES, response=reply, choice_index=1)
    assert list(turn_tokens(turn).token_ids) == second["token_ids"]


def test_chat_with_wrong_key_raises_authentication_error(tiny_policy: Any) -> None:
    _model, tokenizer, engine = tiny_policy
    with _server(engine, tokenizer) as server:
        with pytest.raises(openai.AuthenticationError, match="API key"):
            _client(server, api_key="wrong").chat.completions.create(
                model="policy", messages=MESSAGES
            )
        with pytest.raises(openai.AuthenticationError):
            _client(server, api_key="wrong").models.list()
        assert server.records == {}


def test_disable_thinking_prompt_ends_with_empty_think_block(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer, disable_thinking=True) as server:
        reply = _client(server).chat.completions.create(model="policy", messages=MESSAGES)
    prompt = byte_tokenizer.decode(reply.choices[0].areno["prompt_token_ids"])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


# -- scripted replies --------------------------------------------------------------------------


def test_scripted_tool_call_reaches_client_as_tool_calls(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "Centre.\n" + CALL)
    with _server(engine, byte_tokenizer) as server:
        reply = _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Centre."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "choose_square"
    assert json.loads(call.function.arguments) == {"square": 5}
    expected = [*byte_tokenizer.encode("Centre.\n" + CALL), byte_tokenizer.eos_token_id]
    assert choice.areno["token_ids"] == expected
    assert choice.areno["logprobs"] == [-0.25] * len(expected)


def test_scripted_tool_call_with_tool_choice_none_stays_text(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, CALL)
    with _server(engine, byte_tokenizer) as server:
        reply = _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS, tool_choice="none"
        )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == CALL
    assert reply.choices[0].finish_reason == "stop"


def test_scripted_malformed_tool_call_returns_text_content(byte_tokenizer: Any, scripted) -> None:
    text = '<tool_call>{"name": "choose_square", "arguments": </tool_call>'
    engine = scripted(byte_tokenizer, text)
    with _server(engine, byte_tokenizer) as server:
        reply = _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS
        )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == "stop"


def test_stop_string_cuts_text_and_keeps_tokens_through_it(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "abc STOP def")
    with _server(engine, byte_tokenizer) as server:
        reply = _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, stop=["zzz", "STOP"]
        )
    choice = reply.choices[0]
    assert choice.message.content == "abc "
    assert choice.finish_reason == "stop"
    assert choice.areno["token_ids"] == byte_tokenizer.encode("abc STOP")
    assert len(choice.areno["logprobs"]) == len(choice.areno["token_ids"])


def test_max_tokens_above_run_limit_is_capped(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "x" * 50)
    with _server(engine, byte_tokenizer, sampling=SamplingParams(max_new_tokens=8)) as server:
        reply = _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=100, temperature=0.5, top_p=0.9, seed=3
        )
    assert len(reply.choices[0].areno["token_ids"]) == 8
    assert reply.choices[0].finish_reason == "length"
    _, sampling, n = engine.calls[0]
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (
        8,
        0.5,
        0.9,
        3,
    )
    assert n == 1


def test_concurrent_requests_are_batched_on_one_thread(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok", delay_s=0.05)
    with _server(engine, byte_tokenizer, batch_wait_s=0.1) as server:

        async def ask_all() -> list[Any]:
            client = openai.AsyncOpenAI(
                base_url=server.base_url, api_key=server.api_key, max_retries=0
            )
            try:
                return await asyncio.gather(
                    *(
                        client.chat.completions.create(
                            model="policy", messages=[{"role": "user", "content": f"q{i}"}]
                        )
                        for i in range(6)
                    )
                )
            finally:
                await client.close()

        replies = asyncio.run(ask_all())
    assert all(r.choices[0].message.content == "ok" for r in replies)
    assert sum(len(prompts) for prompts, _, _ in engine.calls) == 6
    assert len(engine.calls) < 6
    assert max(len(prompts) for prompts, _, _ in engine.calls) >= 2
    assert engine.threads and threading.get_ident() not in engine.threads
    assert len(engine.threads) == 1


def test_request_slower_than_timeout_returns_504(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "late", delay_s=0.6)
    server = AgentServer(
        engine, byte_tokenizer, sampling_defaults=SamplingParams(max_new_tokens=8), timeout_s=0.2
    )
    with server, pytest.raises(openai.APIStatusError) as caught:
        _client(server).chat.completions.create(model="policy", messages=MESSAGES)
    assert caught.value.status_code == 504
    assert "agent-timeout-s" in str(caught.value)


def test_prompt_over_engine_limit_returns_context_length_error(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "ok", max_prompt_tokens=10)
    server = _server(engine, byte_tokenizer)
    with server, pytest.raises(openai.BadRequestError) as caught:
        _client(server).chat.completions.create(model="policy", messages=MESSAGES)
    assert caught.value.code == "context_length_exceeded"


def test_raw_requests_with_bad_path_or_body_return_errors(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer) as server:
        status, payload = _raw(server, "GET", "/v1/nothing")
        assert status == 404 and payload["error"]["type"] == "not_found_error"
        status, payload = _raw(server, "POST", "/v1/chat/completions", b"{not json")
        assert status == 400 and "not valid JSON" in payload["error"]["message"]
        status, payload = _raw(
            server, "POST", "/v1/chat/completions", b'{"model": "policy", "messages": []}'
        )
        assert status == 400 and payload["error"]["param"] == "messages"
        status, payload = _raw(server, "GET", "/v1/chat/completions")
        assert status == 405
        status, payload = _raw(server, "GET", "/v1/models/policy")
        assert status == 200 and payload["id"] == "policy"
    assert engine.calls == []


def test_stop_ends_threads_and_refuses_connections(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "ok")
    server = _server(engine, byte_tokenizer).start()
    port = server.port
    _client(server).chat.completions.create(model="policy", messages=MESSAGES)
    server.stop()
    names = {t.name for t in threading.enumerate()}
    assert not {"areno-agent-http", "areno-agent-sched"} & names
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/v1/models")


# -- exact token reuse across turns ------------------------------------------------------------


def test_second_turn_prompt_reuses_first_turn_tokens(byte_tokenizer: Any, scripted) -> None:
    compact = '<tool_call>{"name":"choose_square","arguments":{"square":5}}</tool_call>'

    def reply(prompt: str, call: int) -> str:
        return "I win." if "<tool_response>" in prompt else compact

    engine = scripted(byte_tokenizer, reply)
    with _server(engine, byte_tokenizer) as server:
        client = _client(server)
        first = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)
        message = first.choices[0].message
        call_id = message.tool_calls[0].id
        messages = [
            *MESSAGES,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call_id, "content": "X took square 5."},
        ]
        second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    one, two = first.choices[0].areno, second.choices[0].areno
    head = one["prompt_token_ids"] + one["token_ids"]
    assert two["prefix_reused"] is True and one["prefix_reused"] is False
    assert two["prompt_token_ids"][: len(head)] == head
    tail = byte_tokenizer.decode(two["prompt_token_ids"][len(head) :])
    assert tail == (
        "\n<|im_start|>tool\n<tool_response>X took square 5.</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    (tool_span,) = [s for s in two["prompt_spans"] if s["role"] == "tool"]
    tool_text = byte_tokenizer.decode(
        two["prompt_token_ids"][tool_span["start"] : tool_span["end"]]
    )
    assert (
        tool_text == "<|im_start|>tool\n<tool_response>X took square 5.</tool_response><|im_end|>\n"
    )
    # The template writes the call with spaces, so re-rendering would not share the prefix.
    rendered = byte_tokenizer.encode(
        apply_chat_template(byte_tokenizer, messages, tools=TOOLS), add_special_tokens=False
    )
    assert rendered[: len(head)] != head
    assert second.choices[0].message.content == "I win."


def test_changed_history_is_rendered_without_reuse(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, CALL)
    with _server(engine, byte_tokenizer) as server:
        client = _client(server)
        first = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)
        edited = {"role": "assistant", "content": "something else"}
        messages = [*MESSAGES, edited, {"role": "user", "content": "again"}]
        second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    assert first.choices[0].areno["prefix_reused"] is False
    two = second.choices[0].areno
    assert two["prefix_reused"] is False
    assert two["prompt_token_ids"] == encode_prompt(byte_tokenizer, messages, tools=TOOLS)


def _last_turn_thinking_tokenizer() -> Any:
    """The byte tokenizer with a template that, like Qwen3's, renders the last assistant turn
    with a think block but earlier ones without: not a prefix-stable template."""
    from areno_core.models.tokenizer import CHAT_TEMPLATE, build_byte_tokenizer

    marker = "{{- '<|im_start|>assistant\\n' -}}\n        {%- if message.reasoning_content"
    assert marker in CHAT_TEMPLATE
    think = "{%- if loop.last -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    tokenizer = build_byte_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE.replace(
        marker, marker.replace("-}}\n", "-}}\n" + think + "\n")
    )
    return tokenizer


def test_template_rendering_last_turn_differently_still_gets_spans_and_reuse(scripted) -> None:
    tokenizer = _last_turn_thinking_tokenizer()
    engine = scripted(tokenizer, CALL)
    with _server(engine, tokenizer) as server:
        client = _client(server)
        first = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)
        message = first.choices[0].message
        tool = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "ok"}
        messages = [*MESSAGES, message.model_dump(exclude_none=True), tool]
        second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        edited = [
            *MESSAGES,
            {"role": "assistant", "content": "hm"},
            {"role": "user", "content": "?"},
        ]
        third = client.chat.completions.create(model="policy", messages=edited, tools=TOOLS)
    one, two, three = (r.choices[0].areno for r in (first, second, third))
    head = one["prompt_token_ids"] + one["token_ids"]
    assert two["prefix_reused"] and two["prompt_token_ids"][: len(head)] == head
    assert [s["role"] for s in two["prompt_spans"]][-2:] == ["tool", "generation_prompt"]
    full = apply_chat_template(tokenizer, edited, tools=TOOLS)
    assert "<think>" not in full
    assert three["prompt_token_ids"] == tokenizer.encode(full, add_special_tokens=False)
    roles = [s["role"] for s in three["prompt_spans"]]
    assert roles == ["system", "user", "assistant", "user", "generation_prompt"]

"""OpenAI API behaviour of the agent endpoint: validation, streaming, logprobs, tool_choice,
and responses that parse as the OpenAI SDK's own types."""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any

import openai
import pytest
import torch
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from areno_core.agentic.server import AgentServer
from areno_core.types import SamplingParams

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "choose_square",
            "parameters": {"type": "object", "properties": {"square": {"type": "integer"}}},
        },
    },
    {"type": "function", "function": {"name": "resign", "parameters": {"type": "object"}}},
]
MESSAGES = [{"role": "user", "content": "Your move."}]
CALL = '<tool_call>{"name": "choose_square", "arguments": {"square": 5}}</tool_call>'


def _server(engine: Any, tokenizer: Any, **kw: Any) -> AgentServer:
    sampling = kw.pop("sampling", SamplingParams(max_new_tokens=128))
    return AgentServer(engine, tokenizer, sampling_defaults=sampling, timeout_s=30, **kw)


def _client(server: AgentServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)


def _post(server: AgentServer, body: bytes) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Authorization": f"Bearer {server.api_key}"},
        )
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


BASE = {"model": "policy", "messages": MESSAGES}
BAD_REQUESTS = [
    (b'{"model": "policy", "messages": [{"role": "user", "content": "hi"}], '
     b'"temperature": NaN}', None, "not valid JSON"),
    (json.dumps(BASE)[:-1].encode() + b', "temperature": 1e999}', "temperature", "finite"),
    (json.dumps({**BASE, "temperature": -0.5}).encode(), "temperature", "greater than or equal"),
    (json.dumps({**BASE, "model": 3}).encode(), "model", "string"),
    (json.dumps({"model": "policy", "messages": [{"role": "wizard", "content": "hi"}]}).encode(),
     "messages[0]", "unknown role 'wizard'"),
    (json.dumps({"model": "policy", "messages": [{"role": "function", "content": "x",
                                                  "name": "f"}]}).encode(),
     "messages[0]", "unknown role 'function'"),
    (json.dumps({"model": "policy", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}).encode(),
     "messages[0].content", None),
    (json.dumps({**BASE, "frobnicate": 1}).encode(), "frobnicate", "unrecognized request argument"),
    (json.dumps({**BASE, "response_format": {"type": "json_object"}}).encode(),
     "response_format", "constrained decoding"),
    (json.dumps({**BASE, "presence_penalty": 0.5}).encode(), "presence_penalty", "penalties"),
    (json.dumps({**BASE, "logit_bias": {"5": 10}}).encode(), "logit_bias", "bias"),
    (json.dumps({**BASE, "top_logprobs": 2}).encode(), "top_logprobs", "'logprobs': true"),
    (json.dumps({**BASE, "n": 65}).encode(), "n", "less than or equal"),
    (json.dumps({**BASE, "top_p": 0}).encode(), "top_p", "greater than"),
    (json.dumps({**BASE, "top_k": 0}).encode(), "top_k", "-1 or a positive"),
    (json.dumps({**BASE, "max_tokens": 0}).encode(), "max_tokens", "greater than or equal"),
    (json.dumps({**BASE, "stop": ["", "x"]}).encode(), "stop", "must not be empty"),
    (json.dumps({**BASE, "tool_choice": "required"}).encode(), "tool_choice", "no 'tools'"),
    (json.dumps({**BASE, "tools": TOOLS, "tool_choice": {"type": "function",
                                                          "function": {"name": "fly"}}}).encode(),
     "tool_choice", "'fly', which is not in 'tools'"),
    (json.dumps({**BASE, "tool_choice": "sometimes"}).encode(), "tool_choice", None),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param", "text"), BAD_REQUESTS)
def test_bad_request_returns_400_naming_the_parameter(
    byte_tokenizer: Any, scripted, body: bytes, param: str | None, text: str | None
) -> None:
    engine = scripted(byte_tokenizer, "ok")
    with _server(engine, byte_tokenizer) as server:
        status, payload = _post(server, body)
    assert status == 400, payload
    error = payload["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param), error
    if text is not None:
        assert text in error["message"], error["message"]
    assert engine.calls == []


def test_response_parses_as_openai_types_with_refusal_and_areno(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "Centre.\n" + CALL)
    body = json.dumps({**BASE, "tools": TOOLS, "developer": None} | {}).encode()
    body = json.dumps({"model": "any-name", "tools": TOOLS, "messages": [
        {"role": "developer", "content": "Be brief."}, *MESSAGES]}).encode()  # fmt: skip
    with _server(engine, byte_tokenizer) as server:
        status, payload = _post(server, body)
    assert status == 200
    parsed = ChatCompletion.model_validate(payload)
    choice = parsed.choices[0]
    assert parsed.model == "any-name" and choice.finish_reason == "tool_calls"
    assert choice.message.refusal is None and "refusal" in payload["choices"][0]["message"]
    assert choice.logprobs is None
    assert set(choice.model_extra or {}) == {"areno"}
    prompt = byte_tokenizer.decode(choice.model_extra["areno"]["prompt_token_ids"])
    assert "Be brief." in prompt  # a developer message is rendered as the system message


def test_stream_true_sends_chunks_with_tool_calls_areno_and_usage(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "Centre.\n" + CALL)
    with _server(engine, byte_tokenizer) as server:
        stream = _client(server).chat.completions.create(
            model="policy",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len({c.id for c in chunks}) == 1
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert content == "Centre."
    assert [(t.index, t.function.name) for t in calls] == [(0, "choose_square")]
    assert json.loads(calls[0].function.arguments) == {"square": 5}
    assert finishes[-1] == "tool_calls"
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    extension = final.choices[0].model_extra["areno"]
    record = server.records[final.id].choices[0]
    assert extension["token_ids"] == list(record.token_ids)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(record.token_ids)


def test_stream_with_async_client_matches_plain_response(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "Hello there")
    with _server(engine, byte_tokenizer) as server:

        async def both() -> tuple[str, str]:
            async with openai.AsyncOpenAI(
                base_url=server.base_url, api_key=server.api_key, max_retries=0
            ) as client:
                plain = await client.chat.completions.create(model="policy", messages=MESSAGES)
                stream = await client.chat.completions.create(
                    model="policy", messages=MESSAGES, stream=True
                )
                text = "".join([c.choices[0].delta.content or "" async for c in stream])
                return plain.choices[0].message.content or "", text

        plain, streamed = asyncio.run(both())
    assert plain == streamed == "Hello there"


def test_logprobs_are_returned_only_when_asked(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "abc")
    with _server(engine, byte_tokenizer) as server:
        client = _client(server)
        without = client.chat.completions.create(model="policy", messages=MESSAGES)
        asked = client.chat.completions.create(model="policy", messages=MESSAGES, logprobs=True)
        with pytest.raises(openai.BadRequestError, match="does not expose"):
            client.chat.completions.create(
                model="policy", messages=MESSAGES, logprobs=True, top_logprobs=2
            )
    assert without.choices[0].logprobs is None
    content = asked.choices[0].logprobs.content
    assert [c.token for c in content] == ["a", "b", "c", "<|im_end|>"]
    assert [c.bytes for c in content] == [[97], [98], [99], list(b"<|im_end|>")]
    assert [c.logprob for c in content] == asked.choices[0].areno["logprobs"] == [-0.25] * 4
    assert all(c.top_logprobs == [] for c in content)


def test_top_logprobs_on_tiny_model_match_a_forward_pass(tiny_policy: Any) -> None:
    model, tokenizer, engine = tiny_policy
    with _server(engine, tokenizer, sampling=SamplingParams(max_new_tokens=6)) as server:
        reply = _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, logprobs=True, top_logprobs=3, temperature=1.0
        )
    ext = reply.choices[0].areno
    content = reply.choices[0].logprobs.content
    assert len(content) == len(ext["token_ids"])
    ids = torch.tensor([ext["prompt_token_ids"] + ext["token_ids"]])
    with torch.no_grad():
        scores = model(input_ids=ids).logits[0].float().log_softmax(-1)
    start = len(ext["prompt_token_ids"]) - 1
    for k, entry in enumerate(content):
        top = entry.top_logprobs
        assert len(top) == 3
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        expected, index = scores[start + k].topk(3)
        torch.testing.assert_close(
            torch.tensor([t.logprob for t in top]), expected, atol=1e-4, rtol=1e-4
        )
        # ids below 256 are single bytes of the byte tokenizer, spelled exactly
        for t, i in zip(top, index.tolist(), strict=True):
            if i < 256:
                assert bytes(t.bytes) == bytes([i])
        torch.testing.assert_close(
            torch.tensor(entry.logprob),
            scores[start + k, ext["token_ids"][k]],
            atol=1e-4,
            rtol=1e-4,
        )


def _forced(prompt: str, call: int) -> str:
    if prompt.endswith('<tool_call>{"name": "resign", "arguments": '):
        return "{}}</tool_call>"
    if prompt.endswith("<tool_call>"):
        return '{"name": "choose_square", "arguments": {"square": 7}}</tool_call>'
    return "I would rather talk."


def test_tool_choice_required_and_named_start_the_reply_with_a_call(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, _forced)
    with _server(engine, byte_tokenizer) as server:
        client = _client(server)
        auto = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)
        required = client.chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS, tool_choice="required"
        )
        named = client.chat.completions.create(
            model="policy",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "resign"}},
        )
        follow = client.chat.completions.create(
            model="policy",
            messages=[
                *MESSAGES,
                required.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": "x", "content": "ok"},
            ],
            tools=TOOLS,
        )
    assert auto.choices[0].message.tool_calls is None
    (call,) = required.choices[0].message.tool_calls
    assert call.function.name == "choose_square" and json.loads(call.function.arguments) == {
        "square": 7
    }
    assert required.choices[0].finish_reason == "tool_calls"
    ext = required.choices[0].areno
    assert byte_tokenizer.decode(ext["prompt_token_ids"]).endswith("<tool_call>")
    assert ext["prompt_spans"][-1]["role"] == "tool_choice"
    assert byte_tokenizer.decode(ext["token_ids"]).startswith('{"name": "choose_square"')
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "resign" and json.loads(call.function.arguments) == {}
    # the forced start is part of the prompt the next turn reuses, token for token
    head = ext["prompt_token_ids"] + ext["token_ids"]
    assert follow.choices[0].areno["prefix_reused"] is True
    assert follow.choices[0].areno["prompt_token_ids"][: len(head)] == head


def test_tool_choice_required_with_template_without_calls_is_refused(scripted) -> None:
    from areno_core.models.tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    engine = scripted(tokenizer, "ok")
    with _server(engine, tokenizer) as server, pytest.raises(openai.BadRequestError) as caught:
        _client(server).chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS, tool_choice="required"
        )
    assert caught.value.param == "tool_choice"
    assert "cannot be enforced" in str(caught.value)


def test_parallel_tool_calls_false_keeps_the_first_call(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, CALL + "\n" + CALL.replace("5", "6"))
    with _server(engine, byte_tokenizer) as server:
        client = _client(server)
        both = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)
        one = client.chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS, parallel_tool_calls=False
        )
    assert len(both.choices[0].message.tool_calls) == 2
    assert len(one.choices[0].message.tool_calls) == 1
    assert one.choices[0].areno["token_ids"] == both.choices[0].areno["token_ids"]

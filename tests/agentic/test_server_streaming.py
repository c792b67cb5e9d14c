"""``stream: true`` sends text as the engine samples it (engines that report tokens through
``generate(..., on_tokens=...)``), tool calls as OpenAI-style deltas at the end."""

from __future__ import annotations

import time
from typing import Any

import openai
import torch

from areno_core.agentic.server import AgentServer
from areno_core.types import Completion, SamplingParams

from .conftest import LOGPROB

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'


class TokenByTokenEngine:
    """Samples a fixed reply one token every ``delay_s``, reporting each through
    ``on_tokens`` as a real engine does; records when it finished."""

    def __init__(
        self, tokenizer: Any, reply: str, delay_s: float = 0.02, *, report_logprobs: bool = False
    ) -> None:
        self.tokenizer, self.reply, self.delay_s = tokenizer, reply, delay_s
        self.report_logprobs = report_logprobs
        self.max_prompt_tokens = 100_000
        self.finished_at = 0.0

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, n: int = 1, on_tokens=None
    ) -> list[list[Completion]]:
        ids = [*self.tokenizer.encode(self.reply, add_special_tokens=False)]
        ids.append(self.tokenizer.eos_token_id)
        for k, token in enumerate(ids):
            time.sleep(self.delay_s)
            if on_tokens is not None:
                extra = (self._logprob(k),) if self.report_logprobs else ()
                on_tokens([(p, s, token, *extra) for p in range(len(prompts)) for s in range(n)])
        self.finished_at = time.monotonic()
        return [
            [
                Completion(
                    prompt_ids=tuple(prompt),
                    token_ids=tuple(ids),
                    logprobs=tuple(self._logprob(k) for k in range(len(ids))),
                    text=self.reply,
                    finish_reason="stop",
                )
                for _ in range(n)
            ]
            for prompt in prompts
        ]

    @staticmethod
    def _logprob(position: int) -> float:
        """A distinct logprob per position, so misplaced entries show."""
        return LOGPROB - position / 64


def _stream(server: AgentServer, **kw: Any) -> tuple[list[Any], list[float]]:
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
    chunks, times = [], []
    with client:
        for chunk in client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], stream=True, **kw
        ):
            chunks.append(chunk)
            times.append(time.monotonic())
    return chunks, times


def _server(engine: Any, tokenizer: Any) -> AgentServer:
    return AgentServer(
        engine, tokenizer, sampling_defaults=SamplingParams(max_new_tokens=128), timeout_s=30
    )


def test_text_arrives_while_it_is_sampled(byte_tokenizer: Any) -> None:
    reply = "Streaming works one piece at a time."
    engine = TokenByTokenEngine(byte_tokenizer, reply)
    with _server(engine, byte_tokenizer) as server:
        chunks, times = _stream(server)
        record = server.records[chunks[0].id]
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 5  # many deltas, not one chunk at the end
    assert "".join(texts) == reply == record.choices[0].message["content"]
    first = next(t for t, c in zip(times, chunks, strict=True) if c.choices[0].delta.content)
    assert first < engine.finished_at  # the first text came before sampling ended
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_tool_call_markup_is_never_streamed_as_text(byte_tokenizer: Any) -> None:
    engine = TokenByTokenEngine(byte_tokenizer, "Let me add.\n" + CALL, delay_s=0.005)
    with _server(engine, byte_tokenizer) as server:
        chunks, _ = _stream(server, tools=TOOLS)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    text = "".join(d.content or "" for d in deltas)
    assert text == "Let me add."
    calls = [call for d in deltas for call in d.tool_calls or ()]
    assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [
        (0, "add", '{"a": 2, "b": 2}')
    ]
    assert sum(bool(d.content) for d in deltas) > 2
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def _native_server(tiny_policy: Any, seed: int) -> AgentServer:
    """A server over the tiny native engine that samples 24 tokens at temperature 1, from
    torch seed ``seed``."""
    _model, tokenizer, engine = tiny_policy
    torch.manual_seed(seed)
    return AgentServer(
        engine,
        tokenizer,
        sampling_defaults=SamplingParams(max_new_tokens=24, temperature=1.0),
        timeout_s=60,
    )


def test_native_engine_streams_its_tokens(tiny_policy: Any) -> None:
    with _native_server(tiny_policy, seed=0) as server:
        assert server.streams_tokens
        chunks, _ = _stream(server)
        record = server.records[chunks[0].id]
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1
    assert "".join(texts) == (record.choices[0].message["content"] or "")


def test_logprobs_arrive_with_the_chunk_of_their_tokens(byte_tokenizer: Any) -> None:
    reply = "Each piece brings its own logprobs."
    engine = TokenByTokenEngine(byte_tokenizer, reply, report_logprobs=True)
    with _server(engine, byte_tokenizer) as server:
        chunks, times = _stream(server, logprobs=True)
        record = server.records[chunks[0].id].choices[0]
    with_text = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(with_text) > 5
    for chunk in with_text:  # one byte per token: a chunk's entries spell exactly its text
        entries = chunk.choices[0].logprobs.content
        assert "".join(e.token for e in entries) == chunk.choices[0].delta.content
    first = next(t for t, c in zip(times, chunks, strict=True) if c.choices[0].logprobs)
    assert first < engine.finished_at  # logprobs came while sampling went on
    entries = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.logprob for e in entries] == list(record.logprobs)  # each once, in order
    assert [bytes(e.bytes) for e in entries][-1] == b"<|im_end|>"  # the end token, at the end


def test_openai_stream_helper_accumulates_logprobs_and_tool_calls(byte_tokenizer: Any) -> None:
    engine = TokenByTokenEngine(
        byte_tokenizer, "Let me add.\n" + CALL, delay_s=0.005, report_logprobs=True
    )
    client_kw = {"model": "policy", "messages": [{"role": "user", "content": "2+2?"}]}
    with _server(engine, byte_tokenizer) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
        with client, client.chat.completions.stream(**client_kw, tools=TOOLS, logprobs=True) as s:
            events = [event.type for event in s]
            final = s.get_final_completion()
        record = server.records[final.id].choices[0]
    choice = final.choices[0]
    assert choice.message.content == "Let me add."
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("add", '{"a": 2, "b": 2}')
    assert [e.logprob for e in choice.logprobs.content] == list(record.logprobs)
    assert events.count("content.delta") > 2 and events.count("logprobs.content.delta") > 2
    assert choice.finish_reason == "tool_calls"


def test_native_engine_streams_logprobs_as_it_samples(tiny_policy: Any) -> None:
    with _native_server(tiny_policy, seed=1) as server:
        chunks, _ = _stream(server, logprobs=True)
        record = server.records[chunks[0].id].choices[0]
    carrying = [c for c in chunks if c.choices and c.choices[0].logprobs]
    entries = [e for c in carrying for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in entries] == list(record.logprobs)
    assert sum(bool(c.choices[0].logprobs.content) for c in carrying) > 1

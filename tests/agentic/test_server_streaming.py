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

    def __init__(self, tokenizer: Any, reply: str, delay_s: float = 0.02) -> None:
        self.tokenizer, self.reply, self.delay_s = tokenizer, reply, delay_s
        self.max_prompt_tokens = 100_000
        self.finished_at = 0.0

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, n: int = 1, on_tokens=None
    ) -> list[list[Completion]]:
        ids = [*self.tokenizer.encode(self.reply, add_special_tokens=False)]
        ids.append(self.tokenizer.eos_token_id)
        for token in ids:
            time.sleep(self.delay_s)
            if on_tokens is not None:
                on_tokens([(p, s, token) for p in range(len(prompts)) for s in range(n)])
        self.finished_at = time.monotonic()
        return [
            [
                Completion(
                    prompt_ids=tuple(prompt),
                    token_ids=tuple(ids),
                    logprobs=(LOGPROB,) * len(ids),
                    text=self.reply,
                    finish_reason="stop",
                )
                for _ in range(n)
            ]
            for prompt in prompts
        ]


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


def test_native_engine_streams_its_tokens(tiny_policy: Any) -> None:
    _model, tokenizer, engine = tiny_policy
    torch.manual_seed(0)
    server = AgentServer(
        engine,
        tokenizer,
        sampling_defaults=SamplingParams(max_new_tokens=24, temperature=1.0),
        timeout_s=60,
    )
    with server:
        assert server.streams_tokens
        chunks, _ = _stream(server)
        record = server.records[chunks[0].id]
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1
    assert "".join(texts) == (record.choices[0].message["content"] or "")

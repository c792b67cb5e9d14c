"""Fixtures for the agentic tests: the byte tokenizer, a tiny random Qwen3 policy with the native
engine, and a scripted engine whose replies are fixed text (for deterministic tool calls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from areno_core.agentic.collect import collect_agentic_groups
from areno_core.models.tokenizer import build_byte_tokenizer
from areno_core.rewards import RewardScorer
from areno_core.types import Completion, PromptItem, SamplingParams

LOGPROB = -0.25
# The tool the collect tests' agents offer, and the call the scripted model makes to it.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    }
]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'


def prompt_items(count: int = 2, *, tools: bool) -> list[PromptItem]:
    """``count`` prompts "What is 2 + 2? (i)" (answer 4) at indices 10, 11, ...; their rows
    carry :data:`TOOLS` when ``tools``."""
    return [
        PromptItem(
            index=10 + i,
            row={"id": i, "tools": TOOLS} if tools else {"id": i},
            messages=({"role": "user", "content": f"What is 2 + 2? ({i})"},),
            answer="4",
        )
        for i in range(count)
    ]


def tool_reply(prompt: str, call: int) -> str:
    """A scripted model's reply: the answer once a tool result is in the prompt, else a call."""
    if "<tool_response>sum=4" in prompt:
        return "The answer is 4."
    return "Let me add.\n" + CALL


def collect(
    engine: Any, tokenizer: Any, agent: Any, items: list[PromptItem], **kw: Any
) -> tuple[list, dict]:
    """``collect_agentic_groups`` on ``items``: 2 samples each, up to 96 new tokens, reward 0,
    a 20 s timeout; ``kw`` overrides any of these."""
    options: dict[str, Any] = {
        "sampling": SamplingParams(max_new_tokens=96),
        "n_samples": 2,
        "scorer": RewardScorer(lambda record: 0.0),
        "timeout_s": 20.0,
    }
    options.update(kw)
    return collect_agentic_groups(
        items, agent_fn=agent, engine=engine, tokenizer=tokenizer, **options
    )


class ScriptedEngine:
    """A rollout engine stub: ``reply(prompt_text, call)`` gives the text each sample "samples"
    (``call`` counts generate() calls). Tokens are the reply's bytes plus ``<|im_end|>``, each
    with logprob ``LOGPROB``; replies longer than ``max_new_tokens`` are cut (finish "length").
    """

    def __init__(
        self,
        tokenizer: Any,
        reply: Callable[[str, int], str],
        *,
        delay_s: float = 0.0,
        max_prompt_tokens: int = 100_000,
    ) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.delay_s = delay_s
        self.max_prompt_tokens = max_prompt_tokens
        self.calls: list[tuple[list[list[int]], SamplingParams, int]] = []
        self.threads: set[int] = set()
        self.stats: dict[str, float] = {}
        self.eos = tokenizer.eos_token_id

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        n: int = 1,
        generator: torch.Generator | None = None,
    ) -> list[list[Completion]]:
        self.threads.add(threading.get_ident())
        self.calls.append(([list(p) for p in prompts], sampling, n))
        if self.delay_s:
            time.sleep(self.delay_s)
        out: list[list[Completion]] = []
        for prompt in prompts:
            if len(prompt) > self.max_prompt_tokens:
                out.append([])
                continue
            text = self.reply(self.tokenizer.decode(prompt), len(self.calls))
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos]
            finish = "stop"
            if len(ids) > sampling.max_new_tokens:
                ids, finish = ids[: sampling.max_new_tokens], "length"
            out.append(
                [
                    Completion(
                        prompt_ids=tuple(prompt),
                        token_ids=tuple(ids),
                        logprobs=(LOGPROB,) * len(ids),
                        text=text,
                        finish_reason=finish,
                    )
                    for _ in range(n)
                ]
            )
        return out


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread: None) -> None:
    """Every agentic test module runs torch on one thread."""


@pytest.fixture(scope="session")
def byte_tokenizer() -> Any:
    return build_byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_policy() -> tuple[Any, Any, Any]:
    """``(model, tokenizer, engine)``: random:qwen3-tiny and a native engine over it."""
    from areno_core.models.loading import load_model_and_tokenizer
    from areno_core.rollout import EngineOptions, NativeEngine

    model, tokenizer = load_model_and_tokenizer("random:qwen3-tiny")
    engine = NativeEngine(
        model, tokenizer, EngineOptions(attn_backend="native", max_prompt_tokens=8192)
    )
    return model, tokenizer, engine


@pytest.fixture
def scripted() -> Callable[..., ScriptedEngine]:
    """``scripted(tokenizer, reply, **options)`` builds a :class:`ScriptedEngine`."""

    def make(tokenizer: Any, reply: Callable[[str, int], str] | Sequence[str] | str, **kw: Any):
        if isinstance(reply, str):
            text = reply
            return ScriptedEngine(tokenizer, lambda prompt, call: text, **kw)
        if not callable(reply):
            replies = list(reply)
            return ScriptedEngine(
                tokenizer, lambda prompt, call: replies[min(call, len(replies)) - 1], **kw
            )
        return ScriptedEngine(tokenizer, reply, **kw)

    return make

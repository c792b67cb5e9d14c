"""collect_agentic_groups end to end: agents, tool results, failures, rewards, limits."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from areno_core.agentic.collect import AgentError, resolve_agent_fn
from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)
from areno_core.errors import UserCodeError
from areno_core.rewards import RewardScorer
from areno_core.train.forward import token_logprobs_from_logits
from areno_core.types import RewardRecord, SamplingParams

from .conftest import CALL, collect, prompt_items, tool_reply


def _client(ctx: AgentContext) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=ctx.get_base_url(), api_key=ctx.api_key, max_retries=0)


Play = Callable[[openai.AsyncOpenAI, AgentContext, AgentItem], Awaitable[Any]]


def _each_sample(play: Play, **run_each: Any) -> Callable[[AgentContext, AgentBatch], Any]:
    """An agent that runs ``play(client, ctx, item)`` for every sample of its batch (through
    ``ctx.run_each`` with ``run_each``'s options), all on one client that it closes after."""

    async def agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
        async with _client(ctx) as client:
            return await ctx.run_each(batch, lambda item: play(client, ctx, item), **run_each)

    return agent


async def _two_turns(client: openai.AsyncOpenAI, ctx: AgentContext, item: AgentItem) -> Any:
    """Ask, run the tool the model called (or a default), append the result, ask again."""
    messages: list[Any] = list(item.messages)
    tools = item.row["tools"]
    turns = []
    first = await client.chat.completions.create(model=ctx.model, messages=messages, tools=tools)
    turns.append(AgentTrajectoryTurn(item=item, messages=list(messages), response=first))
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    calls = message.tool_calls or []
    total = sum(json.loads(calls[0].function.arguments).values()) if calls else 0
    call_id = calls[0].id if calls else "none"
    messages.append({"role": "tool", "tool_call_id": call_id, "content": f"sum={total}"})
    second = await client.chat.completions.create(model=ctx.model, messages=messages, tools=tools)
    turns.append(AgentTrajectoryTurn(item=item, messages=list(messages), response=second))
    messages.append(second.choices[0].message.model_dump(exclude_none=True))
    return AgentTrajectory(item=item, turns=turns, messages=messages, metadata={"tool": "add"})


two_turn_agent = _each_sample(_two_turns)


def _collect(engine: Any, tokenizer: Any, agent: Any, **kw: Any) -> tuple[list, dict]:
    return collect(
        engine, tokenizer, agent, kw.pop("items", None) or prompt_items(tools=True), **kw
    )


def test_collect_two_turn_tool_agent_builds_scored_groups(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, tool_reply)
    seen: list[RewardRecord] = []

    def reward(record: RewardRecord) -> float:
        seen.append(record)
        ok = "4" in record.completion and record.tool_results[0]["content"] == "sum=4"
        return 1.0 if ok else 0.0

    groups, metrics = _collect(engine, byte_tokenizer, two_turn_agent, scorer=RewardScorer(reward))
    assert [g.item.index for g in groups] == [10, 11]
    assert [[t.sample_index for t in g.trajectories] for g in groups] == [[0, 1], [0, 1]]
    assert all(t.reward == 1.0 for g in groups for t in g.trajectories)
    first_reply = [*byte_tokenizer.encode("Let me add.\n" + CALL), byte_tokenizer.eos_token_id]
    final_reply = [*byte_tokenizer.encode("The answer is 4."), byte_tokenizer.eos_token_id]
    for group in groups:
        for trajectory in group.trajectories:
            assert trajectory.input_ids[-len(final_reply) :] == final_reply
            assert trajectory.num_action_tokens == len(first_reply) + len(final_reply)
            assert trajectory.metadata["history_rewrites"] == 0
            assert trajectory.metadata["prefix_reused"] == 1
            assert trajectory.metadata["reward_source"] == "reward_fn"
            p = trajectory.prompt_len
            assert trajectory.input_ids[p : p + len(first_reply)] == first_reply
            assert trajectory.loss_mask[p : p + len(first_reply)] == [1] * len(first_reply)
    record = seen[0]
    assert record.tool_calls[0]["function"]["name"] == "add"
    assert [m["role"] for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    assert record.metadata["tool"] == "add" and len(record.metadata["trace"]) == 2
    assert record.answer == "4" and record.row["id"] in (0, 1)
    assert metrics["rollout/samples"] == 4.0
    assert metrics["rollout/accuracy"] == 1.0
    assert metrics["rollout/turns_mean"] == 2.0 and metrics["rollout/turns_max"] == 2.0
    assert metrics["rollout/tool_calls_mean"] == 1.0
    assert metrics["rollout/agent_errors"] == 0.0 and metrics["rollout/context_overflow"] == 0.0
    assert metrics["rollout/agent_requests"] == 8.0
    assert metrics["rollout/agent_generate_calls"] < 8.0  # concurrent turns were batched
    assert metrics["time/agent"] > 0.0


def test_collect_with_tiny_model_trains_tool_results_when_asked(tiny_policy: Any) -> None:
    model, tokenizer, engine = tiny_policy
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    groups, metrics = _collect(
        engine,
        tokenizer,
        two_turn_agent,
        items=prompt_items(1, tools=True),
        sampling=sampling,
        train_tool_results=True,
        generator=generator,
    )
    (group,) = groups
    assert len(group.trajectories) == 2
    for trajectory in group.trajectories:
        tool_positions = trajectory.metadata["tool_positions"]
        tool_text = tokenizer.decode([trajectory.input_ids[i] for i in tool_positions])
        assert tool_text == "<|im_start|>tool\n<tool_response>sum=0</tool_response><|im_end|>\n"
        assert all(trajectory.loss_mask[i] == 1 for i in tool_positions)
        assert trajectory.metadata["history_rewrites"] == 0
        ids = torch.tensor([trajectory.input_ids])
        with torch.no_grad():
            expected = token_logprobs_from_logits(model(input_ids=ids).logits, ids)[0]
        got = torch.tensor([trajectory.rollout_logprobs[i] for i in tool_positions])
        torch.testing.assert_close(got, expected[tool_positions], atol=1e-4, rtol=1e-4)
        sampled = [i for i, m in enumerate(trajectory.loss_mask) if m and i not in tool_positions]
        assert 2 <= len(sampled) <= 24  # both turns sampled 1 to 12 tokens
        got = torch.tensor([trajectory.rollout_logprobs[i] for i in sampled])
        torch.testing.assert_close(got, expected[sampled], atol=1e-4, rtol=1e-4)
    assert metrics["rollout/turns_mean"] == 2.0


def test_collect_counts_crashed_timed_out_and_empty_samples(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "fine")

    async def sample(client: openai.AsyncOpenAI, ctx: AgentContext, item: AgentItem) -> Any:
        key = (item.prompt_index, item.sample_index)
        if key == (10, 0):
            raise ValueError("tool exploded")
        if key == (10, 1):
            await asyncio.sleep(30)
        if key == (11, 0):
            return None
        reply = await client.chat.completions.create(model=ctx.model, messages=item.messages)
        return AgentTrajectoryTurn(item=item, messages=item.messages, response=reply)

    agent = _each_sample(sample, timeout_s=1.5)

    groups, metrics = _collect(engine, byte_tokenizer, agent)
    assert [(g.item.index, [t.sample_index for t in g.trajectories]) for g in groups] == [(11, [1])]
    assert metrics["rollout/agent_errors"] == 3.0
    assert metrics["rollout/agent_timeouts"] == 1.0
    assert metrics["rollout/skipped_prompts"] == 1.0
    assert metrics["rollout/samples"] == 1.0


def test_collect_agent_timeout_keeps_finished_samples(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "fine")

    async def sample(client: openai.AsyncOpenAI, ctx: AgentContext, item: AgentItem) -> Any:
        if item.key == (11, 1):
            await asyncio.sleep(30)
        reply = await client.chat.completions.create(model=ctx.model, messages=item.messages)
        return AgentTrajectoryTurn(item=item, messages=item.messages, response=reply)

    agent = _each_sample(sample)

    groups, metrics = _collect(engine, byte_tokenizer, agent, timeout_s=2.0)
    assert [len(g.trajectories) for g in groups] == [2, 1]
    assert metrics["rollout/agent_errors"] == 1.0
    assert metrics["rollout/agent_timeouts"] == 1.0


def test_collect_agent_that_raises_fails_the_step(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "fine")

    async def agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
        raise RuntimeError("agent setup broke")

    with pytest.raises(AgentError, match="agent setup broke") as caught:
        _collect(engine, byte_tokenizer, agent)
    assert "Traceback" in str(caught.value)
    assert engine.calls == []


def test_collect_async_generator_agent_reward_skips_reward_fn(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "fine")
    calls: list[Any] = []

    async def agent(ctx: AgentContext, batch: AgentBatch) -> Any:
        async with _client(ctx) as client:
            for item in batch.iter_samples():
                reply = await client.chat.completions.create(
                    model=ctx.model, messages=item.messages
                )
                reward = 0.5 if item.sample_index == 0 else None
                yield AgentTrajectoryTurn(item, item.messages, reply, reward=reward)

    scorer = RewardScorer(lambda record: calls.append(record) or 0.25)
    groups, metrics = _collect(engine, byte_tokenizer, agent, scorer=scorer)
    rewards = [[t.reward for t in g.trajectories] for g in groups]
    assert rewards == [[0.5, 0.25], [0.5, 0.25]]
    assert len(calls) == 2
    assert {g.trajectories[0].metadata["reward_source"] for g in groups} == {"agent"}
    assert metrics["rollout/turns_mean"] == 1.0


def test_collect_drops_rows_over_max_context_len(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, tool_reply)
    groups, metrics = _collect(engine, byte_tokenizer, two_turn_agent, max_context_len=40)
    assert groups == []
    assert metrics["rollout/context_overflow"] == 4.0
    assert metrics["rollout/agent_errors"] == 0.0
    assert metrics["rollout/samples"] == 0.0


async def _returns_nothing(ctx: AgentContext, batch: AgentBatch) -> None:
    return None


async def _returns_a_foreign_item(ctx: AgentContext, batch: AgentBatch) -> Any:
    stranger = AgentItem(row={}, messages=(), prompt_index=99, sample_index=0)
    return AgentTrajectory(item=stranger, turns=[])


async def _returns_a_dict(ctx: AgentContext, batch: AgentBatch) -> Any:
    return {"not": "a trajectory"}


async def _reuses_one_response(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
    """Asks once, then hands that one response to every sample."""
    async with _client(ctx) as client:
        items = list(batch.iter_samples())
        reply = await _ask(client, ctx, items[0].messages)
        return [AgentTrajectoryTurn(item, item.messages, reply) for item in items]


@pytest.mark.parametrize(
    ("agent", "error", "match"),
    [
        pytest.param(
            _returns_nothing,
            AgentError,
            "returned no turns for sample .* made no request",
            id="nothing",
        ),
        pytest.param(
            _returns_a_foreign_item,
            UserCodeError,
            r"\(99, 0\), which is not in this step's batch",
            id="foreign-item",
        ),
        pytest.param(_returns_a_dict, UserCodeError, "returned a dict", id="wrong-type"),
        pytest.param(
            _reuses_one_response, AgentError, "is used by 4 turns", id="one-response-reused"
        ),
    ],
)
def test_collect_agent_result_it_cannot_train_on_fails_the_step(
    byte_tokenizer: Any, scripted, agent: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _collect(scripted(byte_tokenizer, "fine"), byte_tokenizer, agent)


class _Registry:
    def __init__(self, agents: dict[str, Any]) -> None:
        self.agents = agents

    def get(self, kind: str, name: str) -> Any:
        assert kind == "agents"
        return self.agents[name]


def test_resolve_agent_fn_from_file_and_registry(tmp_path: Path) -> None:
    path = tmp_path / "my_agent.py"
    path.write_text(
        "async def run_agent(ctx, batch):\n    return []\n\n"
        "async def other(ctx, batch):\n    yield None\n\n"
        "def blocking(ctx, batch):\n    return []\n"
    )
    assert resolve_agent_fn(str(path), _Registry({})).__name__ == "run_agent"
    assert resolve_agent_fn(f"{path}:other", _Registry({})).__name__ == "other"
    assert resolve_agent_fn("games", _Registry({"games": two_turn_agent})) is two_turn_agent
    with pytest.raises(UserCodeError, match="must be defined with 'async def"):
        resolve_agent_fn(f"{path}:blocking", _Registry({}))
    with pytest.raises(UserCodeError, match="no function 'missing'"):
        resolve_agent_fn(f"{path}:missing", _Registry({}))


# -- trust: rows come from what the endpoint served -------------------------------------------


async def _ask(client: openai.AsyncOpenAI, ctx: AgentContext, messages: Any) -> Any:
    return await client.chat.completions.create(model=ctx.model, messages=messages)


def _assert_every_row_completes_with(groups: list[Any], tokenizer: Any, reply: str) -> None:
    """Every trained row's tokens after its prompt are ``reply`` then EOS."""
    expected = [*tokenizer.encode(reply), tokenizer.eos_token_id]
    assert all(t.input_ids[t.prompt_len :] == expected for g in groups for t in g.trajectories)


def test_collect_forged_token_ids_drop_the_sample_and_count_it(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "fine")

    async def play(client: openai.AsyncOpenAI, ctx: AgentContext, item: AgentItem) -> Any:
        reply = await _ask(client, ctx, item.messages)
        response: Any = reply
        if item.key == (10, 0):
            response = reply.model_dump()
            response["choices"][0]["areno"]["token_ids"][0] = byte_tokenizer.encode("X")[0]
        return AgentTrajectoryTurn(item=item, messages=item.messages, response=response)

    agent = _each_sample(play)

    groups, metrics = _collect(engine, byte_tokenizer, agent)
    kept = sorted((g.item.index, t.sample_index) for g in groups for t in g.trajectories)
    assert kept == [(10, 1), (11, 0), (11, 1)]
    assert metrics["rollout/agent_mismatches"] == 1.0
    assert metrics["rollout/agent_errors"] == 0.0
    _assert_every_row_completes_with(groups, byte_tokenizer, "fine")


def test_collect_response_to_another_prompt_or_unknown_id_is_dropped(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "fine")

    async def agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
        async with _client(ctx) as client:
            items = {item.key: item for item in batch.iter_samples()}
            out = []
            for key, item in items.items():
                asked = items[(10, 0)].messages if key == (11, 0) else item.messages
                reply = await _ask(client, ctx, asked)
                response: Any = reply
                if key == (11, 1):
                    response = {**reply.model_dump(), "id": "chatcmpl-made-up"}
                out.append(AgentTrajectoryTurn(item, item.messages, response))
            return out

    groups, metrics = _collect(engine, byte_tokenizer, agent)
    assert [(g.item.index, [t.sample_index for t in g.trajectories]) for g in groups] == [
        (10, [0, 1])
    ]
    assert metrics["rollout/agent_mismatches"] == 2.0


def test_collect_turn_given_as_response_id_of_a_stream_trains(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "streamed")

    async def play(client: openai.AsyncOpenAI, ctx: AgentContext, item: AgentItem) -> Any:
        stream = await client.chat.completions.create(
            model=ctx.model, messages=item.messages, stream=True
        )
        chunks = [chunk async for chunk in stream]
        response = chunks[-1] if item.sample_index == 0 else chunks[-1].id
        return AgentTrajectoryTurn(item=item, messages=item.messages, response=response)

    agent = _each_sample(play)

    groups, metrics = _collect(engine, byte_tokenizer, agent)
    assert metrics["rollout/samples"] == 4.0 and metrics["rollout/agent_mismatches"] == 0.0
    _assert_every_row_completes_with(groups, byte_tokenizer, "streamed")


# -- faults: one bad sample, blocking code ----------------------------------------------------


def test_collect_one_sample_of_wrong_type_does_not_abort_the_step(
    byte_tokenizer: Any, scripted
) -> None:
    engine = scripted(byte_tokenizer, "fine")

    async def play(client: openai.AsyncOpenAI, ctx: AgentContext, item: AgentItem) -> Any:
        reply = await _ask(client, ctx, item.messages)
        if item.key == (10, 0):
            return {"messages": item.messages, "response": reply}  # not a turn
        return AgentTrajectoryTurn(item=item, messages=item.messages, response=reply)

    each = _each_sample(play)

    async def loose(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
        async with _client(ctx) as client:
            out: list[Any] = ["a stray string"]
            for item in list(batch.iter_samples())[1:]:
                reply = await _ask(client, ctx, item.messages)
                out.append(AgentTrajectoryTurn(item, item.messages, reply))
            return out

    for agent, bad in ((each, 0.0), (loose, 1.0)):
        _groups, metrics = _collect(engine, byte_tokenizer, agent)
        assert metrics["rollout/samples"] == 3.0
        assert metrics["rollout/agent_errors"] == 1.0  # sample (10, 0)
        assert metrics["rollout/agent_bad_results"] == bad


def test_collect_blocking_agent_is_abandoned_at_its_deadline(byte_tokenizer: Any, scripted) -> None:
    engine = scripted(byte_tokenizer, "fine")
    release = threading.Event()

    async def play(client: openai.AsyncOpenAI, ctx: AgentContext, item: AgentItem) -> Any:
        if item.key == (11, 1):
            while len(ctx.finished) < 3:  # let the other samples finish first
                await asyncio.sleep(0.01)
            release.wait(60)  # blocking: no await point, so wait_for cannot interrupt it
        reply = await _ask(client, ctx, item.messages)
        return AgentTrajectoryTurn(item=item, messages=item.messages, response=reply)

    agent = _each_sample(play)

    started = time.monotonic()
    try:
        _groups, metrics = _collect(engine, byte_tokenizer, agent, timeout_s=4.0)
    finally:
        release.set()
    assert time.monotonic() - started < 14.0  # 4 s deadline + 2 s grace + setup
    assert metrics["rollout/samples"] == 3.0
    assert metrics["rollout/agent_abandoned"] == 1.0
    assert metrics["rollout/agent_timeouts"] == 1.0
    assert metrics["rollout/agent_blocked_s"] > 1.0


def test_collect_stops_when_abandoned_agents_pile_up(
    byte_tokenizer: Any, scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    from areno_core.agentic import runner

    stuck = threading.Event()
    threads = [threading.Thread(target=stuck.wait, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    monkeypatch.setattr(runner, "_abandoned", list(threads))
    try:
        with pytest.raises(AgentError, match="3 earlier agent runs ignored their deadline"):
            _collect(scripted(byte_tokenizer, "fine"), byte_tokenizer, two_turn_agent)
    finally:
        stuck.set()

"""Agents that use their sample's own URL and return a reward, nothing, or turns: rows are built
from what the endpoint served to each sample."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import openai
import pytest

from areno_core.agentic.collect import AgentError
from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentItem,
    AgentTrajectoryTurn,
)
from areno_core.rewards import RewardScorer
from areno_core.types import RewardRecord

from .conftest import CALL, LOGPROB, TOOLS, collect, prompt_items, tool_reply


def _collect(engine: Any, tokenizer: Any, agent: Any, **kw: Any) -> tuple[list, dict]:
    return collect(engine, tokenizer, agent, prompt_items(tools=False), **kw)


async def _episode(ctx: AgentContext, item: AgentItem) -> str:
    """A plain two-turn tool episode through the sample's own URL; returns the last reply. It
    knows nothing of areno's turn types."""
    async with openai.AsyncOpenAI(
        base_url=ctx.get_base_url(item), api_key=ctx.api_key, max_retries=0
    ) as client:
        messages: list[Any] = list(item.messages)
        first = await client.chat.completions.create(
            model=ctx.model, messages=messages, tools=TOOLS
        )
        message = first.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        call = message.tool_calls[0]
        total = sum(json.loads(call.function.arguments).values())
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"sum={total}"})
        second = await client.chat.completions.create(
            model=ctx.model, messages=messages, tools=TOOLS
        )
        return second.choices[0].message.content or ""


def _served_rows(tokenizer: Any) -> tuple[list[int], list[int]]:
    first = [*tokenizer.encode("Let me add.\n" + CALL), tokenizer.eos_token_id]
    final = [*tokenizer.encode("The answer is 4."), tokenizer.eos_token_id]
    return first, final


def test_agent_returning_only_rewards_trains_the_served_tokens(byte_tokenizer, scripted) -> None:
    engine = scripted(byte_tokenizer, tool_reply)

    async def agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
        async def play(item: AgentItem) -> float:
            answer = await _episode(ctx, item)
            return 1.0 if "4" in answer else 0.0

        return await ctx.run_each(batch, play)

    groups, metrics = _collect(engine, byte_tokenizer, agent)
    first, final = _served_rows(byte_tokenizer)
    prompts = [call[0] for call in engine.calls]
    assert len(groups) == 2 and metrics["rollout/samples"] == 4.0
    for group in groups:
        assert [t.sample_index for t in group.trajectories] == [0, 1]
        for row in group.trajectories:
            assert row.reward == 1.0 and row.metadata["reward_source"] == "agent"
            assert row.metadata["turns"] == 2 and row.metadata["conversations"] == 1
            p = row.prompt_len
            # The row is exactly the second request's prompt and its sampled tokens.
            second_prompt = row.input_ids[: len(row.input_ids) - len(final)]
            assert any(second_prompt == q for batch in prompts for q in batch)
            assert row.input_ids[p : p + len(first)] == first
            assert row.input_ids[-len(final) :] == final
            assert row.loss_mask[p : p + len(first)] == [1] * len(first)
            assert sum(row.loss_mask) == len(first) + len(final)
            assert row.rollout_logprobs[-1] == LOGPROB
    assert metrics["rollout/agent_requests"] == 8.0
    assert metrics["rollout/agent_branches"] == 0.0
    assert metrics["rollout/agent_mismatches"] == 0.0


def test_agent_returning_nothing_is_scored_on_the_final_conversation(
    byte_tokenizer, scripted
) -> None:
    engine = scripted(byte_tokenizer, tool_reply)
    seen: list[RewardRecord] = []

    def reward(record: RewardRecord) -> float:
        seen.append(record)
        return 1.0 if record.completion == "The answer is 4." else 0.0

    async def agent(ctx: AgentContext, batch: AgentBatch) -> None:
        await asyncio.gather(*(_episode(ctx, item) for item in batch.iter_samples()))

    groups, metrics = _collect(engine, byte_tokenizer, agent, scorer=RewardScorer(reward))
    assert len(seen) == 4
    assert [m["role"] for m in seen[0].messages] == ["user", "assistant", "tool", "assistant"]
    assert seen[0].tool_calls[0]["function"]["name"] == "add"
    assert seen[0].tool_results[0]["content"] == "sum=4"
    assert all(t.reward == 1.0 for g in groups for t in g.trajectories)
    assert metrics["rollout/tool_calls_mean"] == 1.0


def test_rewards_gathered_in_batch_order_are_matched_to_samples(byte_tokenizer, scripted) -> None:
    engine = scripted(byte_tokenizer, tool_reply)

    async def agent(ctx: AgentContext, batch: AgentBatch) -> list[float]:
        async def play(item: AgentItem) -> float:
            await _episode(ctx, item)
            return float(item.prompt_index + item.sample_index)

        return await asyncio.gather(*(play(item) for item in batch.iter_samples()))

    groups, _ = _collect(engine, byte_tokenizer, agent)
    rewards = {(t.prompt_index, t.sample_index): t.reward for g in groups for t in g.trajectories}
    assert rewards == {(10, 0): 10.0, (10, 1): 11.0, (11, 0): 11.0, (11, 1): 12.0}


def test_parallel_calls_make_one_row_per_conversation_with_a_shared_reward(
    byte_tokenizer, scripted
) -> None:
    engine = scripted(byte_tokenizer, tool_reply)

    async def agent(ctx: AgentContext, batch: AgentBatch) -> None:
        async def play(item: AgentItem) -> None:
            async with openai.AsyncOpenAI(
                base_url=item.base_url, api_key=ctx.api_key, max_retries=0
            ) as client:
                messages: list[Any] = list(item.messages)
                first = await client.chat.completions.create(
                    model=ctx.model, messages=messages, tools=TOOLS
                )
                messages.append(first.choices[0].message.model_dump(exclude_none=True))
                call_id = first.choices[0].message.tool_calls[0].id

                async def ask(result: str) -> None:
                    history = [*messages, {"role": "tool", "tool_call_id": call_id,
                                           "content": result}]  # fmt: skip
                    await client.chat.completions.create(
                        model=ctx.model, messages=history, tools=TOOLS
                    )

                await ask("sum=4")
                await ask("sum=5")  # a second branch from the same state

        await ctx.run_each(batch, play)

    scores: list[str] = []

    def reward(record: RewardRecord) -> float:
        scores.append(record.tool_results[0]["content"])
        return 0.5

    groups, metrics = _collect(engine, byte_tokenizer, agent, scorer=RewardScorer(reward))
    first, _ = _served_rows(byte_tokenizer)
    rows = [t for g in groups for t in g.trajectories]
    assert len(rows) == 8 and metrics["rollout/agent_branches"] == 4.0
    assert scores == ["sum=5"] * 4  # the last conversation is scored, the reward shared
    assert all(t.reward == 0.5 for t in rows)
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        assert (a.sample_index, a.metadata["conversation"]) == (b.sample_index, 0)
        assert b.metadata["conversation"] == 1
        p = a.prompt_len
        assert a.input_ids[: p + len(first)] == b.input_ids[: p + len(first)]
        # The first reply is trained in the first conversation only.
        assert a.loss_mask[p : p + len(first)] == [1] * len(first)
        assert b.loss_mask[p : p + len(first)] == [0] * len(first)


def test_turn_served_through_another_samples_url_is_dropped(byte_tokenizer, scripted) -> None:
    engine = scripted(byte_tokenizer, "fine")

    async def agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
        items = list(batch.iter_samples())
        turns = []
        async with openai.AsyncOpenAI(
            base_url=items[0].base_url, api_key=ctx.api_key, max_retries=0
        ) as client:
            for item in items:  # every sample asks through sample 0's URL
                response = await client.chat.completions.create(
                    model=ctx.model, messages=list(item.messages)
                )
                turns.append(
                    AgentTrajectoryTurn(item=item, messages=item.messages, response=response)
                )
        return turns

    groups, metrics = _collect(engine, byte_tokenizer, agent)
    assert [(t.prompt_index, t.sample_index) for g in groups for t in g.trajectories] == [(10, 0)]
    assert metrics["rollout/agent_mismatches"] == 3.0


def test_unknown_sample_url_is_404_and_requests_of_a_failed_agent_are_not_trained(
    byte_tokenizer, scripted
) -> None:
    engine = scripted(byte_tokenizer, "fine")
    statuses: list[int] = []

    async def agent(ctx: AgentContext, batch: AgentBatch) -> None:
        item = next(batch.iter_samples())
        async with openai.AsyncOpenAI(
            base_url=item.base_url, api_key=ctx.api_key, max_retries=0
        ) as client:
            await client.chat.completions.create(model=ctx.model, messages=list(item.messages))
        wrong = item.base_url.replace("/sample/", "/sample/x")
        async with openai.AsyncOpenAI(base_url=wrong, api_key=ctx.api_key, max_retries=0) as c:
            try:
                await c.chat.completions.create(model=ctx.model, messages=list(item.messages))
            except openai.NotFoundError as exc:
                statuses.append(exc.status_code)
        raise RuntimeError("the agent crashed after its requests")

    with pytest.raises(AgentError, match="crashed after its requests"):
        _collect(engine, byte_tokenizer, agent)
    assert statuses == [404]


def test_samples_that_block_are_dropped_by_default_and_the_others_finish(
    byte_tokenizer, scripted
) -> None:
    """Default settings: one sample sleeps, another waits on a socket that never answers, both
    past the agent's deadline; the other samples train and the step does not raise."""
    engine = scripted(byte_tokenizer, tool_reply)
    quiet, peer = socket.socketpair()

    async def agent(ctx: AgentContext, batch: AgentBatch) -> list[Any]:
        async def play(item: AgentItem) -> float:
            if item.key == (10, 0):
                time.sleep(8)  # blocks its thread, before any other sample is done
            if item.key == (11, 0):
                quiet.recv(1)  # a blocking read that gets no data
            await _episode(ctx, item)
            return 1.0

        return await ctx.run_each(batch, play)

    started = time.monotonic()
    try:
        groups, metrics = _collect(engine, byte_tokenizer, agent, timeout_s=3.0)
    finally:
        peer.close()  # the read gets end-of-file and its thread ends
        quiet.close()
    assert time.monotonic() - started < 15.0  # 3 s deadline + 2 s grace + setup
    kept = sorted((t.prompt_index, t.sample_index) for g in groups for t in g.trajectories)
    assert kept == [(10, 1), (11, 1)]
    assert metrics["rollout/agent_blocked_samples"] == 2.0
    assert metrics["rollout/agent_timeouts"] == 2.0 and metrics["rollout/agent_errors"] == 2.0
    assert metrics["rollout/agent_abandoned"] == 0.0  # the agent's own thread ended in time
    assert metrics["rollout/agent_blocked_s"] == 0.0  # its event loop never blocked

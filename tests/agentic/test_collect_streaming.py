"""``collect_agentic_groups(on_group=...)``: a prompt's group is built, checked, scored and handed
on as soon as ``ctx.run_each`` has finished its samples, while the agent still runs others."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import openai

from areno_core.agentic.types import AgentBatch, AgentContext, AgentItem, AgentTrajectoryTurn
from areno_core.rewards import RewardScorer
from areno_core.types import PromptItem

from .conftest import collect, prompt_items, tool_reply


async def _ask(ctx: AgentContext, item: AgentItem) -> None:
    async with openai.AsyncOpenAI(
        base_url=ctx.get_base_url(item), api_key=ctx.api_key, max_retries=0
    ) as client:
        await client.chat.completions.create(model=ctx.model, messages=list(item.messages))


def test_a_finished_group_is_handed_on_while_the_others_still_run(byte_tokenizer, scripted):
    engine = scripted(byte_tokenizer, tool_reply)
    handed: list[Any] = []
    first_handed = threading.Event()
    seen_before_last: list[bool] = []

    def on_group(group: Any) -> None:
        handed.append((group, time.monotonic()))
        first_handed.set()

    async def agent(ctx: AgentContext, batch: AgentBatch) -> Any:
        async def play(item: AgentItem) -> None:
            if item.prompt_index == 11:  # the straggler prompt waits for the other's group
                seen = await asyncio.to_thread(first_handed.wait, 15.0)
                seen_before_last.append(seen)
            await _ask(ctx, item)

        return await ctx.run_each(batch, play)

    def reward(record: Any) -> float:
        return float(len(record.completion))

    groups, metrics = collect(
        engine,
        byte_tokenizer,
        agent,
        prompt_items(tools=False),
        scorer=RewardScorer(reward),
        on_group=on_group,
    )
    # Prompt 10's group left before prompt 11's samples even asked the endpoint.
    assert seen_before_last == [True, True]
    assert [g.item.index for g, _ in handed] == [10]
    assert [g.item.index for g in groups] == [11]  # not handed on: returned
    streamed = handed[0][0]
    assert [t.sample_index for t in streamed.trajectories] == [0, 1]
    for trajectory in streamed.trajectories + groups[0].trajectories:
        assert trajectory.metadata["reward_source"] == "reward_fn"
        assert trajectory.reward > 0 and sum(trajectory.loss_mask) > 0
    # The metrics cover both groups.
    assert metrics["rollout/samples"] == 4.0
    assert metrics["rollout/skipped_prompts"] == 0.0
    assert metrics["rollout/agent_requests"] == 4.0


def test_results_the_agent_returns_at_the_end_are_not_streamed(byte_tokenizer, scripted):
    engine = scripted(byte_tokenizer, tool_reply)
    handed: list[Any] = []

    async def agent(ctx: AgentContext, batch: AgentBatch) -> Any:
        for item in batch.iter_samples():
            await _ask(ctx, item)
        return [None] * len(batch.items)  # rows come from what each URL served

    groups, metrics = collect(
        engine, byte_tokenizer, agent, prompt_items(tools=False), on_group=handed.append
    )
    assert handed == []
    assert [g.item.index for g in groups] == [10, 11]
    assert metrics["rollout/samples"] == 4.0


def test_a_streamed_group_whose_samples_all_failed_is_counted_and_not_handed_on(
    byte_tokenizer, scripted
):
    engine = scripted(byte_tokenizer, tool_reply)
    handed: list[Any] = []

    async def agent(ctx: AgentContext, batch: AgentBatch) -> Any:
        async def play(item: AgentItem) -> None:
            if item.prompt_index == 10:
                raise RuntimeError("the environment broke")
            await _ask(ctx, item)

        return await ctx.run_each(batch, play)

    groups, metrics = collect(
        engine, byte_tokenizer, agent, prompt_items(tools=False), on_group=handed.append
    )
    assert [g.item.index for g in handed] == [11] or [g.item.index for g in groups] == [11]
    assert len(handed) + len(groups) == 1
    assert metrics["rollout/agent_errors"] == 2.0
    assert metrics["rollout/skipped_prompts"] == 1.0
    assert metrics["rollout/samples"] == 2.0


def test_a_served_choice_claimed_again_after_its_group_left_rejects_the_later_sample(
    byte_tokenizer, scripted
):
    # Two prompts with the same messages, so only the rule under test can reject a sample:
    # each served choice belongs to one turn of one sample.
    same = ({"role": "user", "content": "What is 2 + 2?"},)
    items = [PromptItem(index=i, row={"id": i}, messages=same, answer="4") for i in (10, 11)]
    engine = scripted(byte_tokenizer, tool_reply)
    replies: dict[tuple[int, int], Any] = {}
    first_handed = threading.Event()

    async def agent(ctx: AgentContext, batch: AgentBatch) -> Any:
        async def play(item: AgentItem) -> AgentTrajectoryTurn:
            if item.prompt_index == 11:
                assert await asyncio.to_thread(first_handed.wait, 15.0)
            if item.key == (11, 0):  # reuses a choice prompt 10's group was trained with
                return AgentTrajectoryTurn(item, item.messages, replies[(10, 0)])
            async with openai.AsyncOpenAI(
                base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0
            ) as client:
                reply = await client.chat.completions.create(
                    model=ctx.model, messages=list(item.messages)
                )
            replies[item.key] = reply
            return AgentTrajectoryTurn(item, item.messages, reply)

        return await ctx.run_each(batch, play)

    handed: list[Any] = []

    def on_group(group: Any) -> None:
        handed.append(group)
        first_handed.set()

    groups, metrics = collect(engine, byte_tokenizer, agent, items, on_group=on_group)
    # Prompt 10's group left whole; of prompt 11, the sample that claimed its choice again is
    # dropped (checked together, both would have been).
    assert [(g.item.index, [t.sample_index for t in g.trajectories]) for g in handed] == [
        (10, [0, 1])
    ]
    assert [(g.item.index, [t.sample_index for t in g.trajectories]) for g in groups] == [(11, [1])]
    assert metrics["rollout/agent_mismatches"] == 1.0
    assert metrics["rollout/samples"] == 3.0

"""The objects an agent function sees and returns.

    async def run_agent(ctx: AgentContext, batch: AgentBatch):
        client = openai.AsyncOpenAI(base_url=ctx.get_base_url(), api_key=ctx.api_key)
        turns = []
        for item in batch.iter_samples():
            response = await client.chat.completions.create(
                model=ctx.model, messages=item.messages, tools=item.row.get("tools")
            )
            turns.append(AgentTrajectoryTurn(item=item, messages=item.messages, response=response))
        return turns
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs


@attrs.frozen
class AgentItem:
    """One (prompt, sample) task: the loader's row, its prompt, and where it belongs."""

    row: Mapping[str, Any]
    messages: tuple[Mapping[str, Any], ...]
    prompt_index: int
    sample_index: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.prompt_index, self.sample_index)


@attrs.frozen
class AgentContext:
    """How an agent reaches the policy: a local OpenAI-compatible endpoint."""

    base_url: str
    api_key: str
    model: str = "policy"
    max_concurrency: int = 64
    timeout_s: float = 300.0

    def get_base_url(self) -> str:
        return self.base_url


@attrs.frozen
class AgentBatch:
    """The rows of one step, each to be sampled ``n_samples`` times."""

    items: tuple[AgentItem, ...]
    n_samples: int

    def iter_samples(self) -> Iterator[AgentItem]:
        """Every (row, sample) task of the step: batch-size x n-samples items."""
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@attrs.frozen
class AgentTrajectoryTurn:
    """One chat-completion call: the messages sent and the response received.

    ``response`` is the OpenAI response object (or its dict form) returned by the endpoint;
    the endpoint's extension field carries the prompt and completion token ids and logprobs,
    so the token row is rebuilt exactly. ``reward`` may be set by the agent itself; otherwise
    the run's reward function scores the trajectory.
    """

    item: AgentItem
    messages: Sequence[Mapping[str, Any]]
    response: Any
    reward: float | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class AgentTrajectory:
    """All turns of one sample, in order."""

    item: AgentItem
    turns: Sequence[AgentTrajectoryTurn]
    reward: float | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)

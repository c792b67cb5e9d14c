"""Agentic rollout of one step: run the agent against a local endpoint, rebuild its samples as
token rows, score them, and group them per prompt.

    groups, metrics = collect_agentic_groups(
        items, agent_fn=run_agent, engine=engine, tokenizer=tokenizer, sampling=sampling,
        n_samples=8, scorer=RewardScorer(reward_fn), timeout_s=300.0)

The agent gets ``batch-size x n-samples`` :class:`AgentItem` tasks and ``timeout_s`` seconds in
all. Samples that time out, crash or come back empty are dropped and counted
(``rollout/agent_errors``), and so are rows longer than ``max_context_len``
(``rollout/context_overflow``). If the agent fails so that no sample survives, the step stops
with an :class:`AgentError` carrying the first traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch

from areno_core.agentic.server import AgentServer, ServedCompletion
from areno_core.agentic.trajectory import (
    build_trajectory,
    fill_logprobs,
    model_scorer,
    trajectory_record,
)
from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentFailure,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)
from areno_core.errors import ArenoError, UserCodeError
from areno_core.log import get_logger, warn_once
from areno_core.rewards import RewardScorer
from areno_core.rollout.collect import rollout_metrics
from areno_core.rollout.sampling import is_greedy
from areno_core.types import PromptItem, RewardRecord, SamplingParams, Trajectory, TrajectoryGroup

logger = get_logger(__name__)

AgentFn = Callable[[AgentContext, AgentBatch], Any]
_LEAVES = (AgentTrajectoryTurn, AgentTrajectory, AgentFailure)


class AgentError(ArenoError):
    """The agent produced no usable sample in a step."""


def resolve_agent_fn(spec: str, registry: Any) -> AgentFn:
    """``file.py`` / ``file.py:function`` (default ``run_agent``) or a registered agent name.

    The function must be an ``async def`` (or an async generator function).
    """
    from areno_core.pyfile import resolve_function

    fn = resolve_function(
        spec,
        lookup=lambda name: registry.get("agents", name),
        default_name="run_agent",
        what="agent function",
    )
    if not _is_async(fn):
        raise UserCodeError(
            f"agent function {spec!r} must be defined with 'async def run_agent(ctx, batch)' "
            f"(got a plain {type(fn).__name__}); the agent awaits the endpoint with an async "
            "OpenAI client"
        )
    return fn  # type: ignore[no-any-return]


def _is_async(fn: Any) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f) for f in (fn, call))


# -- running the agent -----------------------------------------------------------------------


@attrs.define
class _Outcome:
    leaves: list[Any]
    error: str | None = None
    timed_out: bool = False


def _leaves(value: Any, out: list[Any]) -> None:
    if value is None:
        return
    if isinstance(value, _LEAVES):
        out.append(value)
        return
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise UserCodeError(
            f"the agent returned a {type(value).__name__}; expected AgentTrajectoryTurn, "
            "AgentTrajectory, AgentFailure, None, or an iterable of them"
        )
    for entry in value:
        _leaves(entry, out)


async def _drive(
    agent_fn: AgentFn, ctx: AgentContext, batch: AgentBatch, timeout_s: float
) -> _Outcome:
    streamed: list[Any] = []

    async def consume() -> None:
        value = agent_fn(ctx, batch)
        if inspect.isawaitable(value):
            value = await value
        if hasattr(value, "__aiter__"):
            async for entry in value:
                streamed.append(entry)
        else:
            streamed.append(value)

    try:
        await asyncio.wait_for(consume(), timeout_s)
    except UserCodeError:
        raise
    except TimeoutError:
        outcome = _Outcome([], f"the agent function timed out after {timeout_s:g} s", True)
    except Exception as exc:
        outcome = _Outcome([], "".join(traceback.format_exception(exc)))
    else:
        leaves: list[Any] = []
        _leaves(streamed, leaves)
        return _Outcome(leaves)
    # The agent as a whole failed: keep what it yielded and what run_each finished.
    seen: set[int] = set()
    for source in (streamed, list(ctx.finished)):
        found: list[Any] = []
        _leaves(source, found)
        for leaf in found:
            if id(leaf) not in seen:
                seen.add(id(leaf))
                outcome.leaves.append(leaf)
    return outcome


def _run(coroutine_factory: Callable[[], Any]) -> Any:
    """Run a coroutine to completion from sync code, also when an event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine_factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coroutine_factory())).result()


# -- samples ---------------------------------------------------------------------------------


@attrs.define
class _Sample:
    item: AgentItem
    turns: list[AgentTrajectoryTurn] = attrs.Factory(list)
    reward: float | None = None
    metadata: dict[str, Any] = attrs.Factory(dict)
    messages: list[Mapping[str, Any]] | None = None
    failure: AgentFailure | None = None

    def agent_reward(self) -> float | None:
        if self.reward is not None:
            return self.reward
        for turn in reversed(self.turns):
            if turn.reward is not None:
                return turn.reward
        return None


def _group_leaves(leaves: list[Any], items: Sequence[AgentItem]) -> dict[tuple[int, int], _Sample]:
    samples = {item.key: _Sample(item) for item in items}

    def sample_for(item: AgentItem) -> _Sample:
        if item.key not in samples:
            raise UserCodeError(
                f"the agent returned a result for sample {item.key}, which is not in this step's "
                "batch; use the AgentItem objects from batch.iter_samples()"
            )
        return samples[item.key]

    for leaf in leaves:
        sample = sample_for(leaf.item)
        if isinstance(leaf, AgentFailure):
            sample.failure = sample.failure or leaf
        elif isinstance(leaf, AgentTrajectory):
            sample.turns.extend(leaf.turns)
            if leaf.reward is not None:
                sample.reward = leaf.reward
            sample.metadata.update(leaf.metadata)
            if leaf.messages:
                sample.messages = list(leaf.messages)
        else:
            sample.turns.append(leaf)
    return samples


def _agent_items(items: Sequence[PromptItem], n_samples: int) -> list[AgentItem]:
    out = []
    for item in items:
        if item.messages is not None:
            messages = tuple(item.messages)
        else:
            messages = ({"role": "user", "content": item.prompt},)
        for s in range(n_samples):
            out.append(
                AgentItem(row=item.row, messages=messages, prompt_index=item.index, sample_index=s)
            )
    return out


def collect_agentic_groups(
    items: Sequence[PromptItem],
    *,
    agent_fn: AgentFn,
    engine: Any,
    tokenizer: Any,
    sampling: SamplingParams,
    n_samples: int,
    scorer: RewardScorer,
    disable_thinking: bool = False,
    train_tool_results: bool = False,
    max_context_len: int | None = None,
    timeout_s: float = 300.0,
    generator: torch.Generator | None = None,
    max_concurrency: int | None = None,
    model: Any = None,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Run ``agent_fn`` on ``items`` x ``n_samples`` and return trajectory groups and metrics.

    ``model`` scores tool-result tokens for ``train_tool_results`` (default: ``engine.model``).
    """
    t0 = time.perf_counter()
    agent_items = _agent_items(items, n_samples)
    batch = AgentBatch(items=tuple(agent_items), n_samples=n_samples)
    with AgentServer(
        engine,
        tokenizer,
        sampling_defaults=sampling,
        disable_thinking=disable_thinking,
        timeout_s=timeout_s,
        generator=generator,
    ) as server:
        ctx = AgentContext(
            base_url=server.base_url,
            api_key=server.api_key,
            model=server.model_name,
            max_concurrency=max_concurrency or max(1, len(agent_items)),
            timeout_s=timeout_s,
        )
        outcome = _run(lambda: _drive(agent_fn, ctx, batch, timeout_s))
    records = dict(server.records)
    t1 = time.perf_counter()

    samples = _group_leaves(outcome.leaves, agent_items)
    built, counts, first_error = _build(
        samples, tokenizer, train_tool_results, records, max_context_len
    )
    if outcome.error is not None:
        first_error = outcome.error
        missing = sum(1 for s in samples.values() if s.failure is None and not s.turns)
        counts["timeouts"] += missing if outcome.timed_out else 0
        logger.warning(
            "the agent function failed (%d of %d samples kept):\n%s",
            len(built),
            len(agent_items),
            outcome.error,
        )
    if not built and counts["errors"]:
        raise AgentError(
            f"no agentic sample survived this step ({counts['errors']:.0f} of "
            f"{len(agent_items)} failed). First error:\n{first_error}"
        )
    if train_tool_results:
        _score_tool_tokens(
            built, model if model is not None else getattr(engine, "model", None), sampling
        )

    reward_errors = _reward(built, scorer, tokenizer, items, records)
    t2 = time.perf_counter()

    groups = _groups(items, built)
    metrics = rollout_metrics(groups, skipped=len(items) - len(groups), reward_errors=reward_errors)
    kept = [t for g in groups for t in g.trajectories]
    metrics.update(
        {
            "rollout/agent_errors": counts["errors"],
            "rollout/agent_timeouts": counts["timeouts"],
            "rollout/context_overflow": counts["overflow"],
            "rollout/agent_history_rewrites": float(
                sum(t.metadata["history_rewrites"] for t in kept)
            ),
            "rollout/agent_requests": server.stats["requests"],
            "rollout/agent_generate_calls": server.stats["generate_calls"],
            "time/agent": t1 - t0,
            "time/reward": t2 - t1,
        }
    )
    if kept:
        turns = torch.tensor([float(t.metadata["turns"]) for t in kept])
        calls = torch.tensor([float(t.metadata["tool_calls"]) for t in kept])
        metrics["rollout/turns_mean"] = float(turns.mean())
        metrics["rollout/turns_max"] = float(turns.max())
        metrics["rollout/tool_calls_mean"] = float(calls.mean())
    return groups, metrics


@attrs.define
class _Built:
    sample: _Sample
    trajectory: Trajectory


def _build(
    samples: Mapping[tuple[int, int], _Sample],
    tokenizer: Any,
    train_tool_results: bool,
    records: Mapping[str, ServedCompletion],
    max_context_len: int | None,
) -> tuple[list[_Built], dict[str, float], str | None]:
    built: list[_Built] = []
    counts = {"errors": 0.0, "timeouts": 0.0, "overflow": 0.0}
    first_error: str | None = None
    for key, sample in samples.items():
        problem: str | None = None
        if sample.failure is not None:
            problem = sample.failure.error
            counts["timeouts"] += sample.failure.kind == "timeout"
        elif not sample.turns:
            problem = f"the agent returned nothing for sample {key}"
        else:
            try:
                trajectory = build_trajectory(
                    sample.turns, tokenizer, train_tool_results=train_tool_results, records=records
                )
            except Exception as exc:
                problem = "".join(traceback.format_exception(exc))
        if problem is not None:
            counts["errors"] += 1
            first_error = first_error or problem
            continue
        if max_context_len is not None and len(trajectory.input_ids) > max_context_len:
            counts["overflow"] += 1
            continue
        trajectory.prompt_index, trajectory.sample_index = (
            sample.item.prompt_index,
            sample.item.sample_index,
        )
        built.append(_Built(sample, trajectory))
    if counts["errors"] and built:
        warn_once(
            logger,
            "agentic.sample_errors",
            "agentic samples failed and were dropped (counted in rollout/agent_errors; first "
            "error shown once):\n%s",
            first_error,
        )
    return built, counts, first_error


def _score_tool_tokens(built: list[_Built], model: Any, sampling: SamplingParams) -> None:
    trajectories = [b.trajectory for b in built]
    if not any(t.metadata["tool_positions"] for t in trajectories):
        return
    if model is None:
        warn_once(
            logger,
            "agentic.no_scoring_model",
            "--train-tool-results: the rollout engine exposes no model to score tool-result "
            "tokens with; they stay masked",
        )
        for t in trajectories:
            for position in t.metadata["tool_positions"]:
                t.loss_mask[position] = 0
            t.metadata["tool_positions"] = []
        return
    temperature = 1.0 if is_greedy(sampling) else sampling.temperature
    filled = fill_logprobs(trajectories, model_scorer(model, temperature=temperature))
    logger.debug("scored %d tool-result tokens with the policy", filled)


def _reward(
    built: list[_Built],
    scorer: RewardScorer,
    tokenizer: Any,
    items: Sequence[PromptItem],
    records: Mapping[str, ServedCompletion],
) -> int:
    by_index = {item.index: item for item in items}
    to_score: list[tuple[_Built, RewardRecord]] = []
    for entry in built:
        sample, trajectory = entry.sample, entry.trajectory
        prompt_item = by_index[sample.item.prompt_index]
        record = trajectory_record(
            trajectory,
            sample.turns,
            tokenizer,
            item=sample.item,
            messages=sample.messages,
            answer=prompt_item.answer,
            solutions=prompt_item.solutions,
            metadata=sample.metadata,
            records=records,
        )
        trajectory.metadata["tool_calls"] = len(record.tool_calls)
        reward = sample.agent_reward()
        if reward is not None:
            trajectory.reward = float(reward)
            trajectory.metadata["reward_source"] = "agent"
        else:
            to_score.append((entry, record))
    if not to_score:
        return 0
    rewards, errors = scorer.score([record for _, record in to_score])
    for (entry, _), reward in zip(to_score, rewards, strict=True):
        entry.trajectory.reward = reward
        entry.trajectory.metadata["reward_source"] = "reward_fn"
    return errors


def _groups(items: Sequence[PromptItem], built: list[_Built]) -> list[TrajectoryGroup]:
    by_prompt: dict[int, list[Trajectory]] = {}
    for entry in built:
        by_prompt.setdefault(entry.trajectory.prompt_index, []).append(entry.trajectory)
    groups = []
    for item in items:
        trajectories = sorted(by_prompt.get(item.index, []), key=lambda t: t.sample_index)
        if trajectories:
            groups.append(TrajectoryGroup(item=item, trajectories=trajectories))
    return groups


__all__ = ["AgentError", "AgentFn", "collect_agentic_groups", "resolve_agent_fn"]

"""Agentic rollout of one step: run the agent against a local endpoint, rebuild its samples as
token rows, score them, and group them per prompt.

    groups, metrics = collect_agentic_groups(
        items, agent_fn=run_agent, engine=engine, tokenizer=tokenizer, sampling=sampling,
        n_samples=8, scorer=RewardScorer(reward_fn), timeout_s=300.0)

The agent gets ``batch-size x n-samples`` :class:`AgentItem` tasks and ``timeout_s`` seconds in
all, a deadline that holds even against blocking code (:mod:`areno_core.agentic.runner`).
Samples that time out, crash, come back empty or as something that is not a turn are dropped
and counted (``rollout/agent_errors``), and so are rows longer than ``max_context_len``
(``rollout/context_overflow``).

Rows are built from the endpoint's records of what it served, not from the agent's copy: a
sample whose turns name a response the endpoint did not serve, carry token data that differs
from the record, share a response with another sample, or answer another prompt of the batch
is dropped and counted (``rollout/agent_mismatches``). If no sample survives, the step stops
with an :class:`AgentError` carrying the first problem.

Why one long module: the checks that turn an agent's answer into trainable rows (records,
rewritten history, reused or forged choices, branching conversations) must be read together;
splitting them would hide which rule applies when.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch

from areno_core.agentic.conversations import conversation_paths, untrained_spans
from areno_core.agentic.isolation import ISOLATED_GRACE_S, blocked_samples_left, still_blocked
from areno_core.agentic.records import ServedCompletion
from areno_core.agentic.runner import AgentOutcome, abandoned_agents, run_agent_fn
from areno_core.agentic.server import AgentServer
from areno_core.agentic.trajectory import (
    TurnMismatchError,
    TurnTokens,
    build_trajectory,
    fill_logprobs,
    model_scorer,
    trajectory_record,
    turn_tokens,
)
from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentFailure,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
    is_reward,
    result_problem,
)
from areno_core.errors import UserCodeError
from areno_core.log import get_logger, warn_once
from areno_core.pyfile import resolve_function
from areno_core.rewards import RewardScorer
from areno_core.rollout.collect import rollout_metrics
from areno_core.rollout.sampling import is_greedy
from areno_core.types import PromptItem, RewardRecord, SamplingParams, Trajectory, TrajectoryGroup

logger = get_logger(__name__)

AgentFn = Callable[[AgentContext, AgentBatch], Any]
_LEAVES = (AgentTrajectoryTurn, AgentTrajectory, AgentFailure)


# Steps stop once this many agent runs ignored their deadline and still run in the background,
# or this many samples run on isolated threads did.
MAX_ABANDONED_AGENTS = 3
MAX_BLOCKED_SAMPLES = 64


class AgentError(UserCodeError):
    """The agent produced no usable sample in a step, or keeps ignoring its deadline."""


def resolve_agent_fn(spec: str, registry: Any) -> AgentFn:
    """``file.py`` / ``file.py:function`` (default ``run_agent``) or a registered agent name.

    The function must be an ``async def`` (or an async generator function).
    """

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


# -- the agent's results ---------------------------------------------------------------------


def _leaves(value: Any, out: list[Any], problems: list[str]) -> None:
    """Flatten what the agent produced into turns, trajectories and failures; anything else
    is noted in ``problems`` and skipped (its sample then counts as empty)."""
    if value is None:
        return
    if isinstance(value, _LEAVES):
        out.append(value)
        return
    if is_reward(value):
        problems.append(
            f"the agent returned the number {value!r} without saying whose reward it is; "
            "return it from ctx.run_each's function, as AgentTrajectory(item=item, "
            "reward=...), or as a list with one entry per sample in batch order"
        )
        return
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        problems.append(
            f"the agent returned a {type(value).__name__}; expected AgentTrajectoryTurn, "
            "AgentTrajectory, AgentFailure, None, or an iterable of them"
        )
        return
    for entry in value:
        _leaves(entry, out, problems)


def _rewards_in_order(value: Any, items: Sequence[AgentItem]) -> list[Any] | None:
    """``value`` as one result per sample when it is a list in batch order holding rewards
    (numbers): ``await asyncio.gather(*(play(item) for item in batch.iter_samples()))``."""
    if not isinstance(value, list | tuple) or len(value) != len(items):
        return None
    if not any(is_reward(v) for v in value):
        return None
    out: list[Any] = []
    for item, entry in zip(items, value, strict=True):
        if entry is None or is_reward(entry):
            problem = result_problem(entry)
            if problem is not None:
                entry = AgentFailure(item=item, kind="error", error=f"the sample {problem}")
            else:
                entry = AgentTrajectory(item=item, reward=None if entry is None else float(entry))
        out.append(entry)
    return out


def _collect_leaves(outcome: Any, items: Sequence[AgentItem]) -> tuple[list[Any], list[str]]:
    """The leaves of a finished agent run: what it returned, or, when it failed or timed out,
    what it had yielded plus what ``run_each`` had finished."""
    leaves: list[Any] = []
    problems: list[str] = []
    if outcome.completed:
        values = outcome.values
        if len(values) == 1:
            values = _rewards_in_order(values[0], items) or values
        _leaves(values, leaves, problems)
        return leaves, problems
    seen: set[int] = set()
    for source in (outcome.values, outcome.finished):
        found: list[Any] = []
        _leaves(source, found, problems)
        for leaf in found:
            if id(leaf) not in seen:
                seen.add(id(leaf))
                leaves.append(leaf)
    return leaves, problems


# -- samples ---------------------------------------------------------------------------------


@attrs.define
class _Sample:
    item: AgentItem
    turns: list[AgentTrajectoryTurn] = attrs.Factory(list)
    reward: float | None = None
    metadata: dict[str, Any] = attrs.Factory(dict)
    messages: list[Mapping[str, Any]] | None = None
    failure: AgentFailure | None = None
    finished: bool = False
    """The agent said the sample is done (a trajectory, maybe without turns, or a reward)."""

    def agent_reward(self) -> float | None:
        if self.reward is not None:
            return self.reward
        for turn in reversed(self.turns):
            if turn.reward is not None:
                return turn.reward
        return None


def _group_leaves(
    leaves: list[Any], items: Sequence[AgentItem], problems: list[str]
) -> dict[tuple[int, int], _Sample]:
    samples = {item.key: _Sample(item) for item in items}
    for leaf in leaves:
        sample = samples.get(leaf.item.key)
        if sample is None:
            problems.append(
                f"the agent returned a result for sample {leaf.item.key}, which is not in this "
                "step's batch; use the AgentItem objects from batch.iter_samples()"
            )
            continue
        if isinstance(leaf, AgentFailure):
            sample.failure = sample.failure or leaf
        elif isinstance(leaf, AgentTrajectory):
            sample.finished = True
            sample.turns.extend(leaf.turns)
            if leaf.reward is not None:
                sample.reward = leaf.reward
            sample.metadata.update(leaf.metadata)
            if leaf.messages:
                sample.messages = list(leaf.messages)
        else:
            sample.turns.append(leaf)
    return samples


def _agent_items(
    items: Sequence[PromptItem], n_samples: int, url: Callable[[tuple[int, int]], str]
) -> list[AgentItem]:
    out = []
    for item in items:
        if item.messages is not None:
            messages = tuple(item.messages)
        else:
            messages = ({"role": "user", "content": item.prompt},)
        for s in range(n_samples):
            out.append(
                AgentItem(
                    row=item.row,
                    messages=messages,
                    prompt_index=item.index,
                    sample_index=s,
                    base_url=url((item.index, s)),
                )
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
    engine_lock: threading.Lock | None = None,
    on_group: Callable[[TrajectoryGroup], None] | None = None,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Run ``agent_fn`` on ``items`` x ``n_samples`` and return trajectory groups and metrics.

    ``model`` scores tool-result tokens for ``train_tool_results`` (default: ``engine.model``).
    ``engine_lock``, when given, is held around every use of the engine and of ``model``:
    calls that run at once (batches in flight together) pass the same lock.

    ``on_group``, when given, receives each group as soon as every sample of its prompt is
    finished by ``ctx.run_each``, built, checked and scored while the agent still runs the
    others (see :class:`_GroupStream`); those groups are not returned again. The metrics
    cover every group of the step, streamed or returned.
    """
    engine_lock = engine_lock if engine_lock is not None else threading.Lock()
    _refuse_if_agents_pile_up()
    started = time.perf_counter()
    scoring = model if model is not None else getattr(engine, "model", None)
    stream = None
    if on_group is not None:
        stream = _GroupStream(
            items,
            n_samples,
            on_group,
            tokenizer=tokenizer,
            scorer=scorer,
            sampling=sampling,
            train_tool_results=train_tool_results,
            max_context_len=max_context_len,
            scoring=scoring,
            engine_lock=engine_lock,
        )
    run = _run_agent(
        items,
        agent_fn,
        AgentServer(
            engine,
            tokenizer,
            sampling_defaults=sampling,
            disable_thinking=disable_thinking,
            timeout_s=timeout_s,
            generator=generator,
            engine_lock=engine_lock,
        ),
        n_samples=n_samples,
        timeout_s=timeout_s,
        max_concurrency=max_concurrency,
        stream=stream,
    )
    agent_done = time.perf_counter()
    if stream is not None:
        stream.raise_failure()
    leaves, problems = _collect_leaves(run.outcome, run.items)
    samples = _group_leaves(leaves, run.items, problems)
    claims: dict[tuple[str, int], list[tuple[int, int]]] = {}
    streamed = _Streamed()
    if stream is not None:
        streamed = stream.done
        claims = stream.claims
        samples = {k: s for k, s in samples.items() if k[0] not in streamed.prompts}
    built, counts, first_error = _build(
        samples,
        items,
        tokenizer,
        train_tool_results,
        run.records,
        max_context_len,
        completed=run.outcome.completed,
        claims=claims,
    )
    _report_failures(run, samples, built, counts, problems, first_error, kept=len(streamed.built))
    if train_tool_results:
        with engine_lock:
            _score_tool_tokens(built, scoring, sampling)
    reward_errors = _reward(built, scorer, tokenizer, items, run.records)
    rewarded = time.perf_counter()
    groups = _groups(items, built)
    for name, count in streamed.counts.items():
        counts[name] += count
    metrics = _metrics(
        streamed.groups + groups,
        items,
        streamed.built + built,
        counts,
        streamed.problems + problems,
        run,
        reward_errors + streamed.reward_errors,
    )
    metrics.update({"time/agent": agent_done - started, "time/reward": rewarded - agent_done})
    return groups, metrics


@attrs.define
class _Streamed:
    """What :class:`_GroupStream` handed on before the agent returned."""

    prompts: set[int] = attrs.Factory(set)
    """The prompt indices whose samples were all finished (handed on, or all dropped)."""
    groups: list[TrajectoryGroup] = attrs.Factory(list)
    built: list[_Built] = attrs.Factory(list)
    counts: dict[str, float] = attrs.Factory(dict)
    problems: list[str] = attrs.Factory(list)
    reward_errors: int = 0


class _GroupStream:
    """Hands on each prompt's group once ``ctx.run_each`` has finished all of its samples.

    Called on the thread that waits for the agent (:func:`run_agent_fn`'s ``progress``): it
    reads ``ctx.finished``, and for each prompt whose ``n_samples`` results are all there it
    builds the rows from a snapshot of the endpoint's records (every request of a finished
    sample was served before it finished), checks them as the whole batch would be checked
    (``claims`` carries the served choices claimed so far, so a choice claimed by two samples
    of different groups still rejects the later one), scores them and calls ``on_group``.
    Results given otherwise (returned or yielded by the agent function) are collected when
    the agent returns, as without streaming.
    """

    def __init__(
        self,
        items: Sequence[PromptItem],
        n_samples: int,
        on_group: Callable[[TrajectoryGroup], None],
        *,
        tokenizer: Any,
        scorer: RewardScorer,
        sampling: SamplingParams,
        train_tool_results: bool,
        max_context_len: int | None,
        scoring: Any,
        engine_lock: threading.Lock,
    ) -> None:
        self.items = list(items)
        self.n_samples = n_samples
        self.on_group = on_group
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.sampling = sampling
        self.train_tool_results = train_tool_results
        self.max_context_len = max_context_len
        self.scoring = scoring
        self.engine_lock = engine_lock
        self.claims: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self.done = _Streamed(
            counts=dict.fromkeys(("errors", "timeouts", "overflow", "mismatches"), 0.0)
        )
        self._seen = 0
        self._leaves: dict[int, list[Any]] = {}
        self._finished: dict[int, set[int]] = {}
        self._failure: BaseException | None = None

    def poll(self, ctx: AgentContext, records: Mapping[str, ServedCompletion]) -> None:
        """Hand on every group whose samples are all finished by now."""
        if self._failure is not None:
            return
        try:
            self._poll(ctx, records)
        except BaseException as exc:  # raised on the step's thread once the agent is done
            self._failure = exc

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _poll(self, ctx: AgentContext, records: Mapping[str, ServedCompletion]) -> None:
        finished = list(ctx.finished)
        ready: list[int] = []
        for result in finished[self._seen :]:
            found: list[Any] = []
            _leaves(result, found, [])
            if not found:
                continue
            for leaf in found:
                self._leaves.setdefault(leaf.item.prompt_index, []).append(leaf)
            prompt, sample = found[0].item.key  # the sample run_each finished
            samples = self._finished.setdefault(prompt, set())
            samples.add(sample)
            if len(samples) == self.n_samples and prompt not in self.done.prompts:
                ready.append(prompt)
        self._seen = len(finished)
        if not ready:
            return
        snapshot = dict(records)
        for prompt in ready:
            self._hand_on(prompt, snapshot)

    def _hand_on(self, prompt: int, records: Mapping[str, ServedCompletion]) -> None:
        done = self.done
        done.prompts.add(prompt)
        problems: list[str] = []
        agent_items = [leaf.item for leaf in self._leaves[prompt]]
        by_key = {item.key: item for item in agent_items}
        samples = _group_leaves(self._leaves[prompt], list(by_key.values()), problems)
        built, counts, _ = _build(
            samples,
            self.items,
            self.tokenizer,
            self.train_tool_results,
            records,
            self.max_context_len,
            completed=False,
            claims=self.claims,
        )
        for name, count in counts.items():
            done.counts[name] += count
        done.problems.extend(problems)
        if not built:
            return
        if self.train_tool_results:
            with self.engine_lock:
                _score_tool_tokens(built, self.scoring, self.sampling)
        done.reward_errors += _reward(built, self.scorer, self.tokenizer, self.items, records)
        done.built.extend(built)
        for group in _groups([i for i in self.items if i.index == prompt], built):
            done.groups.append(group)
            self.on_group(group)


@attrs.define
class _AgentRun:
    """What the agent did in one step: its samples, how it ended, what the endpoint served."""

    items: list[AgentItem]
    outcome: AgentOutcome
    records: dict[str, ServedCompletion]
    stats: dict[str, float]
    """The endpoint's request counters."""
    blocked: int
    """Samples whose threads were still blocked at the end (``rollout/agent_blocked_samples``)."""
    isolated: bool
    """Some samples ran on threads of their own (``ctx.run_each``)."""


def _refuse_if_agents_pile_up() -> None:
    """Stop before the step when earlier agents or samples that ignored their deadline are
    still running: each holds a thread, and the next step would likely add one."""
    if abandoned_agents() >= MAX_ABANDONED_AGENTS:
        raise AgentError(
            f"{abandoned_agents()} earlier agent runs ignored their deadline "
            f"(--agent-timeout-s) and are still running in the background; the agent blocks "
            "in code that cannot be interrupted (see 'What agent code must not do' in "
            "docs/agentic.md)"
        )
    if blocked_samples_left() >= MAX_BLOCKED_SAMPLES:
        raise AgentError(
            f"{blocked_samples_left()} samples of earlier steps ignored their deadline and are "
            "still blocked on threads of their own; the agent blocks in code that cannot be "
            "interrupted (see 'What agent code must not do' in docs/agentic.md)"
        )


def _run_agent(
    items: Sequence[PromptItem],
    agent_fn: AgentFn,
    server: AgentServer,
    *,
    n_samples: int,
    timeout_s: float,
    max_concurrency: int | None,
    stream: _GroupStream | None = None,
) -> _AgentRun:
    """Start the step's endpoint (``server``), run the agent against it to its deadline, and
    keep what the endpoint served (``stream``: hand on groups as their samples finish)."""
    with server:
        agent_items = _agent_items(items, n_samples, server.sample_base_url)
        batch = AgentBatch(items=tuple(agent_items), n_samples=n_samples)
        ctx = AgentContext(
            base_url=server.base_url,
            api_key=server.api_key,
            model=server.model_name,
            max_concurrency=max_concurrency or max(1, len(agent_items)),
            timeout_s=timeout_s,
        )
        progress = None
        if stream is not None:
            progress = functools.partial(stream.poll, ctx, server.records)
        # Groups whose last sample finishes after the last call are returned, not handed on.
        outcome = run_agent_fn(agent_fn, ctx, batch, timeout_s=timeout_s, progress=progress)
    # Samples cancelled by the agent's deadline get their grace now; the others had theirs.
    blocked = still_blocked(ctx.sample_threads, 0.5 if outcome.completed else ISOLATED_GRACE_S)
    return _AgentRun(
        items=agent_items,
        outcome=outcome,
        records=dict(server.records),
        stats=server.stats,
        blocked=blocked,
        isolated=bool(ctx.sample_threads),
    )


def _report_failures(
    run: _AgentRun,
    samples: Mapping[tuple[int, int], _Sample],
    built: list[_Built],
    counts: dict[str, float],
    problems: list[str],
    first_error: str | None,
    *,
    kept: int = 0,
) -> None:
    """Log what went wrong with the agent's results and count the samples a failed agent left
    unfinished as timeouts; raise :class:`AgentError` when no sample survived a failure."""
    outcome = run.outcome
    if problems:
        warn_once(
            logger,
            "agentic.bad_results",
            "the agent returned results that are not turns of this step's samples; they were "
            "skipped (counted in rollout/agent_bad_results; first shown once): %s",
            problems[0],
        )
        first_error = problems[0]  # it explains the samples that came back empty
    if outcome.error is not None:
        first_error = outcome.error
        missing = sum(
            1 for s in samples.values() if s.failure is None and not (s.turns or s.finished)
        )
        counts["timeouts"] += missing if outcome.timed_out else 0
        logger.warning(
            "the agent function failed (%d of %d samples kept):\n%s",
            len(built) + kept,
            len(run.items),
            outcome.error,
        )
    if outcome.longest_block_s > 1.0 and not run.isolated:  # samples on the agent's loop
        warn_once(
            logger,
            "agentic.blocked_loop",
            "the agent blocked its event loop for %.1f s in all (longest %.1f s): while it "
            "blocks, no other sample makes progress and per-sample timeouts cannot fire. Let "
            "ctx.run_each's function create its own client (each sample then runs on an event "
            "loop of its own), use awaitable calls (AsyncOpenAI, asyncio.sleep) or wrap "
            "blocking ones in 'await asyncio.to_thread(...)'",
            outcome.blocked_s,
            outcome.longest_block_s,
        )
    if not built and not kept and (counts["errors"] or counts["mismatches"] or problems):
        failed = counts["errors"] + counts["mismatches"]
        raise AgentError(
            f"no agentic sample survived this step ({failed:.0f} of {len(run.items)} "
            f"failed). First error:\n{first_error}"
        )


def _metrics(
    groups: list[TrajectoryGroup],
    items: Sequence[PromptItem],
    built: list[_Built],
    counts: Mapping[str, float],
    problems: list[str],
    run: _AgentRun,
    reward_errors: int,
) -> dict[str, float]:
    """The step's ``rollout/*`` metrics (see docs/agentic.md, "Metrics")."""
    metrics = rollout_metrics(groups, skipped=len(items) - len(groups), reward_errors=reward_errors)
    kept = [t for g in groups for t in g.trajectories]
    metrics.update(
        {
            "rollout/agent_errors": counts["errors"],
            "rollout/agent_timeouts": counts["timeouts"],
            "rollout/agent_mismatches": counts["mismatches"],
            "rollout/agent_bad_results": float(len(problems)),
            "rollout/agent_abandoned": float(run.outcome.abandoned),
            "rollout/agent_blocked_s": run.outcome.blocked_s,
            "rollout/agent_blocked_samples": float(run.blocked),
            "rollout/context_overflow": counts["overflow"],
            "rollout/agent_history_rewrites": float(
                sum(t.metadata["history_rewrites"] for t in kept)
            ),
            "rollout/agent_branches": float(sum(1 for b in built if not b.main)),
            "rollout/agent_requests": run.stats["requests"],
            "rollout/agent_generate_calls": run.stats["generate_calls"],
        }
    )
    if kept:
        turns = torch.tensor([float(t.metadata["turns"]) for t in kept])
        calls = torch.tensor([float(t.metadata["tool_calls"]) for t in kept])
        metrics["rollout/turns_mean"] = float(turns.mean())
        metrics["rollout/turns_max"] = float(turns.max())
        metrics["rollout/tool_calls_mean"] = float(calls.mean())
    return metrics


@attrs.define
class _Built:
    sample: _Sample
    trajectory: Trajectory
    turns: list[AgentTrajectoryTurn]
    """The turns the row was built from (the agent's, or made from the records)."""
    main: bool = True
    """The sample's row the reward function scores; the others share its reward."""


def _build(
    samples: Mapping[tuple[int, int], _Sample],
    items: Sequence[PromptItem],
    tokenizer: Any,
    train_tool_results: bool,
    records: Mapping[str, ServedCompletion],
    max_context_len: int | None,
    *,
    completed: bool = True,
    claims: dict[tuple[str, int], list[tuple[int, int]]] | None = None,
) -> tuple[list[_Built], dict[str, float], str | None]:
    """The rows of every sample that is kept, the counts of those dropped (errors, timeouts,
    rows over ``max_context_len``, mismatches with the records) and the first error."""
    built: list[_Built] = []
    counts = {"errors": 0.0, "timeouts": 0.0, "overflow": 0.0, "mismatches": 0.0}
    first_error: str | None = None
    first_mismatch: str | None = None
    served = _served_by_sample(records)
    mismatches = _verify(samples, items, records, served, claims)
    for key, sample in samples.items():
        if key in mismatches:
            counts["mismatches"] += 1
            first_mismatch = first_mismatch or mismatches[key]
            continue
        if sample.failure is not None:
            counts["timeouts"] += sample.failure.kind == "timeout"
        rows, problem = _sample_rows(
            sample, served.get(key, []), tokenizer, train_tool_results, records, completed
        )
        if problem is not None:
            counts["errors"] += 1
            first_error = first_error or problem
            continue
        built.extend(_within_context(rows, max_context_len, counts))
    if counts["errors"] and built:
        warn_once(
            logger,
            "agentic.sample_errors",
            "agentic samples failed and were dropped (counted in rollout/agent_errors; first "
            "error shown once):\n%s",
            first_error,
        )
    if first_mismatch is not None:
        warn_once(
            logger,
            "agentic.mismatches",
            "agentic samples whose turns do not match what the endpoint served were dropped "
            "(counted in rollout/agent_mismatches; first shown once): %s",
            first_mismatch,
        )
    return built, counts, first_error or first_mismatch


def _sample_rows(
    sample: _Sample,
    served: Sequence[ServedCompletion],
    tokenizer: Any,
    train_tool_results: bool,
    records: Mapping[str, ServedCompletion],
    completed: bool,
) -> tuple[list[_Built], str | None]:
    """One sample's rows, from its turns or else from what its URL served (``served``), or
    why it has none."""
    key = sample.item.key
    if sample.failure is not None:
        return [], sample.failure.error
    if not sample.turns and not served:
        return [], (
            f"the agent returned no turns for sample {key} and made no request through "
            "its URL (item.base_url)"
        )
    if not sample.turns and not (completed or sample.finished):
        return [], (
            f"sample {key} made requests through its URL but the agent function did not "
            "finish (it failed or timed out), so the sample is not known to be done"
        )
    try:  # from the records (verified already), never from the agent's copy
        if not sample.turns:
            return _rows_from_records(sample, served, tokenizer, train_tool_results, records), None
        trajectory = build_trajectory(
            sample.turns, tokenizer, train_tool_results=train_tool_results, records=records
        )
        return [_Built(sample, trajectory, list(sample.turns))], None
    except Exception as exc:
        return [], "".join(traceback.format_exception(exc))


def _within_context(
    rows: list[_Built], max_context_len: int | None, counts: dict[str, float]
) -> list[_Built]:
    """``rows`` without those longer than ``max_context_len`` (counted as overflow), placed at
    their sample's prompt and sample index."""
    kept = []
    for row in rows:
        if max_context_len is not None and len(row.trajectory.input_ids) > max_context_len:
            counts["overflow"] += 1
            continue
        row.trajectory.prompt_index = row.sample.item.prompt_index
        row.trajectory.sample_index = row.sample.item.sample_index
        kept.append(row)
    if kept and not any(row.main for row in kept):
        kept[-1].main = True  # the scored row overflowed: score the latest one kept
    return kept


def _served_by_sample(
    records: Mapping[str, ServedCompletion],
) -> dict[tuple[int, int], list[ServedCompletion]]:
    """The records of each sample's own URL, in the order they were served."""
    out: dict[tuple[int, int], list[ServedCompletion]] = {}
    for record in records.values():
        if record.sample is not None:
            out.setdefault(record.sample, []).append(record)
    return out


def _rows_from_records(
    sample: _Sample,
    served: Sequence[ServedCompletion],
    tokenizer: Any,
    train_tool_results: bool,
    records: Mapping[str, ServedCompletion],
) -> list[_Built]:
    """One row per linear conversation of what the sample's URL served
    (:mod:`areno_core.agentic.conversations`); the last one served is the scored one."""
    paths = conversation_paths(served)
    rows = []
    for number, (path, done) in enumerate(zip(paths, untrained_spans(paths), strict=True)):
        turns = [
            AgentTrajectoryTurn(
                item=sample.item,
                messages=records[node.response_id].messages,
                response=node.response_id,
                choice_index=node.choice_index,
            )
            for node in path
        ]
        trajectory = build_trajectory(
            turns, tokenizer, train_tool_results=train_tool_results, records=records
        )
        shared = max((end for _, end in done), default=0)
        for position in range(shared):  # trained in an earlier conversation already
            trajectory.loss_mask[position] = 0
            trajectory.rollout_logprobs[position] = 0.0
        trajectory.metadata["tool_positions"] = [
            p for p in trajectory.metadata["tool_positions"] if p >= shared
        ]
        trajectory.metadata["conversation"] = number
        trajectory.metadata["conversations"] = len(paths)
        rows.append(_Built(sample, trajectory, turns, main=number == len(paths) - 1))
    return rows


def _conversation_key(messages: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for message in messages:
        content = message.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True, default=str)
        out.append((str(message.get("role")), content))
    return out


def _contains(conversation: list[tuple[str, str]], wanted: list[tuple[str, str]]) -> bool:
    """Whether ``wanted`` occurs in ``conversation`` in order (not necessarily contiguous)."""
    it = iter(conversation)
    return all(any(entry == message for entry in it) for message in wanted)


def _verify(
    samples: Mapping[tuple[int, int], _Sample],
    items: Sequence[PromptItem],
    records: Mapping[str, ServedCompletion],
    served: Mapping[tuple[int, int], Sequence[ServedCompletion]],
    claims: dict[tuple[str, int], list[tuple[int, int]]] | None = None,
) -> dict[tuple[int, int], str]:
    """Why samples are rejected, by sample key:

    * a turn names a response the endpoint did not serve, or its ``areno`` copy differs from
      the record (:func:`~areno_core.agentic.trajectory.turn_tokens`), or one served through
      another sample's URL;
    * a served choice is claimed by two samples, or twice by one (every sampled completion
      is trained on once, in one sample);
    * the sample's first request holds the prompt of another prompt of the batch and not
      its own (a response to another task, scored against this one's answer).

    Agents that write their own prompts (not the loader's messages) pass the last check.
    Samples without turns are built from their own URL's records, which need only the last.

    ``claims``, when given, holds the choices claimed by samples checked earlier in the step
    (groups handed on as they finished); it is read and extended.
    """
    views: dict[tuple[int, int], list[TurnTokens]] = {}
    rejected: dict[tuple[int, int], str] = {}
    claims = {} if claims is None else claims
    firsts: dict[tuple[int, int], ServedCompletion] = {}
    for key, sample in samples.items():
        if sample.failure is not None:
            continue
        if not sample.turns:
            if served.get(key):
                firsts[key] = served[key][0]
            continue
        try:
            views[key] = [turn_tokens(turn, records) for turn in sample.turns]
        except TurnMismatchError as exc:
            rejected[key] = str(exc)
            continue
        except Exception:
            continue  # not readable at all: reported as an error when the row is built
        for view in views[key]:
            owner = records[str(view.response_id)].sample
            if owner is not None and owner != key:
                rejected[key] = (
                    f"sample {key}: response {view.response_id!r} was served through the URL "
                    f"of sample {owner}"
                )
            claims.setdefault((str(view.response_id), view.choice_index), []).append(key)
        firsts[key] = records[str(views[key][0].response_id)]
    for (rid, index), owners in claims.items():
        if len(owners) > 1:
            for key in owners:
                if key not in samples:
                    continue  # a sample of a group handed on earlier
                rejected.setdefault(
                    key,
                    f"sample {key}: choice {index} of response {rid!r} is used by "
                    f"{len(owners)} turns ({sorted(set(owners))}); each served completion may "
                    "belong to one turn of one sample",
                )
    prompts = {item.index: _conversation_key(_item_messages(item)) for item in items}
    for key, first in firsts.items():
        if key in rejected:
            continue
        asked = _conversation_key(first.messages)
        own = prompts.get(key[0], [])
        if own and _contains(asked, own):
            continue
        others = [p for index, p in prompts.items() if index != key[0] and p and p != own]
        if any(_contains(asked, other) for other in others):
            rejected[key] = (
                f"sample {key}: its first request holds the prompt of another row of the "
                "batch, not its own"
            )
    return rejected


def _item_messages(item: PromptItem) -> list[Mapping[str, Any]]:
    if item.messages is not None:
        return [dict(m) for m in item.messages]
    return [{"role": "user", "content": item.prompt}]


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
    """Reward every row: the agent's reward when it gave one, else the reward function's
    score of the sample's main row; the other rows of a sample share it."""
    by_index = {item.index: item for item in items}
    to_score: list[tuple[_Built, RewardRecord]] = []
    for entry in built:
        sample, trajectory = entry.sample, entry.trajectory
        prompt_item = by_index[sample.item.prompt_index]
        record = trajectory_record(
            trajectory,
            entry.turns,
            tokenizer,
            item=sample.item,
            messages=sample.messages if entry.main else None,
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
        elif entry.main:
            to_score.append((entry, record))
    if not to_score:
        return 0
    rewards, errors = scorer.score([record for _, record in to_score])
    scored: dict[tuple[int, int], float] = {}
    for (entry, _), reward in zip(to_score, rewards, strict=True):
        entry.trajectory.reward = reward
        entry.trajectory.metadata["reward_source"] = "reward_fn"
        scored[entry.sample.item.key] = reward
    for entry in built:
        if not entry.main and entry.sample.agent_reward() is None:
            entry.trajectory.reward = scored[entry.sample.item.key]
            entry.trajectory.metadata["reward_source"] = "reward_fn (shared)"
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

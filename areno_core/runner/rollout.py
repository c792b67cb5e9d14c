"""The rollout side of a run: one engine, kept in step with the policy, for training rollouts
and held-out evaluation alike.

The run builds one :class:`RolloutRunner` over one engine. The loop calls
:meth:`RolloutRunner.sync_weights` before the first step and after every step (it hands the
engine the policy whenever ``model.optimizer_steps`` moved, with that count as the version),
then calls the runner for each step's rows. Every rollout and every evaluation runs inside a
:class:`~areno_core.contracts.engine.RolloutSession`.

When training spans several processes, the backend's :class:`RolloutPlacement` says which
module the engine samples from (a full copy of the sharded policy), what ``sync_weights``
hands it, and how the prompts are shared: each process samples a contiguous block of the
step's prompts (every sample of a prompt in one process, so group advantages stay exact) and
the groups of all processes are gathered, in prompt order, on every process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch

from areno_core.accel.memory import MIB, move_optimizer_state
from areno_core.agentic.collect import collect_agentic_groups
from areno_core.contracts.engine import RolloutEngine, RolloutSession, holds_weights
from areno_core.log import get_logger
from areno_core.model import TrainableModel
from areno_core.models.lora import weights_for_engine
from areno_core.rewards import RewardScorer
from areno_core.rollout.collect import collect_groups, prompt_item
from areno_core.rollout.placement import RolloutPlacement
from areno_core.runner.evaluation import build_evaluator
from areno_core.types import SamplingParams, TrajectoryGroup

logger = get_logger(__name__)


@attrs.define
class AgentSettings:
    """How agentic rollouts run (``--agent-fn`` and its options): keywords of
    :func:`~areno_core.agentic.collect.collect_agentic_groups`, by the same names."""

    agent_fn: Callable[..., Any]
    train_tool_results: bool = False
    max_context_len: int | None = None
    timeout_s: float = 300.0
    max_concurrency: int | None = None


class RolloutRunner:
    """Samples, scores and groups completions for the rows of each step, from one engine."""

    def __init__(
        self,
        model: TrainableModel,
        engine: RolloutEngine,
        *,
        sampling: SamplingParams,
        n_samples: int,
        reward_fn: Callable[[Any], Any],
        batch_size: int,
        disable_thinking: bool = False,
        drop_state: bool = False,
        drop_uniform_groups: bool = False,
        agent: AgentSettings | None = None,
        placement: RolloutPlacement | None = None,
        offload_optimizer: bool = False,
        lora_weights: str | None = None,
    ) -> None:
        self.model = model
        self.placement = placement or RolloutPlacement.local(model)
        self.engine = engine
        self.sampling = sampling
        self.n_samples = n_samples
        self.reward_fn = reward_fn
        self.scorer = RewardScorer(reward_fn)
        self.batch_size = batch_size
        self.disable_thinking = disable_thinking
        self.drop_state = drop_state
        self.drop_uniform_groups = drop_uniform_groups
        self.agent = agent
        self.offload_optimizer = offload_optimizer
        # How a LoRA policy reaches the engine: its spec's ``lora_weights`` (the run passes
        # it), else the engine's own attribute of that name, else the merged weights.
        self.lora_weights = lora_weights or getattr(engine, "lora_weights", "merged")
        self._synced: int | None = None
        # Batches rolled out at once (the asynchronous worker's --max-inflight-batches) share
        # one engine session, and take turns on the engine (see ``__call__``).
        self._sync_lock = threading.Lock()
        self._session_lock = threading.Lock()
        self._session: RolloutSession | None = None
        self._session_users = 0
        self.engine_lock = threading.Lock()
        """Held around every ``engine.generate`` of an agentic batch: batches in flight at
        once each run an agent endpoint whose scheduler thread calls the engine."""
        self.weight_restores = 0
        """How often the engine had to be given the same version again after a release."""

    def sync_weights(self, weights: Any = None) -> None:
        """Hand the engine the policy if it changed since the last sync (or never was), or if
        the engine lost the weights of that version (a release that dropped them: see
        :mod:`areno_core.contracts.engine`). ``weights`` are the current version's weights when
        the caller has them (the asynchronous rollout worker); by default the placement's. A
        LoRA policy goes as the engine's spec asks (``lora_weights``: the module, the merged
        weights or the adapter; see :class:`~areno_core.contracts.engine.EngineSpec`)."""

        with self._sync_lock:  # batches in flight at once may start together
            version = self.model.optimizer_steps
            if self._synced == version and holds_weights(self.engine):
                return
            if self._synced == version:
                logger.debug(
                    "rollout engine dropped the weights of version %d: pushing again", version
                )
                self.weight_restores += 1
            if weights is None:
                weights = self.placement.weights()  # the full policy (gathered when sharded)
            if getattr(self.model, "adapter", None) is not None:  # LoRA: as the engine asks
                weights = weights_for_engine(self.model, self.lora_weights, weights)
            self.engine.sync_weights(weights, version=version)
            self._synced = version

    def __call__(
        self,
        rows: Sequence[dict[str, Any]],
        step: int,
        *,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        indices: Sequence[int] | None = None,
        on_group: Callable[[TrajectoryGroup], None] | None = None,
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """The groups of one step (``n_samples`` scored samples per row) and their metrics.

        ``sampling`` and ``generator`` default to the runner's ``sampling`` and the model's
        ``rollout_generator``; the asynchronous worker passes each batch's own, so batches in
        flight at once share no per-batch state. Overlapping calls (agentic batches only)
        share one engine session: the first opens it, the last closes it.

        ``indices`` are the rows' prompt indices (default: the step's, ``step x batch_size``
        on). ``on_group`` (agentic runs in one process only) receives each group as soon as
        its samples are done, instead of in the returned list (see
        :func:`~areno_core.agentic.collect.collect_agentic_groups`).
        """
        sampling = self.sampling if sampling is None else sampling
        generator = self.model.rollout_generator if generator is None else generator
        if indices is None:
            indices = range(step * self.batch_size, step * self.batch_size + len(rows))
        if len(indices) != len(rows):
            raise ValueError(f"{len(indices)} prompt indices for {len(rows)} rows")
        if on_group is not None and (self.agent is None or self.placement.size > 1):
            raise ValueError("groups are handed on one by one only by agentic runs in one process")
        items = [prompt_item(index, row) for index, row in zip(indices, rows, strict=True)]
        start, stop = self.placement.share(len(items))
        self.sync_weights()  # a no-op unless an evaluation's release dropped the weights
        with self._optimizer_offloaded(), self._shared_session():
            if self.agent is not None:
                groups, metrics = self._agentic(items[start:stop], sampling, generator, on_group)
            else:
                groups, metrics = collect_groups(
                    items[start:stop],
                    engine=self.engine,
                    tokenizer=self.model.tokenizer,
                    sampling=attrs.evolve(sampling, prompt_offset=start),
                    n_samples=self.n_samples,
                    scorer=self.scorer,
                    disable_thinking=self.disable_thinking,
                    generator=generator,
                )
        groups, metrics = self.placement.gather_groups(groups, metrics, generator)
        # What this process's engine keeps until the next step (after the gather: per process).
        kept = getattr(self.engine, "state_bytes", None)
        if isinstance(kept, int):
            metrics["memory/rollout_state_mib"] = kept / MIB
        metrics["rollout/policy_lag"] = float(
            self.model.optimizer_steps - metrics.get("rollout/policy_version", 0.0)
        )
        uniform = [g for g in groups if len(set(g.rewards)) <= 1]
        # Plus those an agentic batch handed on one by one (counted there).
        metrics["rollout/uniform_groups"] = metrics.get("rollout/uniform_groups", 0.0) + len(
            uniform
        )
        if self.drop_uniform_groups:
            groups = [g for g in groups if len(set(g.rewards)) > 1]
        return groups, metrics

    @contextlib.contextmanager
    def _shared_session(self) -> Iterator[None]:
        """One :class:`RolloutSession` around every call in progress: opened by the first,
        closed (with ``drop_state``) by the last, so one batch never ends the session, nor
        drops the engine's buffers, under another that still samples."""
        with self._session_lock:
            if self._session_users == 0:
                session = RolloutSession(self.engine, drop_state=self.drop_state)
                session.__enter__()
                self._session = session
            self._session_users += 1
        try:
            yield
        finally:
            with self._session_lock:
                self._session_users -= 1
                if self._session_users == 0:
                    session, self._session = self._session, None
                    assert session is not None
                    session.__exit__(None, None, None)

    @contextlib.contextmanager
    def _optimizer_offloaded(self) -> Iterator[None]:
        """With ``offload_optimizer`` on a GPU: the optimizers' state (and float32 master
        weights) sit in CPU memory for the rollout phase and come back before training."""
        device = self.model.device
        if not self.offload_optimizer or device.type == "cpu":
            yield
            return
        optimizers = (self.model.optimizer, self.model.critic_optimizer)
        moved = move_optimizer_state(optimizers, "cpu")
        try:
            yield
        finally:
            if moved:
                move_optimizer_state(optimizers, device)

    def _agentic(
        self,
        items: list[Any],
        sampling: SamplingParams,
        generator: torch.Generator,
        on_group: Callable[[TrajectoryGroup], None] | None = None,
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:

        agent = self.agent
        assert agent is not None
        handed_on = None
        uniform_streamed = 0
        if on_group is not None:

            def handed_on(group: TrajectoryGroup) -> None:
                nonlocal uniform_streamed
                version = self.engine.policy_version  # fixed while the batch runs
                for trajectory in group.trajectories:
                    trajectory.policy_version = version
                if len(set(group.rewards)) <= 1:
                    uniform_streamed += 1
                    if self.drop_uniform_groups:
                        return
                on_group(group)

        groups, metrics = collect_agentic_groups(
            items,
            **attrs.asdict(agent, recurse=False),  # the agent and its options, by name
            engine=self.engine,
            tokenizer=self.model.tokenizer,
            sampling=sampling,
            n_samples=self.n_samples,
            scorer=self.scorer,
            disable_thinking=self.disable_thinking,
            generator=generator,
            model=self.placement.policy,
            engine_lock=self.engine_lock,
            on_group=handed_on,
        )
        if on_group is not None:
            metrics["rollout/uniform_groups"] = float(uniform_streamed)
        # Every turn of this step was served by the engine at its current version.
        version = self.engine.policy_version
        for group in groups:
            for trajectory in group.trajectories:
                trajectory.policy_version = version
        if groups:
            metrics["rollout/policy_version"] = float(version)
        return groups, metrics

    def evaluator(
        self, rows: Sequence[dict[str, Any]], *, max_new_tokens: int
    ) -> Callable[[], dict[str, float]]:
        """Greedy held-out evaluation on ``rows`` with this runner's engine and reward (see
        :mod:`areno_core.runner.evaluation`)."""

        evaluate = build_evaluator(
            rows,
            engine=self.engine,
            tokenizer=self.model.tokenizer,
            reward_fn=self.reward_fn,
            max_new_tokens=max_new_tokens,
            disable_thinking=self.disable_thinking,
            placement=self.placement,
        )

        def run() -> dict[str, float]:
            started = time.perf_counter()
            self.sync_weights()
            metrics = evaluate()
            metrics["time/eval"] = time.perf_counter() - started
            return metrics

        return run

"""The rollout worker process of ``--async-rollout``: samples, scores and groups completions
for the batches the trainer sends, with the newest weights it has received.

The trainer (:class:`areno_core.runner.async_rollout.AsyncRolloutRunner`) starts
:func:`worker_main` in a spawned process with a :class:`WorkerSpec` and two one-way pipes. The
worker builds its own copy of the policy (from ``--ckpt``), the run's rollout engine, reward and
agent, inside an ordinary :class:`~areno_core.runner.rollout.RolloutRunner`, then serves:

    trainer -> worker   Weights(version, packed)   the policy after a train step
                        Rollout(step, rows, ...)    a batch to sample, score and group
                        Stop()
    worker -> trainer   Ready(pid), then Batch(step, groups, metrics) per request,
                        each preceded by Group(step, group) for the groups it sent early
                        (requests with ``stream``), or Failed(error) once, before it exits

Before each batch the worker reads every message that has arrived and loads the newest weights
among them (older ones are skipped), so a batch is always sampled by the freshest policy the
worker holds. A batch in flight is finished with the weights it started with: every completion
of a batch, and so every sample of a group, carries one ``policy_version``.

Each batch runs on a thread of its own. Agentic runs may keep several in flight
(``--max-inflight-batches``, :attr:`WorkerSpec.max_inflight_batches`): a waiting batch starts
beside those in flight while no newer weights have arrived; newer weights stop new starts until
the batches in flight have finished, and are loaded then. Each batch goes back as soon as it is
done, in whatever order they finish (the trainer's buffer is keyed by step). Each batch gets
its own sampling settings and agent generator; the runner's engine is shared, with one session
and one lock around its use (:class:`~areno_core.runner.rollout.RolloutRunner`).

The worker ignores Ctrl-C (the trainer stops it) and exits when the trainer's end of either pipe
closes.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import attrs
import torch

from areno_core.agentic.collect import resolve_agent_fn
from areno_core.contracts.engine import EngineOptions, drops_weights
from areno_core.errors import ArenoError
from areno_core.log import get_logger
from areno_core.model import TrainableModel
from areno_core.models.loading import load_model_and_tokenizer
from areno_core.models.reward import reward_model_beside
from areno_core.registry import get_registry
from areno_core.rewards import resolve_reward_fn
from areno_core.rollout.placement import RolloutPlacement
from areno_core.rollout.weights import PackedWeights
from areno_core.runner.rollout import AgentSettings, RolloutRunner
from areno_core.types import SamplingParams, TrajectoryGroup

logger = get_logger(__name__)

# What ``Connection.recv`` raises once its pipe is gone: EOFError or OSError when the other end
# closed it, TypeError when this end was closed by another thread while ``recv`` waited (its
# handle is then None). Each reader thread takes any of them as "closed".
PIPE_CLOSED_ERRORS = (EOFError, OSError, TypeError)


# -- messages ---------------------------------------------------------------------------------


@attrs.frozen
class Weights:
    version: int
    packed: PackedWeights


@attrs.frozen
class Rollout:
    """A batch to roll out: ``rows`` are the dataset rows of trainer step ``step``; ``sampling``
    carries the batch's random-stream seed; an agentic batch seeds the agent server's
    generator with ``agent_seed``."""

    step: int
    rows: list[dict[str, Any]]
    sampling: SamplingParams
    agent_seed: int | None = None
    indices: tuple[int, ...] | None = None
    """The rows' prompt indices, when they are not the step's (rows rolled out again after
    a resume: see :class:`~areno_core.runner.step_fill.CompletionFill`)."""
    stream: bool = False
    """Send each group as soon as its samples are done (:class:`Group`), not only in the
    batch (agentic batches, ``--step-fill completion``)."""


@attrs.frozen
class Stop:
    pass


@attrs.frozen
class Ready:
    pid: int


@attrs.frozen
class Group:
    """One group of request ``step``, sent as soon as its samples were done; the request's
    :class:`Batch` follows with the groups not sent this way and the metrics of all."""

    step: int
    group: TrajectoryGroup


@attrs.frozen
class Batch:
    step: int
    groups: list[TrajectoryGroup]
    metrics: dict[str, float]


@attrs.frozen
class Failed:
    """The worker stopped on an exception: its type, message and traceback."""

    kind: str
    message: str
    details: str
    user_error: bool


# -- what the worker builds -------------------------------------------------------------------


@attrs.frozen
class WorkerSpec:
    """Everything the worker needs to build its rollout side, as plain picklable values.

    Functions (reward, agent) travel as the references the user gave (a file or a registered
    name) and are resolved again in the worker, like the engine, by name.
    """

    ckpt: str
    device: str
    engine: str
    engine_options: EngineOptions
    engine_config: dict[str, Any]
    sampling: SamplingParams
    n_samples: int
    batch_size: int
    reward_fn: str | None = None
    reward_ckpt: str | None = None
    agent_fn: str | None = None
    agent_options: dict[str, Any] = attrs.Factory(dict)
    disable_thinking: bool = False
    drop_state: bool = False
    drop_uniform_groups: bool = False
    threads: int | None = None
    log_level: int = logging.WARNING
    dtype: str = "auto"
    """The trainer's policy dtype by name (``"float32"``, ``"bfloat16"``...), so the worker
    samples with the weights the trainer publishes, in their own type."""
    attn_implementation: str | None = None
    max_inflight_batches: int = 1
    """Agentic batches rolled out at once (``--max-inflight-batches``; 1 for other runs)."""


def build_runner(spec: WorkerSpec) -> Any:
    """The worker's :class:`RolloutRunner`: its own policy copy, engine, reward and agent."""
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    registry = get_registry()
    # The parameters keep requires_grad as the trainer's do: torch picks other (equally
    # valid) kernels for frozen weights, and the worker must compute what the trainer's
    # engine would, to the last bit (no gradients are taken here: the engine samples in
    # inference mode).
    policy, tokenizer = load_model_and_tokenizer(
        spec.ckpt,
        device=spec.device,
        dtype=spec.dtype,
        attn_implementation=spec.attn_implementation,
    )
    model = TrainableModel(policy, tokenizer, ckpt=spec.ckpt)
    engine_spec = registry.engine(spec.engine)
    engine = engine_spec.create(
        policy, tokenizer, spec.engine_options, engine_spec.make_config(spec.engine_config)
    )
    if spec.reward_fn is not None:
        reward_fn = resolve_reward_fn(spec.reward_fn, registry)
    else:
        assert spec.reward_ckpt is not None, "the run checks that one of them is given"
        reward_fn = reward_model_beside(model, spec.reward_ckpt)
    agent = None
    if spec.agent_fn is not None:
        agent = AgentSettings(resolve_agent_fn(spec.agent_fn, registry), **spec.agent_options)
    return RolloutRunner(
        model,
        engine,
        placement=RolloutPlacement(policy, PublishedWeights(policy)),
        sampling=spec.sampling,
        n_samples=spec.n_samples,
        reward_fn=reward_fn,
        batch_size=spec.batch_size,
        disable_thinking=spec.disable_thinking,
        drop_state=spec.drop_state,
        drop_uniform_groups=spec.drop_uniform_groups,
        agent=agent,
    )


# -- the process ------------------------------------------------------------------------------

_CLOSED = object()  # the trainer's end of the pipe closed


class Mailbox:
    """Reads a connection on a background thread, so the sender never blocks on a busy
    reader; :meth:`take` hands over everything received so far."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._messages: collections.deque[Any] = collections.deque()
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="areno-mailbox", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                message = self._connection.recv()
            except PIPE_CLOSED_ERRORS:
                message = _CLOSED
            with self._ready:
                self._messages.append(message)
                self._ready.notify_all()
            if message is _CLOSED:
                return

    def post(self, message: Any) -> None:
        """Add ``message`` from this process (a finished batch), waking a blocked ``take``."""
        with self._ready:
            self._messages.append(message)
            self._ready.notify_all()

    def take(self, *, block: bool) -> list[Any]:
        """Every message received so far; with ``block``, wait for at least one."""
        with self._ready:
            while block and not self._messages:
                self._ready.wait()
            taken = list(self._messages)
            self._messages.clear()
        return taken


class PublishedWeights:
    """What the worker's runner re-pushes when its engine dropped the weights of the current
    version (see :mod:`areno_core.contracts.engine`): the newest weights the trainer published,
    kept only for an engine that may drop them (the others hold them already, and keeping the
    shared-memory copy alive would cost a copy of the policy)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self._kept: Weights | None = None

    def receive(self, message: Weights, *, keep: bool) -> None:
        self._kept = message if keep else None

    def __call__(self) -> Any:
        return self.policy if self._kept is None else self._kept.packed.state_dict()


@attrs.frozen
class _Finished:
    """A batch thread's result, posted to the worker's own mailbox."""

    step: int
    groups: list[TrajectoryGroup] | None = None
    metrics: dict[str, float] | None = None
    error: BaseException | None = None


class _InFlight:
    """The batches being rolled out now, each on a thread of its own; a finished one posts
    :class:`_Finished` to the mailbox, so the serving loop wakes on it as on a message."""

    def __init__(self, runner: Any, mailbox: Mailbox, *, report: bool) -> None:
        self.runner = runner
        self.mailbox = mailbox
        self.report = report  # add rollout/inflight_batches (only where batches may overlap)
        self.steps: set[int] = set()

    def __len__(self) -> int:
        return len(self.steps)

    def start(self, request: Rollout) -> None:
        self.steps.add(request.step)
        started_with = len(self.steps)
        # Each batch gets its own sampling and agent generator: nothing per batch is shared.
        generator = None
        if request.agent_seed is not None:
            generator = torch.Generator().manual_seed(request.agent_seed)

        on_group = None
        if request.stream:

            def on_group(group: TrajectoryGroup) -> None:
                self.mailbox.post(Group(request.step, group))

        def run() -> None:
            try:
                groups, metrics = self.runner(
                    request.rows,
                    request.step,
                    sampling=request.sampling,
                    generator=generator,
                    indices=request.indices,
                    on_group=on_group,
                )
            except BaseException as exc:  # handed to the serving loop, which raises it
                self.mailbox.post(_Finished(request.step, error=exc))
                return
            if self.report:
                metrics["rollout/inflight_batches"] = float(started_with)
            self.mailbox.post(_Finished(request.step, groups, metrics))

        name = f"areno-rollout-step-{request.step}"
        threading.Thread(target=run, name=name, daemon=True).start()

    def finish(self, step: int) -> None:
        self.steps.discard(step)


def serve(runner: Any, mailbox: Mailbox, outbox: Connection, *, max_inflight: int = 1) -> None:
    """Answer rollout requests until Stop or until the trainer goes away.

    Up to ``max_inflight`` batches are rolled out at once, all with one weights version: when
    newer weights arrive, no further batch starts until those in flight have finished; then
    the newest weights are loaded and the pending batches start with them. Each batch goes
    to the trainer as soon as it is done, in whatever order they finish.
    """
    if max_inflight < 1:
        raise ValueError(f"max_inflight must be at least 1, got {max_inflight}")
    pending: collections.deque[Rollout] = collections.deque()
    inflight = _InFlight(runner, mailbox, report=max_inflight > 1)
    published = runner.placement.weights
    have_weights = False
    newest: Weights | None = None  # arrived, not loaded yet: waits for the batches in flight
    waiting_since = 0.0
    load_s = drain_s = 0.0
    while True:
        can_start = bool(pending) and newest is None and len(inflight) < max_inflight
        must_load = newest is not None and not inflight
        for message in mailbox.take(block=not (can_start or must_load)):
            if message is _CLOSED or isinstance(message, Stop):
                return
            if isinstance(message, Weights):
                if newest is None:
                    waiting_since = time.perf_counter()
                newest = message
            elif isinstance(message, Group):  # posted by a batch in flight
                outbox.send(message)
            elif isinstance(message, _Finished):
                inflight.finish(message.step)
                if message.error is not None:
                    raise message.error
                assert message.metrics is not None and message.groups is not None
                message.metrics["time/weight_load"] = load_s
                message.metrics["time/weight_drain"] = drain_s
                load_s = drain_s = 0.0
                outbox.send(Batch(message.step, message.groups, message.metrics))
            else:
                pending.append(message)
        if newest is not None and not inflight:
            started = time.perf_counter()
            drain_s += started - waiting_since
            if isinstance(published, PublishedWeights):
                published.receive(newest, keep=drops_weights(runner.engine))
            runner.model.optimizer_steps = newest.version
            runner.sync_weights(newest.packed.state_dict())
            have_weights = True
            newest = None
            load_s += time.perf_counter() - started
        while pending and newest is None and len(inflight) < max_inflight:
            if not have_weights:
                raise RuntimeError("a rollout request arrived before any weights")
            inflight.start(pending.popleft())


def worker_main(spec: WorkerSpec, inbox: Connection, outbox: Connection) -> None:
    """Entry point of the spawned worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    import torch.multiprocessing  # noqa: F401 - registers the shared-memory tensor pickling

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[rollout worker] %(levelname)s %(message)s"))
    areno_logger = logging.getLogger("areno")
    areno_logger.addHandler(handler)
    areno_logger.setLevel(spec.log_level)
    areno_logger.propagate = False

    try:
        runner = build_runner(spec)
        outbox.send(Ready(os.getpid()))
        serve(runner, Mailbox(inbox), outbox, max_inflight=spec.max_inflight_batches)
    except BaseException as exc:  # report anything, then exit non-zero
        failure = Failed(
            type(exc).__name__,
            str(exc),
            "".join(traceback.format_exception(exc)),
            isinstance(exc, ArenoError),
        )
        with contextlib.suppress(OSError, EOFError):  # the trainer may be gone already
            outbox.send(failure)
        raise SystemExit(1) from None


__all__ = [
    "Batch",
    "Failed",
    "Group",
    "Mailbox",
    "PublishedWeights",
    "Ready",
    "Rollout",
    "Stop",
    "Weights",
    "WorkerSpec",
    "build_runner",
    "serve",
    "worker_main",
]

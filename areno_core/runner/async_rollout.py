"""``--async-rollout``: rollout in a worker process that keeps sampling while the trainer trains.

The trainer side of the design in docs/async.md. :class:`AsyncRolloutRunner` has the two
methods the training loop calls on any rollout (:class:`areno_core.loop.Rollout`), so the loop
is the same in both modes:

``sync_weights()`` (before the first step and after each one)
    publishes the policy to the worker when it changed (a new *version*: a shared-memory copy
    of the parameters, see :mod:`areno_core.rollout.weights`), then *admits* work: it sends the
    rows of every step up to ``model.step + max_staleness`` that was not sent yet. The rows come
    from a look-ahead copy of the run's data stream, the sampling seeds from a look-ahead copy
    of ``model.rollout_generator``, so both match what a synchronous run would use.
``__call__(rows, step)``
    waits until the worker's batch for ``step`` is in the buffer (a background thread moves
    every finished batch from the worker's pipe into it), drops samples more than
    ``max_staleness`` versions behind the trainer's policy, and returns the groups with their
    metrics. Only now are the real data stream and rollout generator advanced past the step,
    so a checkpoint records exactly the consumed steps.

The staleness bound: the rows of step ``s`` leave for the worker only after the policy of
step ``s - K`` was published, and the worker samples each batch with the newest weights it
holds, so a batch trained at step ``s`` comes from a policy at most ``K`` versions old. The
check in ``__call__`` enforces it whatever the worker did (``rollout/stale_dropped``). With
``K = 0`` the worker samples every batch with the trainer's current policy: synchronous
training, in two processes.

A worker that dies (killed, crashed, out of memory) ends the run with
:class:`RolloutWorkerError` at the next wait, never a hang: the trainer holds no copy of the
worker's end of either pipe, so the worker's exit closes them.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from areno_core.data.stream import DataStream
from areno_core.errors import ArenoError
from areno_core.log import get_logger
from areno_core.model import TrainableModel
from areno_core.rollout.collect import merge_rollout_metrics
from areno_core.rollout.sampling import draw_seed, seeded
from areno_core.rollout.weights import pack_weights
from areno_core.runner.async_options import check_async_options
from areno_core.runner.boot import WorkerProcess
from areno_core.runner.step_fill import CompletionFill
from areno_core.runner.worker import (
    PIPE_CLOSED_ERRORS,
    Batch,
    Failed,
    Group,
    Ready,
    Rollout,
    Stop,
    Weights,
    WorkerSpec,
    worker_main,
)
from areno_core.types import TrajectoryGroup

logger = get_logger(__name__)

STEP_FILLS = ("batch", "completion")
"""``--step-fill``: a step trains on its own rows' groups, or on the first groups to finish."""

# Batch metrics a completion-filled step reports as the largest of the batches that came back
# during it (with the memory/* ones); merge_rollout_metrics sums the other counts.
_LARGEST = frozenset({"rollout/inflight_batches"})

# How often a waiting trainer also checks that the worker process is still alive.
_POLL_S = 0.5


class RolloutWorkerError(ArenoError):
    """The rollout worker process failed or exited; the run cannot continue."""


class AsyncRolloutRunner:
    """Serves the training loop from a rollout worker process (see the module docstring).

    Use it as a context manager: entering starts the worker and waits until it is ready,
    leaving stops it. ``threads`` sets this process's torch threads while the runner is open
    (``None``: unchanged).
    """

    def __init__(
        self,
        model: TrainableModel,
        stream: DataStream,
        spec: WorkerSpec,
        *,
        max_staleness: int,
        max_steps: int,
        agentic: bool = False,
        threads: int | None = None,
        process: WorkerProcess | None = None,
        step_fill: str = "batch",
        resume_state: Mapping[str, Any] | None = None,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if step_fill not in STEP_FILLS:
            raise ValueError(f"step_fill must be one of {STEP_FILLS}, got {step_fill!r}")
        if step_fill == "completion" and not agentic:
            raise ValueError(
                "step_fill 'completion' needs agentic rollout (groups finish together otherwise)"
            )
        self.model = model
        self.stream = stream
        self.spec = spec
        self.max_staleness = max_staleness
        self.max_steps = max_steps
        self.agentic = agentic
        self.threads = threads
        # What the run will consume next, read ahead: rows and sampling seeds.
        self._rows_ahead = copy.copy(stream)
        self._seeds_ahead = _clone_generator(model.rollout_generator)
        self._next_step = model.step
        self._sent: dict[int, Rollout] = {}
        self._published: list[int] = []  # versions, in the order they were published
        self._buffer: dict[int, Batch] = {}
        self._failed: Failed | None = None  # the worker reported an exception
        self._exited = False  # the worker's pipe closed or its process is gone
        self._done = threading.Condition()
        self._process: Any = None
        self._to_worker: Any = None
        self._from_worker: Any = None
        self._reader: threading.Thread | None = None
        self._saved_threads: int | None = None
        self._publish_s = 0.0
        self._early = process  # started before the run loaded anything (see runner.boot)
        self._fill: CompletionFill | None = None
        if step_fill == "completion":
            self._fill = CompletionFill(stream.batch_size, (resume_state or {}).get("fill"))
        self._broken: BaseException | None = None  # the reader thread could not file a message

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> AsyncRolloutRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Spawn the worker (or take over the one given as ``process``, and send it the spec)
        and wait until it has built its rollout side."""
        if self._early is not None:
            early, self._early = self._early, None
            self._process, self._to_worker, self._from_worker = (
                early.process,
                early.to_worker,
                early.from_worker,
            )
            early.process = None  # this runner stops it now
            try:
                self._send(self.spec)
            except RolloutWorkerError:
                self.close()
                raise
        else:
            self._spawn()
        first = self._receive_first()
        if isinstance(first, Failed):
            self.close()
            raise self._error(first, "while starting")
        logger.info("rollout worker ready (pid %d)", first.pid)
        self._reader = threading.Thread(target=self._read, name="areno-rollout-reader", daemon=True)
        self._reader.start()
        if self.threads is not None:
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)

    def _spawn(self) -> None:
        import torch.multiprocessing as mp  # only for the asynchronous rollout worker

        ctx = mp.get_context("spawn")
        worker_in, self._to_worker = ctx.Pipe(duplex=False)
        self._from_worker, worker_out = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=worker_main,
            args=(self.spec, worker_in, worker_out),
            name="areno-rollout-worker",
            daemon=True,
        )
        self._process.start()
        # Only the worker holds its ends now: when it exits, both pipes close.
        worker_in.close()
        worker_out.close()

    def _receive_first(self) -> Ready | Failed:
        message: Any = None
        while message is None:
            try:
                if self._from_worker.poll(_POLL_S):
                    message = self._from_worker.recv()
                elif not self._process.is_alive():
                    raise EOFError
            except (EOFError, OSError):
                error = self._error(None, "while starting")
                self.close()
                raise RolloutWorkerError(
                    f"{error} (its own error, if any, is printed above; a Python script that "
                    "trains with --async-rollout must start it under "
                    "'if __name__ == \"__main__\":', since the worker is a spawned process "
                    "that imports the script again)"
                ) from None
        if not isinstance(message, Ready | Failed):
            raise RuntimeError(f"unexpected first message from the rollout worker: {message!r}")
        return message

    def close(self) -> None:
        """Stop the worker (it finishes nothing more) and release the pipes."""
        if self._early is not None:  # never started: the early process is not needed
            self._early.close()
            self._early = None
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError, ValueError):  # a worker already gone needs no Stop
            self._to_worker.send(Stop())
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
        # The worker's exit closed its end, so the reader thread ends on its own. Wait for it
        # before closing ours: a thread still reading a closed descriptor would read whatever
        # pipe is opened next under the same number (the next run's worker, in this process).
        if self._reader is not None:
            self._reader.join(timeout=10)
        self._to_worker.close()
        self._from_worker.close()

    # -- the loop's side ------------------------------------------------------------------

    def sync_weights(self) -> None:
        """Publish the policy if it changed, then send the rows of every step the staleness
        bound now allows."""
        self._check_running()
        version = self.model.optimizer_steps
        if not self._published or self._published[-1] != version:
            started = time.perf_counter()
            packed = pack_weights(self.model.policy)
            self._send(Weights(version, packed))
            self._published.append(version)
            self._publish_s += time.perf_counter() - started
        if self._fill is not None:
            self._send_owed(self._fill)
        last = min(self.model.step + self.max_staleness, self.max_steps - 1)
        while self._next_step <= last:
            rows = self._rows_ahead.next_batch()
            if rows is None:
                break
            request = self._request(self._next_step, rows)
            if self._fill is None:
                self._send(request)
            else:
                self._send_filling(self._fill, request)
            self._sent[request.step] = request
            self._next_step += 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs of the rollout side (``--step-fill completion``: the rows
        whose groups are owed or were trained ahead; nothing otherwise)."""
        if self._fill is None:
            return {}
        with self._done:
            return {"fill": self._fill.state_dict(self.model.step)}

    def __call__(
        self, rows: Sequence[dict[str, Any]], step: int
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """The groups of step ``step`` (whose rows must be ``rows``) and their metrics; with
        ``step_fill="completion"``, the first groups to finish (see :mod:`.step_fill`)."""
        self.sync_weights()
        request = self._sent.pop(step, None)
        if request is None or len(request.rows) != len(rows):
            raise RuntimeError(f"step {step}: its rows were never sent to the rollout worker")
        if any(a is not b for a, b in zip(request.rows, rows, strict=True)):
            raise RuntimeError(f"step {step}: the loop's rows differ from those rolled out")
        if self._fill is not None:
            return self._take_filling(self._fill, request)
        ready = len(self._buffer)
        started = time.perf_counter()
        batch = self._wait(step)
        waited = time.perf_counter() - started
        self._consume_seed(request)
        groups, metrics = self._fresh(batch)
        metrics["rollout/buffered_batches"] = float(ready)
        self._add_timing(metrics, waited)
        return groups, metrics

    def _add_timing(self, metrics: dict[str, float], waited: float) -> None:
        """The step's wait, the weight publications since the last step, the policy lag."""
        metrics["time/rollout_wait"] = waited
        metrics["time/weight_sync"] = self._publish_s
        self._publish_s = 0.0
        if "rollout/policy_version" in metrics:
            metrics["rollout/policy_lag"] = float(
                self.model.optimizer_steps - metrics["rollout/policy_version"]
            )

    # -- --step-fill completion -------------------------------------------------------------

    def _send_owed(self, fill: CompletionFill) -> None:
        """After a resume: roll out again the rows whose groups the checkpoint still owed."""
        with self._done:
            owed, fill.resumed_owed = fill.resumed_owed, []
        for step, indices, seed in owed:
            first = step * self.stream.batch_size
            rows = self.stream.batch_at(step)
            picked = [rows[i - first] for i in indices]
            with self._done:
                key = fill.owed_key()
                fill.sent(key, step, indices, seed)
            self._send(
                Rollout(key, picked, self.spec.sampling, seed, indices=tuple(indices), stream=True)
            )

    def _send_filling(self, fill: CompletionFill, request: Rollout) -> None:
        first = request.step * self.stream.batch_size
        every = list(range(first, first + len(request.rows)))
        with self._done:
            indices = fill.to_send(request.step, every)
            fill.sent(request.step, request.step, indices, request.agent_seed)
        if not indices:
            return  # every row of this step was trained before the resume
        rows = request.rows
        if indices != every:
            rows = [rows[i - first] for i in indices]
        self._send(
            attrs.evolve(
                request,
                rows=rows,
                indices=None if indices == every else tuple(indices),
                stream=True,
            )
        )

    def _take_filling(
        self, fill: CompletionFill, request: Rollout
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        step = request.step
        ready = len(fill.pool)
        started = time.perf_counter()
        with self._done:
            self._wait_until(fill.ready)
            if self._broken is not None:
                raise RolloutWorkerError(f"a message of the rollout worker: {self._broken}")
            if not fill.ready():
                raise self._error(self._failed, f"while step {step + 1} waited for its rollouts")
            taken, closed, streamed = fill.take(step)
            pooled = len(fill.pool)
        waited = time.perf_counter() - started
        self._consume_seed(request)
        groups, stale = self._fresh_groups([group for _, group in taken])
        metrics = merge_rollout_metrics(closed, groups)
        metrics.pop("rollout/policy_lag", None)  # the worker's own; recomputed below
        for key in {k for m in closed for k in m if k in _LARGEST or k.startswith("memory/")}:
            metrics[key] = max(m[key] for m in closed if key in m)  # not a sum over batches
        metrics.update(stale)
        metrics["rollout/groups_pooled"] = float(pooled)
        metrics["rollout/groups_early"] = float(
            sum(1 for key, _ in taken if key >= 0 and key > step)
        )
        metrics["rollout/groups_late"] = float(sum(1 for key, _ in taken if key < 0 or key < step))
        metrics["rollout/buffered_groups"] = float(ready)
        metrics["rollout/groups_streamed"] = float(streamed)
        self._add_timing(metrics, waited)
        self._warn_stale(step, stale)
        return groups, metrics

    # -- internals ------------------------------------------------------------------------

    def _request(self, step: int, rows: list[dict[str, Any]]) -> Rollout:
        if self.agentic:
            return Rollout(step, rows, self.spec.sampling, agent_seed=draw_seed(self._seeds_ahead))
        return Rollout(step, rows, seeded(self.spec.sampling, self._seeds_ahead))

    def _consume_seed(self, request: Rollout) -> None:
        """Advance the run's rollout generator past the step, as a synchronous run would."""
        if self.agentic:
            drawn = draw_seed(self.model.rollout_generator)
            assert drawn == request.agent_seed, "the look-ahead generator diverged"
        else:
            drawn_params = seeded(self.spec.sampling, self.model.rollout_generator)
            assert drawn_params == request.sampling, "the look-ahead generator diverged"

    def _fresh(self, batch: Batch) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """Drop samples more than ``max_staleness`` versions behind; staleness metrics."""
        kept, stale = self._fresh_groups(batch.groups)
        metrics = dict(batch.metrics)
        metrics.update(stale)
        self._warn_stale(batch.step, stale)
        return kept, metrics

    def _warn_stale(self, step: int, stale: dict[str, float]) -> None:
        if stale["rollout/stale_dropped"]:
            logger.warning(
                "step %d: dropped %d samples more than %d policy versions old",
                step + 1,
                int(stale["rollout/stale_dropped"]),
                self.max_staleness,
            )

    def _fresh_groups(
        self, groups: Sequence[TrajectoryGroup]
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """``groups`` without those more than ``max_staleness`` versions behind, and the
        ``rollout/stale*`` metrics."""
        index = {version: i for i, version in enumerate(self._published)}
        now = len(self._published) - 1
        kept, lags, dropped = [], [], 0
        for group in groups:
            unknown = {t.policy_version for t in group.trajectories} - set(index)
            if unknown:
                raise RuntimeError(f"samples of policy versions never published: {unknown}")
            group_lags = [now - index[t.policy_version] for t in group.trajectories]
            if max(group_lags, default=0) > self.max_staleness:
                dropped += len(group.trajectories)
                continue
            kept.append(group)
            lags.extend(group_lags)
        metrics = {"rollout/stale_dropped": float(dropped)}
        if lags:
            metrics["rollout/staleness_mean"] = sum(lags) / len(lags)
            metrics["rollout/staleness_max"] = float(max(lags))
        return kept, metrics

    def _send(self, message: Any) -> None:
        try:
            self._to_worker.send(message)
        except (OSError, EOFError):
            with self._done:
                self._done.wait_for(lambda: self._failed is not None or self._exited, 2.0)
            raise self._error(self._failed, "while the trainer sent it work") from None

    def _read(self) -> None:
        """Background thread: move the worker's messages into the buffer."""
        connection = self._from_worker
        while True:
            try:
                message = connection.recv()
            except PIPE_CLOSED_ERRORS:
                message = None
            with self._done:
                if self._fill is not None and isinstance(message, Group | Batch):
                    try:
                        if isinstance(message, Group):
                            self._fill.arrived(message.step, message.group)
                        else:
                            self._fill.closed(message.step, message.groups, message.metrics)
                    except Exception as exc:  # raised by the step that waits
                        self._broken = exc
                        self._exited = True
                        message = None
                elif isinstance(message, Batch):
                    self._buffer[message.step] = message
                elif isinstance(message, Failed):
                    self._failed = message
                else:
                    self._exited = True
                self._done.notify_all()
            if not isinstance(message, Batch | Group):
                return

    def _wait_until(self, done: Callable[[], bool]) -> None:
        """Wait (holding ``self._done``) until ``done()``, or the worker failed or exited."""
        while not done() and self._failed is None and not self._exited:
            self._done.wait(_POLL_S)
            if not done() and not self._process.is_alive():
                self._done.wait(_POLL_S)  # let the reader take a last message
                self._exited = True

    def _wait(self, step: int) -> Batch:
        with self._done:
            self._wait_until(lambda: step in self._buffer)
            batch = self._buffer.pop(step, None)
        if batch is None:
            raise self._error(self._failed, f"while step {step + 1} waited for its rollouts")
        return batch

    def _check_running(self) -> None:
        if self._process is None:
            raise RuntimeError("the rollout worker is not running: use the runner in a 'with'")
        if self._failed is not None or self._exited:
            raise self._error(self._failed, "before the trainer asked for more")

    def _error(self, failure: Failed | None, when: str) -> RolloutWorkerError:
        if failure is None:
            process = self._process
            if process is not None:
                process.join(timeout=5)  # the pipe closes a moment before the exit is seen
            code = None if process is None else process.exitcode
            how = "was killed by a signal" if code is not None and code < 0 else "exited"
            return RolloutWorkerError(
                f"the rollout worker (pid {self.pid}) {how} (exit code {code}) {when}; "
                "the run stops (a worker that runs out of memory is killed this way)"
            )
        if failure.user_error:
            return RolloutWorkerError(f"the rollout worker stopped {when}: {failure.message}")
        return RolloutWorkerError(
            f"the rollout worker stopped {when} on {failure.kind}: {failure.message}\n"
            f"{failure.details}"
        )


def _clone_generator(generator: torch.Generator) -> torch.Generator:
    clone = torch.Generator(device=generator.device)
    clone.set_state(generator.get_state())
    return clone


__all__ = [
    "AsyncRolloutRunner",
    "RolloutWorkerError",
    "check_async_options",
]

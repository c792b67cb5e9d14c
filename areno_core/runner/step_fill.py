"""``--step-fill completion``: a step trains on the first groups to finish, whichever batch
they come from (the trainer's side of it; the worker sends each agentic group as soon as its
samples are done, see :class:`~areno_core.runner.worker.Group`).

With ``--step-fill batch`` (the default) step ``s`` trains on the groups of its own rows, so
one slow episode holds the whole step back. With ``completion`` the trainer keeps a pool of
finished groups, oldest first, and a step takes the first ``batch_size`` of them as soon as
there are that many (or fewer, when no admitted batch is still open). A straggler's group is
trained by a later step, under the same staleness bound as any sample.

:class:`CompletionFill` is the bookkeeping, with no process or thread of its own: which rows
were sent under which request key, which of their groups arrived, which were trained. Its
:meth:`CompletionFill.state_dict` is what a checkpoint needs so that a resumed run trains
every row once: the rows the loop had already passed whose groups were not trained yet
(*owed*: rolled out again after the resume) and, for the steps sent ahead, the rows whose
groups were trained already (*ahead*: not sent again). A resumed run keeps the saved run's
``--step-fill``, ``--async-rollout`` and ``--batch-size`` (options a resume may not change), so
the state is always read as it was written. Which tokens a resumed run samples for
an owed row can differ from what the interrupted run would have sampled: like every
completion-filled step, it depends on timing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from areno_core.types import TrajectoryGroup


@attrs.define
class Request:
    """What was sent under one request key (a step, or a negative key for owed rows)."""

    step: int
    """The step whose rows these are (for owed rows: the step they came from)."""
    indices: set[int]
    """The prompt indices sent (a step's, minus those trained before a resume)."""
    agent_seed: int | None
    arrived: set[int] = attrs.Factory(set)
    trained: set[int] = attrs.Factory(set)
    """Taken by a step (trained on, or dropped as too stale)."""
    closed: bool = False
    """The request's batch came back: no more groups will arrive."""

    def done(self) -> bool:
        return self.closed and self.arrived <= self.trained

    def owed(self) -> set[int]:
        """Rows sent whose groups were not taken yet: arrived and waiting, or still out."""
        waiting = self.arrived - self.trained
        return waiting if self.closed else waiting | (self.indices - self.arrived)


class CompletionFill:
    """The pool of finished groups and the record of what was sent (module docstring)."""

    def __init__(self, batch_size: int, resume: Mapping[str, Any] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.requests: dict[int, Request] = {}
        self.pool: list[tuple[int, TrajectoryGroup]] = []
        self.streamed: set[int] = set()
        """``id`` of the pooled groups that came one by one, before their batch was done."""
        self._closed_metrics: list[dict[str, float]] = []
        self._next_owed_key = -1
        state = resume or {}
        self.skip: dict[int, set[int]] = {
            int(step): {int(i) for i in indices} for step, indices in state.get("ahead", [])
        }
        """Prompt indices of steps not sent yet whose groups were trained before a resume."""
        self.resumed_owed: list[tuple[int, list[int], int | None]] = [
            (int(step), [int(i) for i in indices], None if seed is None else int(seed))
            for step, indices, seed in state.get("owed", [])
        ]
        """Rows to roll out again first, after a resume: (step, prompt indices, agent seed)."""

    # -- what was sent -----------------------------------------------------------------------

    def to_send(self, step: int, indices: Sequence[int]) -> list[int]:
        """Of step ``step``'s prompt indices, those to send (not trained before a resume)."""
        skip = self.skip.pop(step, set())
        return [i for i in indices if i not in skip]

    def sent(self, key: int, step: int, indices: Iterable[int], agent_seed: int | None) -> None:
        indices = set(indices)
        self.requests[key] = Request(step, indices, agent_seed, closed=not indices)

    def owed_key(self) -> int:
        """A fresh (negative) request key for owed rows."""
        key, self._next_owed_key = self._next_owed_key, self._next_owed_key - 1
        return key

    # -- what came back (the reader thread) ---------------------------------------------------

    def arrived(self, key: int, group: TrajectoryGroup, *, streamed: bool = True) -> None:
        """``group`` of request ``key`` finished (``streamed``: sent on its own, before its
        batch was done)."""
        request = self.requests[key]
        index = group.item.index
        if index not in request.indices or index in request.arrived:
            raise RuntimeError(f"request {key}: an unexpected group for prompt {index}")
        request.arrived.add(index)
        self.pool.append((key, group))
        if streamed:
            self.streamed.add(id(group))

    def closed(
        self, key: int, groups: Sequence[TrajectoryGroup], metrics: dict[str, float]
    ) -> None:
        for group in groups:
            self.arrived(key, group, streamed=False)
        self.requests[key].closed = True
        self._closed_metrics.append(metrics)

    # -- the step's side -----------------------------------------------------------------------

    def open(self) -> bool:
        return any(not r.closed for r in self.requests.values())

    def ready(self) -> bool:
        """Whether a step can take its groups now."""
        return len(self.pool) >= self.batch_size or not self.open()

    def take(
        self, step: int
    ) -> tuple[list[tuple[int, TrajectoryGroup]], list[dict[str, float]], int]:
        """For step ``step``: the oldest ``batch_size`` groups of the pool (with their request
        keys), the metrics of the batches that came back since the last take, and how many of
        the groups taken came on their own, before their batch was done."""
        taken, self.pool = self.pool[: self.batch_size], self.pool[self.batch_size :]
        streamed = 0
        for key, group in taken:
            self.requests[key].trained.add(group.item.index)
            if id(group) in self.streamed:
                self.streamed.discard(id(group))
                streamed += 1
        metrics, self._closed_metrics = self._closed_metrics, []
        # Forget the requests that are done, once the loop has passed their step: the record
        # of a later step's rows trained ahead must stay for a checkpoint.
        for key in [k for k, r in self.requests.items() if r.done() and r.step <= step]:
            del self.requests[key]
        return taken, metrics, streamed

    def state_dict(self, consumed: int) -> dict[str, Any]:
        """What a checkpoint taken once the loop has passed steps ``< consumed`` needs (see
        the module docstring). Plain values only."""
        owed: list[list[Any]] = [
            [step, list(indices), seed] for step, indices, seed in self.resumed_owed
        ]
        ahead: dict[int, set[int]] = {step: set(ix) for step, ix in self.skip.items()}
        for key, request in sorted(self.requests.items()):
            if key < 0 or request.step < consumed:
                missing = request.owed()
                if missing:
                    owed.append([request.step, sorted(missing), request.agent_seed])
            else:
                skipped = {
                    i
                    for i in range(
                        request.step * self.batch_size, (request.step + 1) * self.batch_size
                    )
                    if i not in request.indices
                }
                done = request.trained | skipped
                if done:
                    ahead[request.step] = done
        return {
            "owed": owed,
            "ahead": [[step, sorted(ix)] for step, ix in sorted(ahead.items())],
        }


__all__ = ["CompletionFill", "Request"]

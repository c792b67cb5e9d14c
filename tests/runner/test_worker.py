"""The rollout worker's serving loop, in this process (threads and a real pipe, no spawn)."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe
from types import SimpleNamespace

import pytest
import torch

from areno_core.rollout.weights import pack_weights
from areno_core.runner import worker
from areno_core.runner.worker import (
    Batch,
    Mailbox,
    PublishedWeights,
    Rollout,
    Stop,
    Weights,
    serve,
)
from areno_core.types import SamplingParams


class FakeEngine:
    def __init__(self) -> None:
        self.loaded: list[int] = []
        self.policy_version: int | None = None

    def sync_weights(self, state, *, version: int) -> None:
        assert set(state) == {"weight", "bias"}
        self.loaded.append(version)
        self.policy_version = version


class FakeRunner:
    """Records the weights version each batch was sampled with; ``during(step)`` runs while
    a batch is in flight."""

    def __init__(self, during=None) -> None:
        self.engine = FakeEngine()
        self.model = SimpleNamespace(optimizer_steps=0, rollout_generator=None)
        self.placement = SimpleNamespace(weights=PublishedWeights(None))
        self.sampling: SamplingParams | None = None
        self.sampled_with: list[tuple[int, int | None]] = []
        self.during = during

    def sync_weights(self, weights=None) -> None:  # as RolloutRunner's, without the LoRA path
        state = self.placement.weights() if weights is None else weights
        self.engine.sync_weights(state, version=self.model.optimizer_steps)

    def __call__(self, rows, step):
        self.sampled_with.append((step, self.engine.policy_version))
        if self.during is not None:
            self.during(step)
        return [], {"rollout/samples": float(len(rows))}


@pytest.fixture
def pipes():
    inbox_read, inbox_write = Pipe(duplex=False)
    outbox_read, outbox_write = Pipe(duplex=False)
    yield inbox_read, inbox_write, outbox_read, outbox_write
    for end in (inbox_read, inbox_write, outbox_read, outbox_write):
        end.close()


def weights(version: int) -> Weights:
    return Weights(version, pack_weights(torch.nn.Linear(2, 2)))


def request(step: int) -> Rollout:
    return Rollout(step, [{"prompt": "p"}], SamplingParams(seed=step))


def test_batch_in_flight_finishes_with_its_weights_and_the_next_takes_the_newest(pipes):
    inbox_read, inbox_write, outbox_read, outbox_write = pipes
    mailbox = Mailbox(inbox_read)

    def during(step: int) -> None:
        if step == 0:  # two updates arrive while batch 0 is being sampled
            inbox_write.send(weights(1))
            inbox_write.send(weights(2))
            deadline = time.monotonic() + 10
            while len(mailbox._messages) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)

    runner = FakeRunner(during)
    inbox_write.send(weights(0))
    inbox_write.send(request(0))
    server = threading.Thread(target=serve, args=(runner, mailbox, outbox_write))
    server.start()
    first = outbox_read.recv()
    inbox_write.send(request(1))
    second = outbox_read.recv()
    inbox_write.send(Stop())
    server.join(timeout=10)
    assert not server.is_alive()
    assert isinstance(first, Batch) and isinstance(second, Batch)
    assert (first.step, second.step) == (0, 1)
    # Batch 0 kept the weights it started with; version 1 was never loaded (2 was newer).
    assert runner.sampled_with == [(0, 0), (1, 2)]
    assert runner.engine.loaded == [0, 2]
    assert runner.model.optimizer_steps == 2
    assert runner.sampling == SamplingParams(seed=1)  # each batch brings its own seed
    assert first.metrics["time/weight_load"] >= 0.0
    assert first.metrics["rollout/samples"] == 1.0


def test_serve_returns_when_the_trainer_end_closes(pipes):
    inbox_read, inbox_write, _, outbox_write = pipes
    server = threading.Thread(target=serve, args=(FakeRunner(), Mailbox(inbox_read), outbox_write))
    server.start()
    inbox_write.close()
    server.join(timeout=10)
    assert not server.is_alive()


def test_rollout_before_any_weights_is_an_error(pipes):
    inbox_read, inbox_write, _, outbox_write = pipes
    inbox_write.send(request(0))
    with pytest.raises(RuntimeError, match="before any weights"):
        serve(FakeRunner(), Mailbox(inbox_read), outbox_write)


@pytest.mark.parametrize("error", [EOFError, OSError, TypeError])
def test_mailbox_takes_a_pipe_that_broke_in_any_way_as_closed(error):
    # TypeError is what Connection.recv raises when another thread closed it mid-read.
    class Broken:
        def recv(self):
            raise error("closed")

    mailbox = Mailbox(Broken())
    mailbox._thread.join(timeout=5)
    assert not mailbox._thread.is_alive()
    taken = mailbox.take(block=False)  # a reader that died on the error would leave nothing
    assert len(taken) == 1 and taken[0] is worker._CLOSED

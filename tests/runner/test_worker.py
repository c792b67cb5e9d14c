"""The rollout worker's serving loop, in this process (threads and a real pipe, no spawn)."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from areno_core.contracts.engine import EngineOptions
from areno_core.rollout.weights import pack_weights
from areno_core.runner import worker
from areno_core.runner.worker import (
    Batch,
    Group,
    Mailbox,
    PublishedWeights,
    Rollout,
    Stop,
    Weights,
    WorkerSpec,
    build_runner,
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
        self.sampled_with: list[tuple[int, int | None]] = []
        self.sampling_of: dict[int, SamplingParams] = {}
        self.generator_of: dict[int, torch.Generator | None] = {}
        self.indices_of: dict[int, tuple[int, ...] | None] = {}
        self.during = during

    def sync_weights(self, weights=None) -> None:  # as RolloutRunner's, without the LoRA path
        state = self.placement.weights() if weights is None else weights
        self.engine.sync_weights(state, version=self.model.optimizer_steps)

    def __call__(self, rows, step, *, sampling, generator, indices=None, on_group=None):
        self.sampled_with.append((step, self.engine.policy_version))
        self.sampling_of[step] = sampling
        self.generator_of[step] = generator
        self.indices_of[step] = indices
        if self.during is not None:
            self.during(step)
        if on_group is not None:  # the first row's group is done early; the rest return
            on_group(f"group of {rows[0]['prompt']}")
            return [f"group of {row['prompt']}" for row in rows[1:]], {"rollout/samples": 1.0}
        return [], {"rollout/samples": float(len(rows))}


@pytest.fixture
def pipes():
    inbox_read, inbox_write = Pipe(duplex=False)
    outbox_read, outbox_write = Pipe(duplex=False)
    yield inbox_read, inbox_write, outbox_read, outbox_write
    close_pipes(inbox_read, inbox_write, outbox_read, outbox_write)


def close_pipes(inbox_read, inbox_write, outbox_read, outbox_write) -> None:
    """Close a serving loop's pipes without leaving its mailbox thread a descriptor to reuse.

    Writers first: a mailbox thread still reading the inbox then sees the end and stops. Only
    then the readers: a thread that read a closed descriptor would read the next pipe opened
    under the same number (the next test's, or the next call's in the same test) and steal its
    messages; the serving loop reading the rest then sees a broken message, takes it for a
    closed pipe and returns, and the test waits for a batch that never comes. Closing the four
    ends in one go did that under pytest-xdist in about one run of tests/runner in three.
    """
    inbox_write.close()
    outbox_write.close()
    for thread in threading.enumerate():
        # The mailbox thread of this inbox only (its target is the Mailbox's bound _read):
        # other tests' leftover mailboxes read other pipes and need not end now.
        mailbox = getattr(getattr(thread, "_target", None), "__self__", None)
        if thread.name == "areno-mailbox" and getattr(mailbox, "_connection", None) is inbox_read:
            thread.join(timeout=10)
            assert not thread.is_alive(), "the mailbox thread did not see its inbox close"
    inbox_read.close()
    outbox_read.close()


def receive(connection, timeout: float = 60.0):
    """The next message on ``connection``, or a failure after ``timeout`` seconds: a message
    that never comes fails the test instead of hanging the suite (see :func:`close_pipes`
    for the one way that happened)."""
    assert connection.poll(timeout), f"no message from the serving loop within {timeout:g} s"
    return connection.recv()


def weights(version: int) -> Weights:
    return Weights(version, pack_weights(torch.nn.Linear(2, 2)))


def request(step: int) -> Rollout:
    return Rollout(step, [{"prompt": "p"}], SamplingParams(seed=step))


def test_batch_in_flight_finishes_with_its_weights_and_the_next_takes_the_newest(pipes):
    inbox_read, inbox_write, outbox_read, outbox_write = pipes
    mailbox = Mailbox(inbox_read)
    taken: list = []
    take = mailbox.take

    def recording_take(*, block: bool) -> list:
        messages = take(block=block)
        taken.extend(messages)
        return messages

    mailbox.take = recording_take

    def during(step: int) -> None:
        if step == 0:  # two updates reach the serving loop while batch 0 is being sampled
            inbox_write.send(weights(1))
            inbox_write.send(weights(2))
            deadline = time.monotonic() + 10
            while sum(isinstance(m, Weights) for m in taken) < 3:
                assert time.monotonic() < deadline, "the updates never arrived"
                time.sleep(0.01)

    runner = FakeRunner(during)
    inbox_write.send(weights(0))
    inbox_write.send(request(0))
    server = threading.Thread(target=serve, args=(runner, mailbox, outbox_write))
    server.start()
    first = receive(outbox_read)
    inbox_write.send(request(1))
    second = receive(outbox_read)
    inbox_write.send(Stop())
    server.join(timeout=10)
    assert not server.is_alive()
    assert isinstance(first, Batch) and isinstance(second, Batch)
    assert (first.step, second.step) == (0, 1)
    # Batch 0 kept the weights it started with; version 1 was never loaded (2 was newer).
    assert runner.sampled_with == [(0, 0), (1, 2)]
    assert runner.engine.loaded == [0, 2]
    assert runner.model.optimizer_steps == 2
    # Each batch brings its own seed, passed to its call (the runner holds none).
    assert runner.sampling_of == {0: SamplingParams(seed=0), 1: SamplingParams(seed=1)}
    assert runner.generator_of == {0: None, 1: None}  # not agentic: no agent seed
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


# -- several agentic batches in flight (--max-inflight-batches) --------------------------------


class GatedRunner(FakeRunner):
    """Each batch runs until its step's gate opens; tracks how many run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[int, threading.Event] = {}
        self.started: dict[int, threading.Event] = {}
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0

    def gate(self, step: int) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(step, threading.Event())

    def began(self, step: int) -> threading.Event:
        with self.lock:
            return self.started.setdefault(step, threading.Event())

    def __call__(self, rows, step, *, sampling, generator, **options):
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        self.began(step).set()
        groups, metrics = super().__call__(
            rows, step, sampling=sampling, generator=generator, **options
        )
        assert self.gate(step).wait(10), f"batch {step} was never released"
        with self.lock:
            self.running -= 1
        return groups, metrics


def agentic(step: int) -> Rollout:
    return Rollout(step, [{"prompt": "p"}], SamplingParams(), agent_seed=100 + step)


def start_serving(runner, inbox_read, outbox_write, bound: int) -> threading.Thread:
    server = threading.Thread(
        target=serve,
        args=(runner, Mailbox(inbox_read), outbox_write),
        kwargs={"max_inflight": bound},
        daemon=True,
    )
    server.start()
    return server


def stop(server: threading.Thread, inbox_write) -> None:
    inbox_write.send(Stop())
    server.join(timeout=10)
    assert not server.is_alive()


def test_weights_arriving_while_two_batches_are_in_flight_wait_for_both(pipes):
    inbox_read, inbox_write, outbox_read, outbox_write = pipes
    runner = GatedRunner()
    for message in (weights(0), agentic(0), agentic(1)):
        inbox_write.send(message)
    server = start_serving(runner, inbox_read, outbox_write, bound=2)
    assert runner.began(0).wait(10) and runner.began(1).wait(10)  # both run with version 0
    inbox_write.send(weights(1))
    inbox_write.send(agentic(2))
    time.sleep(0.2)
    assert runner.engine.loaded == [0] and not runner.began(2).is_set()
    runner.gate(0).set()
    assert receive(outbox_read).step == 0
    time.sleep(0.2)  # one batch still samples with version 0: nothing loads, nothing starts
    assert runner.engine.loaded == [0] and not runner.began(2).is_set()
    runner.gate(1).set()
    last = receive(outbox_read)
    assert last.step == 1
    assert runner.began(2).wait(10)
    runner.gate(2).set()
    third = receive(outbox_read)
    stop(server, inbox_write)
    assert runner.sampled_with == [(0, 0), (1, 0), (2, 1)]
    assert runner.engine.loaded == [0, 1]
    assert third.metrics["time/weight_drain"] >= 0.2  # version 1 waited for batches 0 and 1
    # Each batch got a generator of its own, seeded with its own agent seed.
    generators = runner.generator_of
    assert len({id(g) for g in generators.values()}) == 3
    for step, generator in generators.items():
        expected = torch.Generator().manual_seed(100 + step)
        assert torch.equal(generator.get_state(), expected.get_state())


def test_never_more_batches_in_flight_than_the_bound(pipes):
    inbox_read, inbox_write, outbox_read, outbox_write = pipes
    runner = GatedRunner()
    inbox_write.send(weights(0))
    for step in range(5):
        inbox_write.send(agentic(step))
    server = start_serving(runner, inbox_read, outbox_write, bound=2)
    done = []
    for step in range(5):
        assert runner.began(step).wait(10)
        time.sleep(0.05)  # room for a third batch to start, were the bound not kept
        assert runner.running <= 2
        runner.gate(step).set()
        done.append(receive(outbox_read))
    stop(server, inbox_write)
    assert runner.most_running == 2
    assert [b.step for b in done] == [0, 1, 2, 3, 4]
    # The first batch started alone; every later one beside the one before it.
    assert [b.metrics["rollout/inflight_batches"] for b in done] == [1.0, 2.0, 2.0, 2.0, 2.0]


def test_a_batch_that_finishes_first_goes_to_the_trainer_first(pipes):
    inbox_read, inbox_write, outbox_read, outbox_write = pipes
    runner = GatedRunner()
    for message in (weights(0), agentic(0), agentic(1)):
        inbox_write.send(message)
    server = start_serving(runner, inbox_read, outbox_write, bound=2)
    assert runner.began(0).wait(10) and runner.began(1).wait(10)
    runner.gate(1).set()  # batch 0 straggles
    first = receive(outbox_read)
    runner.gate(0).set()
    second = receive(outbox_read)
    stop(server, inbox_write)
    assert (first.step, second.step) == (1, 0)


def test_one_batch_in_flight_at_a_time_with_a_bound_of_one(pipes):
    inbox_read, inbox_write, outbox_read, outbox_write = pipes
    runner = GatedRunner()
    for message in (weights(0), agentic(0), agentic(1)):
        inbox_write.send(message)
    server = start_serving(runner, inbox_read, outbox_write, bound=1)
    assert runner.began(0).wait(10)
    time.sleep(0.2)
    assert not runner.began(1).is_set()
    runner.gate(0).set()
    runner.gate(1).set()
    done = [receive(outbox_read) for _ in range(2)]
    stop(server, inbox_write)
    assert [b.step for b in done] == [0, 1] and runner.most_running == 1
    assert all("rollout/inflight_batches" not in b.metrics for b in done)  # no overlap to show


def test_a_failing_batch_ends_serving_with_its_error(pipes):
    inbox_read, inbox_write, _, outbox_write = pipes

    def during(step: int) -> None:
        raise KeyError(f"batch {step} broke")

    inbox_write.send(weights(0))
    inbox_write.send(agentic(0))
    with pytest.raises(KeyError, match="batch 0 broke"):
        serve(FakeRunner(during), Mailbox(inbox_read), outbox_write, max_inflight=2)


def test_a_bound_below_one_is_refused(pipes):
    inbox_read, _, _, outbox_write = pipes
    with pytest.raises(ValueError, match="max_inflight must be at least 1, got 0"):
        serve(FakeRunner(), Mailbox(inbox_read), outbox_write, max_inflight=0)


# -- the real rollout side: overlap changes nothing a batch samples ------------------------------

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _real_runner() -> object:
    spec = WorkerSpec(
        ckpt="random:qwen3-tiny",
        device="cpu",
        engine="native",
        engine_options=EngineOptions(),
        engine_config={},
        sampling=SamplingParams(max_new_tokens=6),
        n_samples=2,
        batch_size=2,
        reward_fn=str(FIXTURES / "digit_share_reward.py"),
        agent_fn=str(FIXTURES / "seeded_agent.py"),
        agent_options={"timeout_s": 60.0},
        threads=1,
    )
    return build_runner(spec)


def _serve_batches(runner, bound: int, policy: torch.nn.Module) -> dict[int, Batch]:
    """Serve batches 0 and 1 (both with version 0, released together) at ``bound``."""
    inbox_read, inbox_write = Pipe(duplex=False)
    outbox_read, outbox_write = Pipe(duplex=False)
    rows = [[{"prompt": "Add 2 and 3."}, {"prompt": "Name a prime."}],
            [{"prompt": "Count to four."}, {"prompt": "Say 12."}]]  # fmt: skip
    inbox_write.send(Weights(0, pack_weights(policy)))
    for step in (0, 1):
        inbox_write.send(Rollout(step, rows[step], SamplingParams(max_new_tokens=6), 7 + step))
    server = start_serving(runner, inbox_read, outbox_write, bound=bound)
    batches = {}
    for _ in range(2):
        batch = receive(outbox_read)
        batches[batch.step] = batch
    stop(server, inbox_write)
    close_pipes(inbox_read, inbox_write, outbox_read, outbox_write)
    return batches


def _content(batch: Batch) -> list[tuple]:
    return [
        (t.prompt_index, t.sample_index, t.input_ids, t.rollout_logprobs, t.reward)
        for g in batch.groups
        for t in g.trajectories
    ]


@pytest.mark.usefixtures("installed_plugins_only")
def test_agentic_batches_in_flight_together_sample_what_they_do_one_at_a_time():
    threads = torch.get_num_threads()
    try:
        runner = _real_runner()
        policy = runner.placement.policy
        alone = _serve_batches(runner, 1, policy)
        together = _serve_batches(runner, 2, policy)
    finally:
        torch.set_num_threads(threads)
    assert together[1].metrics["rollout/inflight_batches"] == 2.0  # they did overlap
    for step in (0, 1):
        assert _content(alone[step]), "the agent produced no rows"
        assert _content(together[step]) == _content(alone[step])
        assert together[step].metrics["rollout/samples"] == 4.0


def test_a_streaming_request_sends_its_early_groups_before_its_batch(pipes):
    inbox_read, inbox_write, outbox_read, outbox_write = pipes
    runner = FakeRunner()
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    owed = Rollout(-1, rows, SamplingParams(), agent_seed=7, indices=(12, 15), stream=True)
    for message in (weights(0), owed, request(0)):
        inbox_write.send(message)
    server = start_serving(runner, inbox_read, outbox_write, bound=1)
    first, second, third = receive(outbox_read), receive(outbox_read), receive(outbox_read)
    stop(server, inbox_write)
    assert isinstance(first, Group) and (first.step, first.group) == (-1, "group of a")
    assert isinstance(second, Batch) and (second.step, second.groups) == (-1, ["group of b"])
    # A request without ``stream`` sends its batch only; indices reach the runner as sent.
    assert isinstance(third, Batch) and third.step == 0
    assert runner.indices_of == {-1: (12, 15), 0: None}


@pytest.mark.usefixtures("installed_plugins_only")
def test_a_streamed_batch_sends_what_the_same_batch_sends_whole(monkeypatch):
    # Prompt index 20's first sample waits 1 s (the seeded agent's straggler), so prompt
    # 21's group is done first and leaves on its own.
    monkeypatch.setenv("SEEDED_AGENT_SLOW_EVERY", "4")
    monkeypatch.setenv("SEEDED_AGENT_SLOW_S", "1.0")
    threads = torch.get_num_threads()
    try:
        runner = _real_runner()
        inbox_read, inbox_write = Pipe(duplex=False)
        outbox_read, outbox_write = Pipe(duplex=False)
        rows = [{"prompt": "Add 2 and 3."}, {"prompt": "Name a prime."}]
        sampling = SamplingParams(max_new_tokens=6)
        inbox_write.send(Weights(0, pack_weights(runner.placement.policy)))
        # The same rows, prompt indices and seed: once whole, then (the agent's imports warm,
        # so only the straggler takes time) handed on group by group.
        inbox_write.send(Rollout(0, rows, sampling, 7, indices=(20, 21)))
        inbox_write.send(Rollout(1, rows, sampling, 7, indices=(20, 21), stream=True))
        server = start_serving(runner, inbox_read, outbox_write, bound=1)
        messages = []
        while sum(isinstance(m, Batch) for m in messages) < 2:
            messages.append(receive(outbox_read))
        stop(server, inbox_write)
        close_pipes(inbox_read, inbox_write, outbox_read, outbox_write)
    finally:
        torch.set_num_threads(threads)
    early = [m for m in messages if isinstance(m, Group)]
    whole, streamed = (next(m for m in messages if isinstance(m, Batch) and m.step == s)
                       for s in (0, 1))  # fmt: skip
    assert [(m.step, m.group.item.index) for m in early] == [(1, 21)]
    assert messages.index(early[0]) < messages.index(streamed)  # before its batch
    assert [g.item.index for g in streamed.groups] == [20]
    handed = Batch(1, [early[0].group, *streamed.groups], {})
    assert sorted(_content(handed)) == sorted(_content(whole))
    assert {t.policy_version for g in handed.groups for t in g.trajectories} == {0}
    assert streamed.metrics["rollout/samples"] == whole.metrics["rollout/samples"] == 4.0
    assert streamed.metrics["rollout/reward_mean"] == whole.metrics["rollout/reward_mean"]

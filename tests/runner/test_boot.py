"""The ``--async-rollout`` worker started before the run loaded anything (runner.boot): it
waits for its spec, stops cleanly when the run ends before needing it, and once taken over by
the runner samples exactly what a worker the runner spawned itself samples."""

from __future__ import annotations

import signal
import time
from multiprocessing import Pipe
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest
import torch

from areno_core.data.stream import DataStream
from areno_core.model import TrainableModel
from areno_core.runner.async_rollout import AsyncRolloutRunner, RolloutWorkerError
from areno_core.runner.boot import WorkerProcess, boot_main
from tests.runner.test_async_rollout import SPEC

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

# A reward the spawned worker can load (a registered test reward lives in this process only).
REWARD = Path(__file__).resolve().parent.parent / "fixtures" / "digit_share_reward.py"


def test_an_early_worker_the_run_never_needed_stops_when_closed():
    early = WorkerProcess.spawn()
    process = early.process
    assert early.running
    started = time.monotonic()
    early.close()
    assert not process.is_alive() and process.exitcode is not None
    assert time.monotonic() - started < 30
    assert not early.running
    early.close()  # twice is harmless


def test_a_worker_sent_anything_but_its_spec_refuses_it():
    inbox, to_worker = Pipe(duplex=False)
    _, outbox = Pipe(duplex=False)
    to_worker.send("not a spec")
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(TypeError, match="expected its WorkerSpec first, got 'not a spec'"):
            boot_main(inbox, outbox)
    finally:
        signal.signal(signal.SIGINT, handler)


def _first_batch(process: WorkerProcess | None) -> list[list[float]]:
    torch.manual_seed(0)
    model = TrainableModel.from_ckpt(SPEC.ckpt, seed=0)
    model.rollout_generator.manual_seed(7)
    stream = DataStream([{"prompt": f"{i}+{i}="} for i in range(4)], 2, seed=0, epochs=1)
    spec = attrs.evolve(SPEC, reward_fn=str(REWARD))
    runner = AsyncRolloutRunner(model, stream, spec, max_staleness=0, max_steps=1, process=process)
    with runner:
        rows = stream.next_batch()
        groups, metrics = runner(rows, 0)
    assert metrics["rollout/stale_dropped"] == 0.0
    return [t.input_ids + t.rollout_logprobs for g in groups for t in g.trajectories]


def test_a_worker_taken_over_samples_what_a_freshly_spawned_one_samples():
    early = WorkerProcess.spawn()
    try:
        taken_over = _first_batch(early)
    finally:
        early.close()
    assert early.process is None  # the runner took it over (and stopped it)
    assert taken_over == _first_batch(None)
    assert len(taken_over) == SPEC.batch_size * SPEC.n_samples


def test_an_early_worker_that_died_ends_the_run_with_a_clear_error():
    early = WorkerProcess.spawn()
    early.process.kill()
    early.process.join(timeout=10)
    fake = SimpleNamespace(step=0, optimizer_steps=0, rollout_generator=torch.Generator())
    stream = DataStream([{"prompt": "1+1="}], 1, seed=0, epochs=1)
    run = AsyncRolloutRunner(fake, stream, SPEC, max_staleness=1, max_steps=1, process=early)
    with pytest.raises(RolloutWorkerError, match=r"was killed by a signal \(exit code -9\)"):
        run.start()
    assert run._process is None  # stopped and released, nothing left half-open
    assert early.process is None

"""The trainer side of --async-rollout without a worker process: option checks, the staleness
filter, and the look-ahead that keeps data and seeds as a synchronous run has them."""

from __future__ import annotations

import copy
import threading
from multiprocessing import Pipe
from types import SimpleNamespace

import attrs
import pytest
import torch

from areno_core.config import build_config
from areno_core.contracts.engine import EngineOptions
from areno_core.data.stream import DataStream
from areno_core.errors import ConfigError
from areno_core.registry import get_registry
from areno_core.rollout.sampling import seeded
from areno_core.runner.async_rollout import AsyncRolloutRunner, check_async_options
from areno_core.runner.worker import Batch, Group, WorkerSpec
from areno_core.types import PromptItem, SamplingParams, Trajectory, TrajectoryGroup

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

SPEC = WorkerSpec(
    ckpt="random:qwen3-tiny",
    device="cpu",
    engine="native",
    engine_options=EngineOptions(),
    engine_config={},
    sampling=SamplingParams(max_new_tokens=4),
    n_samples=2,
    batch_size=2,
    reward_fn="always_one",
)


def runner(max_staleness: int = 1, **model: object) -> AsyncRolloutRunner:
    fake = SimpleNamespace(
        step=0, optimizer_steps=0, rollout_generator=torch.Generator().manual_seed(5), **model
    )
    stream = DataStream([{"prompt": str(i)} for i in range(6)], 2, seed=0, epochs=2)
    return AsyncRolloutRunner(
        fake,
        stream,
        SPEC,
        max_staleness=max_staleness,
        max_steps=6,  # type: ignore[arg-type]
    )


def group(index: int, version: int) -> TrajectoryGroup:
    trajectories = [
        Trajectory([1, 2], [0, 1], [0.0, -1.0], prompt_index=index, sample_index=s,
                   policy_version=version)
        for s in range(2)
    ]  # fmt: skip
    return TrajectoryGroup(PromptItem(index=index, row={}, prompt="p"), trajectories)


def test_samples_more_than_max_staleness_versions_old_are_dropped_and_counted():
    run = runner(max_staleness=1)
    run._published = [0, 4, 8]  # three policy versions; the trainer is at 8
    batch = Batch(3, [group(0, 8), group(1, 4), group(2, 0)], {"rollout/samples": 6.0})
    kept, metrics = run._fresh(batch)
    assert [g.item.index for g in kept] == [0, 1]
    assert metrics["rollout/stale_dropped"] == 2.0  # the two samples of version 0
    assert metrics["rollout/staleness_max"] == 1.0
    assert metrics["rollout/staleness_mean"] == 0.5


def test_samples_of_an_unpublished_version_are_a_bug_not_data():
    run = runner()
    run._published = [0]
    with pytest.raises(RuntimeError, match=r"never published: \{3\}"):
        run._fresh(Batch(0, [group(0, 3)], {}))


def test_look_ahead_draws_the_rows_and_seeds_a_synchronous_run_would_use():
    run = runner(max_staleness=2)
    rows = [run._rows_ahead.next_batch() for _ in range(3)]
    requests = [run._request(step, r) for step, r in enumerate(rows)]
    sync_stream = copy.copy(run.stream)
    sync_generator = torch.Generator().manual_seed(5)
    for step, request in enumerate(requests):
        assert request.rows == sync_stream.next_batch()
        assert request.sampling == seeded(SPEC.sampling, sync_generator)
        assert request.step == step and request.agent_seed is None
    # The run's own stream and generator have not moved: only consumed steps advance them.
    assert run.stream.offset == 0 and run.stream.epoch == 0
    assert torch.equal(run.model.rollout_generator.get_state(),
                       torch.Generator().manual_seed(5).get_state())  # fmt: skip
    run._consume_seed(requests[0])
    sync_generator = torch.Generator().manual_seed(5)
    seeded(SPEC.sampling, sync_generator)
    assert torch.equal(run.model.rollout_generator.get_state(), sync_generator.get_state())


def test_negative_staleness_is_refused():
    with pytest.raises(ValueError, match="max_staleness must be >= 0, got -1"):
        runner(max_staleness=-1)


def test_runner_outside_its_with_block_says_so():
    with pytest.raises(RuntimeError, match="use the runner in a 'with'"):
        runner().sync_weights()


def _check(options: dict, algo: str = "grpo", explicit: set | None = None) -> None:
    registry = get_registry()
    cfg = build_config(options, table=registry.options)
    check_async_options(cfg, registry.algorithm(algo), explicit or set(options))


def test_async_options_without_async_rollout_are_refused():
    with pytest.raises(ConfigError, match="--max-staleness applies to asynchronous rollout"):
        _check({"max_staleness": 2})
    with pytest.raises(ConfigError, match="--proximal-logprobs, --rollout-threads applies"):
        _check({"rollout_threads": 1, "proximal_logprobs": "interpolate"})


def test_max_inflight_batches_needs_async_rollout_and_an_agent():
    with pytest.raises(ConfigError, match="--max-inflight-batches applies to asynchronous"):
        _check({"max_inflight_batches": 3})
    with pytest.raises(ConfigError, match="--max-inflight-batches 3 overlaps agentic batches"):
        _check({"async_rollout": True, "max_inflight_batches": 3})
    _check({"async_rollout": True, "max_inflight_batches": 3, "agent_fn": "agent.py"})
    _check({"async_rollout": True})  # the default applies to agentic runs only: no error
    with pytest.raises(ConfigError, match="--max-inflight-batches must be positive, got 0"):
        _check({"async_rollout": True, "max_inflight_batches": 0, "agent_fn": "agent.py"})


def test_async_rollout_with_an_offline_algorithm_is_refused():
    with pytest.raises(ConfigError, match="--algo sft trains on dataset rows and has no rollout"):
        _check({"async_rollout": True}, algo="sft")


def test_stale_samples_need_an_algorithm_with_the_decoupled_objective(monkeypatch):
    registry = get_registry()
    plain = attrs.evolve(registry.algorithm("grpo"), decoupled=False)
    cfg = build_config({"async_rollout": True}, table=registry.options)
    with pytest.raises(ConfigError, match="does not declare the decoupled objective"):
        check_async_options(cfg, plain, {"async_rollout"})
    cfg = build_config({"async_rollout": True, "max_staleness": 0}, table=registry.options)
    check_async_options(cfg, plain, {"async_rollout", "max_staleness"})  # K = 0 is on-policy


def test_async_rollout_with_several_training_processes_is_refused():
    with pytest.raises(ConfigError, match="--world-size 2 is not supported with it yet"):
        _check({"async_rollout": True, "world_size": 2})
    _check({"async_rollout": True, "world_size": 1})  # one process: accepted


def test_batches_arriving_out_of_step_order_wait_in_the_buffer_for_their_step():
    run = runner()
    run._from_worker, worker_end = Pipe(duplex=False)
    run._process = SimpleNamespace(is_alive=lambda: True, pid=1)
    run._reader = threading.Thread(target=run._read, daemon=True)
    run._reader.start()
    worker_end.send(Batch(1, [group(1, 0)], {}))  # a straggler held batch 0 back
    worker_end.send(Batch(0, [group(0, 0)], {}))
    assert run._wait(0).step == 0
    assert list(run._buffer) == [1]
    assert run._wait(1).groups[0].item.index == 1
    worker_end.close()
    run._reader.join(timeout=5)
    run._from_worker.close()


# -- --step-fill completion ------------------------------------------------------------------


class Outbox:
    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, message: object) -> None:
        self.sent.append(message)


def test_completion_fill_resumes_owed_rows_first_skips_rows_trained_ahead_and_fills_by_arrival():
    rows = [{"prompt": str(i)} for i in range(6)]
    stream = DataStream(rows, 2, seed=0, epochs=2)
    stream.load_state_dict({"epoch": 0, "offset": 2})  # resumed after step 0 (of 6)
    model = SimpleNamespace(
        step=1,
        optimizer_steps=1,
        rollout_generator=torch.Generator().manual_seed(5),
        policy=torch.nn.Linear(2, 2),
    )
    resume = {"fill": {"owed": [[0, [1], 77], [0, [0], 77]], "ahead": [[1, [3]]]}}
    run = AsyncRolloutRunner(
        model, stream, SPEC, max_staleness=1, max_steps=6, agentic=True,
        step_fill="completion", resume_state=resume,
    )  # type: ignore[arg-type]  # fmt: skip
    run._process = SimpleNamespace(is_alive=lambda: True, pid=1)
    run._to_worker = outbox = Outbox()
    run.sync_weights()
    owed, other, step1, step2 = outbox.sent[1:]
    assert (other.step, other.indices) == (-2, (0,))
    # The owed row (prompt 1 of step 0) goes first, under a key of its own and its old seed.
    assert (owed.step, owed.indices, owed.agent_seed, owed.stream) == (-1, (1,), 77, True)
    assert owed.rows == [stream.batch_at(0)[1]]
    # Step 1 without prompt 3, trained before the resume; step 2 whole.
    assert (step1.step, step1.indices, step1.rows) == (1, (2,), [stream.batch_at(1)[0]])
    assert (step2.step, step2.indices, len(step2.rows), step2.stream) == (2, None, 2, True)

    run._published = [1]
    run._from_worker, worker_end = Pipe(duplex=False)
    run._reader = threading.Thread(target=run._read, daemon=True)
    run._reader.start()
    # Prompt 0's samples all failed: its batch comes back empty (first, so that the step,
    # which takes its groups once two are in, sees it).
    worker_end.send(Batch(-2, [], {"rollout/agent_errors": 2.0, "rollout/inflight_batches": 1.0,
                                   "memory/rollout_state_mib": 5.0}))  # fmt: skip
    worker_end.send(Group(2, group(4, 1)))  # step 2's first group finishes first
    worker_end.send(Batch(-1, [group(1, 1)], {"rollout/agent_errors": 1.0,
                                              "rollout/inflight_batches": 2.0,
                                              "memory/rollout_state_mib": 3.0}))  # fmt: skip
    groups, metrics = run(stream.next_batch(), 1)
    assert [g.item.index for g in groups] == [4, 1]
    assert metrics["rollout/groups_early"] == 1.0 and metrics["rollout/groups_late"] == 1.0
    # The batches that came back meanwhile: counts add up, the rest is the largest.
    assert metrics["rollout/agent_errors"] == 3.0
    assert metrics["rollout/inflight_batches"] == 2.0
    assert metrics["memory/rollout_state_mib"] == 5.0
    assert metrics["rollout/groups_streamed"] == 1.0  # prompt 4's group, before its batch
    assert metrics["rollout/samples"] == 4.0 and metrics["rollout/stale_dropped"] == 0.0
    # Saved after the step: prompt 2 (step 1, passed) is owed; step 2 had prompt 4 trained
    # ahead (and step 1's prompt 3, trained before the resume, is no longer a later step's).
    model.step = 2
    assert run.state_dict() == {"fill": {"owed": [[1, [2], step1.agent_seed]],
                                         "ahead": [[2, [4]]]}}  # fmt: skip
    worker_end.close()
    run._reader.join(timeout=5)
    run._from_worker.close()


def test_completion_fill_needs_an_agentic_run():
    with pytest.raises(ValueError, match="needs agentic rollout"):
        AsyncRolloutRunner(
            SimpleNamespace(step=0, rollout_generator=torch.Generator()),
            DataStream([{}], 1, seed=0, epochs=1), SPEC, max_staleness=1, max_steps=1,
            step_fill="completion",
        )  # type: ignore[arg-type]  # fmt: skip


def test_step_fill_completion_needs_an_agent_and_room_for_rows_sent_ahead():
    agent = {"async_rollout": True, "agent_fn": "agent.py", "step_fill": "completion"}
    with pytest.raises(ConfigError, match="--step-fill completion .* needs --agent-fn"):
        _check({"async_rollout": True, "step_fill": "completion"}, explicit={"step_fill"})
    with pytest.raises(ConfigError, match="--max-staleness 0 does not allow"):
        _check({**agent, "max_staleness": 0}, explicit={"step_fill"})
    with pytest.raises(ConfigError, match="--step-fill applies to asynchronous rollout"):
        _check({"step_fill": "completion"}, explicit={"step_fill"})
    _check({**agent, "max_inflight_batches": 2}, explicit={"step_fill"})


def test_step_fill_completion_with_one_batch_in_flight_says_it_gains_nothing(caplog):
    options = {"async_rollout": True, "agent_fn": "agent.py", "step_fill": "completion"}
    with caplog.at_level("WARNING", logger="areno"):
        _check(options, explicit={"step_fill"})
    assert "--step-fill completion with --max-inflight-batches 1" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="areno"):
        _check({**options, "max_inflight_batches": 2}, explicit={"step_fill"})
    assert "--step-fill" not in caplog.text

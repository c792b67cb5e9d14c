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
from areno_core.runner.worker import Batch, WorkerSpec
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

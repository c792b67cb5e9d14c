"""The rollout runner: one engine per run, kept in step with the policy by sync_weights, used
for training rollouts and evaluation alike, always inside a rollout session."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from areno_core.contracts.engine import EngineOptions, WeightsNotHeldError
from areno_core.model import TrainableModel
from areno_core.rollout.native import NativeEngine
from areno_core.rollout.placement import RolloutPlacement, share_bounds
from areno_core.runner.rollout import RolloutRunner
from areno_core.types import SamplingParams


class RecordingEngine(NativeEngine):
    """The native engine, recording the calls the runner makes."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        super().__init__(model, tokenizer, EngineOptions(attn_backend="native"))
        self.calls: list[tuple[str, Any]] = []

    def start_session(self) -> None:
        self.calls.append(("start", None))
        super().start_session()

    def end_session(self, *, drop_state: bool = False) -> None:
        self.calls.append(("end", drop_state))
        super().end_session(drop_state=drop_state)

    def sync_weights(self, weights: Any, *, version: int) -> None:
        self.calls.append(("sync", version))
        super().sync_weights(weights, version=version)

    def generate(self, prompts: Any, sampling: SamplingParams, *, n: int = 1) -> Any:
        self.calls.append(("generate", sampling.seed))
        return super().generate(prompts, sampling, n=n)


@pytest.fixture
def runner() -> RolloutRunner:
    model = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)
    engine = RecordingEngine(model.policy, model.tokenizer)
    return RolloutRunner(
        model,
        engine,
        sampling=SamplingParams(max_new_tokens=3),
        n_samples=2,
        reward_fn=lambda record: float(len(record.token_ids)),
        batch_size=2,
        drop_state=True,
    )


ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


def test_sync_weights_only_when_the_policy_version_moved(runner):
    engine = runner.engine
    runner.sync_weights()
    runner.sync_weights()
    runner.model.optimizer_steps = 3
    runner.sync_weights()
    assert [c for c in engine.calls if c[0] == "sync"] == [("sync", 0), ("sync", 3)]
    assert engine.policy_version == 3


def test_step_runs_in_a_session_with_a_seed_from_the_run_generator(runner):
    expected_seed = int(
        torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(1)).item()
    )  # the rollout generator of a model loaded with seed 0 is seeded with 1
    runner.model.optimizer_steps = 2
    runner.sync_weights()
    groups, metrics = runner(ROWS, step=0)
    kinds = [c[0] for c in runner.engine.calls]
    assert kinds == ["sync", "start", "generate", "end"]
    assert runner.engine.calls[2] == ("generate", expected_seed)
    assert runner.engine.calls[3] == ("end", True)
    assert [len(g.trajectories) for g in groups] == [2, 2]
    assert {t.policy_version for g in groups for t in g.trajectories} == {2}
    assert metrics["rollout/policy_version"] == 2.0 and metrics["rollout/policy_lag"] == 0.0


def test_evaluator_uses_the_same_engine_synced_and_greedy(runner):
    evaluate = runner.evaluator(ROWS, max_new_tokens=2)
    runner.model.optimizer_steps = 5
    before = runner.model.rollout_generator.get_state()
    metrics = evaluate()
    calls = runner.engine.calls
    assert calls[0] == ("sync", 5)
    assert calls[1:] == [("start", None), ("generate", 0), ("end", True)]  # greedy: seed 0
    assert set(metrics) >= {"eval/accuracy", "eval/reward_mean", "time/eval"}
    # greedy evaluation draws nothing from the run's random streams
    assert torch.equal(runner.model.rollout_generator.get_state(), before)


# -- several processes -------------------------------------------------------------------------


def test_share_bounds_are_contiguous_balanced_and_cover_every_prompt():
    assert [share_bounds(10, r, 3) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [share_bounds(1, r, 2) for r in range(2)] == [(0, 1), (1, 1)]
    assert share_bounds(5, 0, 1) == (0, 5)


def _runner(placement: RolloutPlacement | None = None, *, forgetful: bool = False) -> RolloutRunner:
    model = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)
    engine = (
        ForgetfulEngine(model.policy, model.tokenizer)
        if forgetful
        else NativeEngine(model.policy, model.tokenizer, EngineOptions(attn_backend="native"))
    )
    return RolloutRunner(
        model,
        engine,
        sampling=SamplingParams(max_new_tokens=6, temperature=1.0),
        n_samples=3,
        reward_fn=lambda record: float(record.completion.count("1")),
        batch_size=4,
        placement=placement,
    )


def test_two_ranks_sharing_a_step_gather_what_one_process_samples():
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(1, 6)]
    alone, alone_metrics = _runner()(rows, step=0)
    parts: dict[int, Any] = {}

    def gather_of(rank: int):
        def gather(obj: Any) -> list[Any]:  # rank 1 runs first, so rank 0 sees both parts
            parts[rank] = obj
            return [parts.get(0, obj), parts.get(1, obj)]

        return gather

    ranks = []
    for rank in (1, 0):
        model_runner = _runner()
        model_runner.placement = RolloutPlacement(
            model_runner.model.policy,
            lambda policy=model_runner.model.policy: policy,
            rank=rank,
            size=2,
            gather=gather_of(rank),
        )
        ranks.append(model_runner(rows, step=0))
    groups, metrics = ranks[1]  # rank 0's view
    assert [len(p[0]) for p in parts.values()] == [2, 3]  # rank 1: prompts 3-4, rank 0: 0-2
    assert [g.item.index for g in groups] == [0, 1, 2, 3, 4]
    assert [[t.input_ids for t in g.trajectories] for g in groups] == [
        [t.input_ids for t in g.trajectories] for g in alone
    ]
    assert [g.rewards for g in groups] == [g.rewards for g in alone]
    for key, value in alone_metrics.items():
        if not key.startswith(("time/", "memory/")):  # memory/*: this process's own
            assert metrics[key] == pytest.approx(value), key


def test_merge_rollout_metrics_recomputes_over_all_groups_and_combines_the_rest():
    from areno_core.rollout.collect import merge_rollout_metrics
    from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

    def group(index: int, rewards: list[float]) -> TrajectoryGroup:
        item = PromptItem(index=index, row={}, prompt="p")
        return TrajectoryGroup(
            item=item,
            trajectories=[
                Trajectory(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0] * 3,
                           reward=r, prompt_index=index)
                for r in rewards
            ],
        )  # fmt: skip

    per_rank = [
        {"rollout/samples": 2.0, "rollout/skipped_prompts": 1.0, "rollout/turns_mean": 2.0,
         "rollout/turns_max": 3.0, "time/rollout": 1.5, "rollout/agent_requests": 4.0},
        {"rollout/samples": 6.0, "rollout/skipped_prompts": 0.0, "rollout/turns_mean": 4.0,
         "rollout/turns_max": 5.0, "time/rollout": 0.5, "rollout/agent_requests": 7.0},
    ]  # fmt: skip
    groups = [group(0, [0.0, 1.0]), group(1, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0])]
    merged = merge_rollout_metrics(per_rank, groups)
    assert merged["rollout/samples"] == 8.0
    assert merged["rollout/reward_mean"] == pytest.approx(5 / 8)
    assert merged["rollout/accuracy"] == pytest.approx(5 / 8)
    assert merged["rollout/skipped_prompts"] == 1.0
    assert merged["rollout/turns_mean"] == pytest.approx((2 * 2 + 6 * 4) / 8)
    assert merged["rollout/turns_max"] == 5.0
    assert merged["time/rollout"] == 1.5
    assert merged["rollout/agent_requests"] == 11.0


def test_rollout_state_is_reported_kept_or_dropped(runner):
    _, dropped = runner(ROWS, step=0)
    assert dropped["memory/rollout_state_mib"] == 0.0
    runner.drop_state = False
    _, kept = runner(ROWS, step=1)
    assert kept["memory/rollout_state_mib"] * 2**20 == runner.engine.state_bytes > 0


def test_offload_optimizer_moves_state_out_for_the_rollout_and_back(runner, monkeypatch):
    from areno_core.runner import rollout as runner_module

    moves: list[tuple[str, list[str], int]] = []  # (device, optimizers, engine calls so far)

    def record(optimizers, device):
        names = [type(o).__name__ for o in optimizers if o is not None]
        moves.append((str(device), names, len(runner.engine.calls)))
        return 1024

    monkeypatch.setattr(runner_module, "move_optimizer_state", record)
    runner.model.optimizer = torch.optim.AdamW(runner.model.policy.parameters())
    runner.offload_optimizer = True
    runner(ROWS, step=0)
    assert moves == []  # on a CPU there is nowhere to offload to
    monkeypatch.setattr(TrainableModel, "device", property(lambda self: torch.device("cuda")))
    runner(ROWS, step=1)
    assert [(d, names) for d, names, _ in moves] == [("cpu", ["AdamW"]), ("cuda", ["AdamW"])]
    # The whole rollout session runs while the state is away.
    between = runner.engine.calls[moves[0][2] : moves[1][2]]
    assert [c[0] for c in between] == ["start", "generate", "end"]


# -- an engine whose release drops the weights -----------------------------------------------


class ForgetfulEngine(NativeEngine):
    """Samples from its own copy of the policy and, like a colocated SGLang server without a
    CPU backup, loses the weights whenever a session that frees state ends (they become
    noise), saying so through ``holds_weights`` and refusing to sample until pushed again."""

    drops_weights = True

    def __init__(self, model: Any, tokenizer: Any) -> None:
        import copy

        super().__init__(copy.deepcopy(model), tokenizer, EngineOptions(attn_backend="native"))
        self.holds_weights = False
        self.pushed: list[int] = []

    def sync_weights(self, weights: Any, *, version: int) -> None:
        super().sync_weights(weights, version=version)
        self.holds_weights = True
        self.pushed.append(version)

    def end_session(self, *, drop_state: bool = False) -> None:
        super().end_session(drop_state=drop_state)
        if drop_state:
            with torch.no_grad():
                for param in self.model.parameters():
                    param.normal_()
            self.holds_weights = False

    def generate(self, prompts: Any, sampling: SamplingParams, *, n: int = 1) -> Any:
        if not self.holds_weights:
            raise WeightsNotHeldError("weights released")
        return super().generate(prompts, sampling, n=n)


def test_rollout_after_an_evaluation_released_the_weights_samples_the_policy():
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(1, 5)]
    reference = _runner()
    reference.sync_weights()
    expected_eval = reference.evaluator(rows, max_new_tokens=4)()
    expected, _ = reference(rows, step=0)

    runner = _runner(forgetful=True)
    runner.sync_weights()
    assert (
        runner.evaluator(rows, max_new_tokens=4)()["eval/accuracy"]
        == (expected_eval["eval/accuracy"])
    )
    assert not runner.engine.holds_weights  # the evaluation's session freed them
    runner.sync_weights()  # the loop's call between steps: same version, weights gone
    groups, metrics = runner(rows, step=0)
    assert runner.engine.pushed == [0, 0] and runner.weight_restores == 1
    assert [[t.input_ids for t in g.trajectories] for g in groups] == [
        [t.input_ids for t in g.trajectories] for g in expected
    ]
    assert metrics["rollout/policy_version"] == 0.0


def test_async_worker_keeps_the_published_weights_for_an_engine_that_drops_them():
    # The worker's runner re-pushes what the trainer published (not its own stale module).
    from multiprocessing import Pipe

    from areno_core.rollout.weights import pack_weights
    from areno_core.runner.worker import Batch, Mailbox, PublishedWeights, Rollout, Stop, serve
    from areno_core.runner.worker import Weights as WeightsMessage

    trainer = TrainableModel.from_ckpt("random:qwen3-tiny", seed=3)  # what the trainer has
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    reference = _runner()
    reference.model.policy.load_state_dict(trainer.policy.state_dict())
    reference.drop_state = True
    reference.sync_weights()
    expected = [reference(rows, step=s)[0] for s in (0, 1)]

    runner = _runner(forgetful=True)
    runner.drop_state = True  # every session releases: the second batch needs a re-push
    runner.placement = RolloutPlacement(runner.model.policy, PublishedWeights(runner.model.policy))
    inbox_read, inbox_write = Pipe(duplex=False)
    outbox_read, outbox_write = Pipe(duplex=False)
    inbox_write.send(WeightsMessage(0, pack_weights(trainer.policy)))
    for step in (0, 1):
        inbox_write.send(Rollout(step, rows, runner.sampling))
    worker = threading.Thread(target=serve, args=(runner, Mailbox(inbox_read), outbox_write))
    worker.start()
    batches = [outbox_read.recv() for _ in range(2)]
    inbox_write.send(Stop())
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert all(isinstance(b, Batch) for b in batches)
    assert runner.engine.pushed == [0, 0]
    for batch, groups in zip(batches, expected, strict=True):
        assert [[t.input_ids for t in g.trajectories] for g in batch.groups] == [
            [t.input_ids for t in g.trajectories] for g in groups
        ]

"""The rollout runner: one engine per run, kept in step with the policy by sync_weights, used
for training rollouts and evaluation alike, always inside a rollout session."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from areno_core.model import TrainableModel
from areno_core.rollout.base import EngineOptions
from areno_core.rollout.native import NativeEngine
from areno_core.rollout.runner import RolloutRunner
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


def test_rollout_state_is_reported_kept_or_dropped(runner):
    _, dropped = runner(ROWS, step=0)
    assert dropped["memory/rollout_state_mib"] == 0.0
    runner.drop_state = False
    _, kept = runner(ROWS, step=1)
    assert kept["memory/rollout_state_mib"] * 2**20 == runner.engine.state_bytes > 0


def test_offload_optimizer_moves_state_out_for_the_rollout_and_back(runner, monkeypatch):
    from areno_core.rollout import runner as runner_module

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

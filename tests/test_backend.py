from __future__ import annotations

import pytest
import torch

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.registry import set_registry
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

ROWS = [
    {"prompt": "2+2=", "response": "4"},
    {"prompt": "3+3=", "response": "6"},
    {"prompt": "1+4=", "response": "5"},
    {"prompt": "7+1=", "response": "8"},
]


@pytest.fixture(autouse=True)
def _installed_plugins(monkeypatch):
    monkeypatch.delenv("ARENO_PLUGINS", raising=False)
    set_registry(None)
    yield
    set_registry(None)


@pytest.fixture
def model() -> TrainableModel:
    return TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)


def test_train_unknown_keyword_is_type_error_naming_valid_options(model):
    with pytest.raises(
        TypeError, match="unexpected keyword argument\\(s\\) grpo_clip_eps for algorithm 'sft'"
    ):
        LocalBackend().train(model, ROWS, algorithm="sft", grpo_clip_eps=0.3)
    with pytest.raises(TypeError, match="not_an_arg for algorithm 'grpo'; its options are: "):
        LocalBackend().train(model, [], algorithm="grpo", not_an_arg=1)


def test_train_sft_steps_lower_loss_and_count_steps(model):
    backend = LocalBackend()
    losses = []
    for _ in range(8):
        result = backend.train(model, ROWS, algorithm="sft", learning_rate=1e-2, mini_bs=2)
        losses.append(result.metrics["train/loss"])
    assert result.step == 8 == model.step
    assert model.optimizer_steps == 8
    assert losses[-1] < losses[0]
    assert result.metrics["train/target_tokens"] > 0


def test_train_changed_optimizer_settings_are_refused(model):
    backend = LocalBackend()
    backend.train(model, ROWS, algorithm="sft", learning_rate=1e-3)
    with pytest.raises(ValueError, match="learning_rate changed"):
        backend.train(model, ROWS, algorithm="sft", learning_rate=5e-3)


def test_train_accumulation_one_gives_an_optimizer_step_per_microbatch(model):
    result = LocalBackend().train(
        model, ROWS, algorithm="sft", mini_bs=1, gradient_accumulation_steps=1
    )
    assert result.metrics["train/optimizer_steps"] == 4.0
    assert model.optimizer_steps == 4


def test_train_online_algorithm_rejects_rows_and_sft_rejects_groups(model):
    group = TrajectoryGroup(
        item=PromptItem(index=0, row={}, prompt="x"),
        trajectories=[Trajectory(input_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                                 rollout_logprobs=[0.0, -1.0, -1.0], reward=1.0)],
    )  # fmt: skip
    with pytest.raises(TypeError, match="trains on TrajectoryGroup objects, got dict"):
        LocalBackend().train(model, ROWS, algorithm="grpo")
    with pytest.raises(TypeError, match="trains on dataset rows, not trajectories"):
        LocalBackend().train(model, [group], algorithm="sft")


def test_log_writes_explicit_metrics_and_reward_stats(tmp_path):
    from areno_core.train.metrics import read_jsonl

    model = TrainableModel.from_ckpt("random:qwen3-tiny", metrics_dir=str(tmp_path))
    group = TrajectoryGroup(
        item=PromptItem(index=0, row={}, prompt="x"),
        trajectories=[
            Trajectory(input_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -1.0], reward=r)
            for r in (0.0, 1.0)
        ],
    )
    logged = model.log([group], metrics={"train/loss": 2.5}, step=3)
    model.close()
    assert logged["rollout/reward_mean"] == 0.5 and logged["rollout/reward_max"] == 1.0
    [line] = read_jsonl(tmp_path)
    assert line["step"] == 3 and line["train/loss"] == 2.5
    torch.testing.assert_close(line["rollout/reward_std"], 0.5)

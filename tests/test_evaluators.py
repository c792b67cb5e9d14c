"""pass@k and the evaluation metrics on hand-computed cases."""

from __future__ import annotations

from math import comb

import pytest

from areno_core.evaluators import EvaluatorSpec, greedy_metrics, pass_at_k, sampled_metrics
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup


def group(index: int, rewards: list[float], lengths: list[int] | None = None) -> TrajectoryGroup:
    lengths = lengths or [2] * len(rewards)
    trajs = [
        Trajectory(
            input_ids=[0] * (1 + n),
            loss_mask=[0] + [1] * n,
            rollout_logprobs=[0.0] * (1 + n),
            reward=r,
            prompt_len=1,
            finish_reason="length" if n >= 4 else "stop",
            prompt_index=index,
        )
        for r, n in zip(rewards, lengths, strict=True)
    ]
    return TrajectoryGroup(item=PromptItem(index=index, row={}, prompt="p"), trajectories=trajs)


def test_pass_at_k_hand_computed_cases() -> None:
    # n=5 samples, c=2 correct, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the share of correct samples
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    # n=4, c=1, k=3: 1 - C(3,3)/C(4,3) = 1 - 1/4
    assert pass_at_k(4, 1, 3) == pytest.approx(0.75)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 2, 3) == 1.0  # fewer than k wrong samples: some draw of k is right
    # large n: the product form agrees with the binomials and does not overflow
    assert pass_at_k(200, 13, 10) == pytest.approx(1 - comb(187, 10) / comb(200, 10), rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, 1, 0), (3, 1, 4), (2, -1, 1)])
def test_pass_at_k_impossible_counts_are_refused(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_sampled_metrics_average_pass_at_k_over_prompts() -> None:
    groups = [group(0, [1, 0, 1, 0, 0]), group(1, [0, 0, 0, 0, 0]), group(2, [1, 1, 1, 1, 1])]
    metrics = sampled_metrics(groups, (1, 2), correct_at=1.0)
    assert metrics["pass@1"] == pytest.approx((0.4 + 0.0 + 1.0) / 3)
    assert metrics["pass@2"] == pytest.approx((0.7 + 0.0 + 1.0) / 3)
    assert metrics["sampled_reward_mean"] == pytest.approx(7 / 15)
    assert metrics["sampled_response_length_mean"] == 2.0


def test_greedy_metrics_accuracy_lengths_and_threshold() -> None:
    groups = [group(0, [1.0], [3]), group(1, [0.5], [4]), group(2, [0.0], [1])]
    metrics = greedy_metrics(groups)
    assert metrics == {
        "prompts": 3.0,
        "accuracy": pytest.approx(1 / 3),
        "reward_mean": pytest.approx(0.5),
        "response_length_mean": pytest.approx(8 / 3),
        "response_length_max": 4.0,
        "truncation_rate": pytest.approx(1 / 3),
    }
    assert greedy_metrics(groups, correct_at=0.5)["accuracy"] == pytest.approx(2 / 3)


def test_evaluator_spec_rejects_a_non_positive_length() -> None:
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        EvaluatorSpec("pack/task", "x", max_new_tokens=0)

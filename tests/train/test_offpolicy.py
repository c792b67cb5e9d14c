"""Stale samples: the backend scores the proximal policy for the decoupled objective."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.registry import get_registry
from areno_core.train.batching import collate
from areno_core.train.forward import policy_outputs
from areno_core.train.offpolicy import (
    interpolate_proximal,
    stale_rows,
    with_behaviour,
    with_proximal,
)
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

SHIFT = 0.1  # the behaviour policy's log-probabilities sit this far below the current policy's


def _trajectory(ids: list[int], prompt_len: int, index: int, sample: int) -> Trajectory:
    n = len(ids)
    return Trajectory(
        input_ids=ids,
        loss_mask=[0] * prompt_len + [1] * (n - prompt_len),
        rollout_logprobs=[0.0] * n,
        reward=float(sample),
        prompt_len=prompt_len,
        prompt_index=index,
        sample_index=sample,
    )


def stale_groups(model: TrainableModel, version: int) -> list[TrajectoryGroup]:
    """Two groups of two samples whose rollout log-probabilities are the model's own minus
    ``SHIFT``, sampled (so they say) by policy ``version``."""
    rows = [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 14, 16]]
    trajectories = [_trajectory(ids, 3, i // 2, i % 2) for i, ids in enumerate(rows)]
    batch = collate(trajectories, model.pad_id)
    with torch.no_grad():
        logprobs = policy_outputs(model.policy, batch, share_prefix=False)["logprobs"]
    for row, t in enumerate(trajectories):
        t.rollout_logprobs = [
            float(logprobs[row, i]) - SHIFT if m else 0.0 for i, m in enumerate(t.loss_mask)
        ]
        t.policy_version = version
    return [
        TrajectoryGroup(
            item=PromptItem(index=g, row={}, prompt="p"),
            trajectories=trajectories[2 * g : 2 * g + 2],
        )
        for g in range(2)
    ]


@pytest.fixture
def model() -> TrainableModel:
    torch.manual_seed(0)
    model = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)
    model.optimizer_steps = 3  # the trainer's policy is version 3
    return model


def _train(model: TrainableModel, groups, algorithm) -> dict[str, float]:
    backend = LocalBackend(share_prefix=False)
    result = backend.train(
        model, groups, algorithm=algorithm, learning_rate=1e-3, mini_bs=4,
        activation_checkpointing=False,
    )  # fmt: skip
    return result.metrics


def test_stale_rows_counts_samples_of_other_versions() -> None:
    made = [Trajectory([1, 2], [0, 1], [0.0, -1.0], policy_version=v) for v in (2, 3, 3, 1)]
    assert stale_rows(made, 3) == 2
    assert stale_rows(made, 1) == 3


def test_with_proximal_swaps_old_logprobs_and_keeps_the_behaviour_ones() -> None:
    batch = {
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0]]),
        "rollout_logprobs": torch.tensor([[0.0, -1.0, -2.0]]),
    }
    batch["old_logprobs"] = batch["rollout_logprobs"]
    out = with_proximal(batch, torch.tensor([[-5.0, -0.5, -2.5]]))
    torch.testing.assert_close(out["old_logprobs"], torch.tensor([[0.0, -0.5, -2.5]]))
    assert out["behaviour_logprobs"] is batch["rollout_logprobs"]
    assert "behaviour_logprobs" not in batch  # the input is not modified
    with pytest.raises(ValueError, match=r"shape \(1, 2\), the batch \(1, 3\)"):
        with_proximal(batch, torch.zeros(1, 2))


def test_stale_batch_gets_proximal_logprobs_and_behaviour_weights(model) -> None:
    metrics = _train(model, stale_groups(model, version=1), "grpo")
    assert metrics["train/stale_rows"] == 4.0
    # One optimizer step: its rows' own forward pass is the proximal policy's, so no row is
    # scored by an extra pass and the ratio is exactly 1; every token's weight is
    # pi_prox / pi_behav = e^SHIFT.
    assert metrics["train/proximal_rows_scored"] == 0.0
    assert metrics["train/ratio_mean"] == 1.0
    assert metrics["train/behaviour_weight_mean"] == pytest.approx(math.exp(SHIFT), rel=1e-5)
    assert metrics["train/behaviour_weight_min"] == pytest.approx(math.exp(SHIFT), rel=1e-5)
    assert metrics["train/behaviour_weight_max"] == pytest.approx(math.exp(SHIFT), rel=1e-5)


def test_fresh_batch_trains_against_its_rollout_logprobs(model) -> None:
    metrics = _train(model, stale_groups(model, version=3), "grpo")
    assert "train/stale_rows" not in metrics
    assert not any(k.startswith("train/behaviour_weight") for k in metrics)
    # old_logprobs are the rollout's, SHIFT below the policy: the ratio is e^SHIFT.
    assert metrics["train/ratio_mean"] == pytest.approx(math.exp(SHIFT), rel=1e-5)


def test_algorithm_without_decoupled_objective_keeps_rollout_logprobs(model) -> None:
    plain = attrs.evolve(get_registry().algorithm("grpo"), decoupled=False)
    metrics = _train(model, stale_groups(model, version=1), plain)
    assert "train/stale_rows" not in metrics
    assert metrics["train/ratio_mean"] == pytest.approx(math.exp(SHIFT), rel=1e-5)


def test_interpolate_proximal_places_logprobs_between_behaviour_and_current_by_version():
    # Rows sampled by versions 0, 4 and 2; the step started at version 4, now at 6.
    behaviour = torch.tensor([[0.0, -1.0], [0.0, -1.0], [0.0, -1.0]], dtype=torch.float64)
    microbatch = {
        "loss_mask": torch.tensor([[0.0, 1.0]] * 3, dtype=torch.float64),
        "behaviour_logprobs": behaviour,
        "behaviour_version": torch.tensor([0, 4, 2]),
        "old_logprobs": behaviour,
    }
    current = torch.full((3, 2), -0.4, dtype=torch.float64, requires_grad=True)
    out = interpolate_proximal(microbatch, current, proximal_version=4, current_version=6)
    # alpha = (4 - v) / (6 - v): 4/6 for version 0, 0 for the proximal version 4, 2/4 for 2
    expected = torch.tensor(
        [[0.0, -1.0 + 4 / 6 * 0.6], [0.0, -1.0], [0.0, -1.0 + 0.5 * 0.6]], dtype=torch.float64
    )
    torch.testing.assert_close(out["old_logprobs"], expected, atol=1e-12, rtol=0)
    assert not out["old_logprobs"].requires_grad
    # In the step's first optimizer step the current policy is the proximal one: alpha = 1.
    first = interpolate_proximal(microbatch, current, proximal_version=4, current_version=4)
    torch.testing.assert_close(
        first["old_logprobs"][[0, 2], 1], torch.tensor([-0.4, -0.4], dtype=torch.float64)
    )


def test_with_behaviour_marks_the_batch_with_sampler_versions(model) -> None:
    groups = stale_groups(model, version=1)
    trajectories = [t for g in groups for t in g.trajectories]
    trajectories[0].policy_version = 3
    batch = collate(trajectories, model.pad_id)
    out = with_behaviour(batch, trajectories)
    assert out["behaviour_version"].tolist() == [3, 1, 1, 1]
    assert out["behaviour_logprobs"] is batch["rollout_logprobs"]
    assert out["old_logprobs"] is batch["old_logprobs"]


def test_interpolate_mode_needs_no_extra_pass_and_is_exact_in_the_first_step(model) -> None:
    backend = LocalBackend(share_prefix=False)
    metrics = backend.train(
        model, stale_groups(model, version=1), algorithm="grpo", learning_rate=1e-3,
        mini_bs=4, activation_checkpointing=False, proximal_logprobs="interpolate",
    ).metrics  # fmt: skip
    assert metrics["train/stale_rows"] == 4.0
    assert "time/proximal" not in metrics
    # One optimizer step: old_logprobs are the current policy's own (alpha = 1).
    assert metrics["train/ratio_mean"] == 1.0
    assert metrics["train/behaviour_weight_mean"] == pytest.approx(math.exp(SHIFT), rel=1e-5)


def test_unknown_proximal_mode_is_refused_naming_the_choices(model) -> None:
    with pytest.raises(ValueError, match="recompute, interpolate, got 'guess'"):
        LocalBackend().train(model, [], algorithm="grpo", proximal_logprobs="guess")


def _two_step_train(groups, algorithm) -> tuple[dict[str, float], TrainableModel]:
    torch.manual_seed(0)
    model = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)
    model.optimizer_steps = 3
    result = LocalBackend(share_prefix=False).train(
        model, groups, algorithm=algorithm, learning_rate=1e-2, mini_bs=2,
        gradient_accumulation_steps=1, activation_checkpointing=False,
    )  # fmt: skip
    return result.metrics, model


def test_recompute_scores_only_the_later_optimizer_steps_and_trains_as_a_full_pass(model) -> None:
    """Two optimizer steps of two rows: the first step's rows take their proximal values from
    their own forward pass, the second step's are scored before the update; the weights end
    where scoring every row first (PPO's way, forced here) puts them."""
    groups = stale_groups(model, version=1)
    grpo = get_registry().algorithm("grpo")
    reused, trained = _two_step_train(groups, grpo)
    full, reference = _two_step_train(groups, attrs.evolve(grpo, proximal_in_advantages=True))
    assert reused["train/optimizer_steps"] == 2.0
    assert reused["train/proximal_rows_scored"] == 2.0
    assert "train/proximal_rows_scored" not in full and full["time/proximal"] > 0.0
    for key in ("train/loss", "train/ratio_mean", "train/behaviour_weight_mean"):
        assert reused[key] == pytest.approx(full[key], rel=1e-5, abs=1e-6), key
    for (name, a), b in zip(trained.policy.named_parameters(), reference.policy.parameters(),
                            strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # The second optimizer step really moved the ratio away from 1 (so it was scored right).
    assert reused["train/ratio_max"] > 1.0 + 1e-4 or reused["train/ratio_min"] < 1.0 - 1e-4


@pytest.mark.parametrize("packed", [True, False])
def test_recompute_scores_the_proximal_policy_through_the_updates_forward(
    model, monkeypatch, packed
) -> None:
    from areno_core.train import update

    calls: list[tuple[bool, bool]] = []  # (packed, gradients recorded) per forward
    real = update.policy_outputs

    def spy(*args, **kwargs):
        calls.append((kwargs["packed"], torch.is_grad_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(update, "policy_outputs", spy)
    model.optimizer_steps = 3
    metrics = LocalBackend(packed_forward=packed).train(
        model, stale_groups(model, version=1), algorithm="grpo", learning_rate=1e-3,
        mini_bs=2, gradient_accumulation_steps=1, activation_checkpointing=False,
    ).metrics  # fmt: skip
    assert metrics["train/proximal_rows_scored"] == 2.0
    scoring = [p for p, grad in calls if not grad]
    assert scoring and all(p is packed for p in scoring)
    assert all(p is packed for p, _ in calls)

"""DPO loss, implicit rewards, margins and accuracy on numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from areno_algos.dpo import TIE_RTOL, DPOConfig, dpo_loss, pair_correct

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}

# Rows interleave pairs: 0 chosen / 1 rejected (pair 0), 2 chosen / 3 rejected (pair 1).
# Each row has 2 response tokens (positions 1, 2); their log-probabilities sum to:
#   policy:    c0 = -1, r0 = -3, c1 = -2, r1 = -1
#   reference: -2 for every row
# beta = 0.1 -> implicit rewards beta * (policy - reference):
#   c0 = 0.1 * ( 1) = 0.1,  r0 = 0.1 * (-1) = -0.1  -> margin 0.2  (correct order)
#   c1 = 0.1 * ( 0) = 0.0,  r1 = 0.1 * ( 1) =  0.1  -> margin -0.1 (wrong order)
# loss = mean over the 2 pairs of -log sigmoid(margin) = (softplus(-0.2) + softplus(0.1)) / 2
#      = (0.598138869 + 0.744396660) / 2 = 0.671267765
POLICY = torch.tensor(
    [[0.0, -0.5, -0.5], [0.0, -1.0, -2.0], [0.0, -1.5, -0.5], [0.0, -0.25, -0.75]], dtype=F64
)
REF = torch.tensor([[0.0, -1.0, -1.0]] * 4, dtype=F64)
MASK = torch.tensor([[0, 1, 1]] * 4, dtype=F64)


def _batch() -> dict:
    return {
        "loss_mask": MASK,
        "ref_logprobs": REF,
        "group_loss_tokens": 8.0,
        "group_sequences": 4.0,
    }


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_dpo_loss_two_pairs_matches_hand_value() -> None:
    logprobs = POLICY.clone().requires_grad_(True)
    loss, _ = dpo_loss({"logprobs": logprobs}, _batch(), DPOConfig())
    expected = (softplus(-0.2) + softplus(0.1)) / 2
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64), **TOL)
    torch.testing.assert_close(loss, torch.tensor(0.6712677647275813, dtype=F64), **TOL)


def test_dpo_loss_gradient_pushes_chosen_up_and_rejected_down() -> None:
    # d loss / d (chosen token logprob)   = -beta * sigmoid(-margin) / pairs
    # d loss / d (rejected token logprob) = +beta * sigmoid(-margin) / pairs
    logprobs = POLICY.clone().requires_grad_(True)
    loss, _ = dpo_loss({"logprobs": logprobs}, _batch(), DPOConfig())
    loss.backward()

    def sig(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    g0, g1 = 0.1 * sig(-0.2) / 2, 0.1 * sig(0.1) / 2
    expected = torch.tensor([[-g0], [g0], [-g1], [g1]], dtype=F64) * MASK
    torch.testing.assert_close(logprobs.grad, expected, **TOL)


def test_dpo_loss_stats_rewards_margin_accuracy_match_hand_values() -> None:
    _, stats = dpo_loss({"logprobs": POLICY}, _batch(), DPOConfig())
    expected = {
        "train/rewards/chosen": (0.1 + 0.0) / 2,
        "train/rewards/rejected": (-0.1 + 0.1) / 2,
        "train/rewards/margin": (0.2 - 0.1) / 2,
        "train/rewards/accuracy": 1 / 2,
        "train/logps/chosen": (-1.0 - 2.0) / 2,
        "train/logps/rejected": (-3.0 - 1.0) / 2,
        "train/dpo_loss": 0.6712677647275813,
    }
    assert set(stats) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(stats[key], torch.tensor(value, dtype=F64), **TOL)


def test_dpo_loss_larger_beta_scales_rewards() -> None:
    _, stats = dpo_loss({"logprobs": POLICY}, _batch(), DPOConfig(dpo_beta=0.5))
    torch.testing.assert_close(
        stats["train/rewards/margin"], torch.tensor((1.0 - 0.5) / 2, dtype=F64), **TOL
    )


def test_dpo_loss_odd_rows_raises_valueerror() -> None:
    batch = {**_batch(), "loss_mask": MASK[:3], "ref_logprobs": REF[:3]}
    with pytest.raises(ValueError, match="whole \\(chosen, rejected\\) pairs, got 3 rows"):
        dpo_loss({"logprobs": POLICY[:3]}, batch, DPOConfig())


def test_dpo_loss_split_by_pairs_same_loss_grad_and_stats(check_split) -> None:
    gen = torch.Generator().manual_seed(3)
    mask = torch.ones(6, 5, dtype=F64)
    mask[:, :2] = 0.0
    mask[1, 4] = 0.0
    batch = {"loss_mask": mask, "ref_logprobs": -torch.rand(6, 5, generator=gen, dtype=F64)}
    outputs = {"logprobs": -torch.rand(6, 5, generator=gen, dtype=F64)}
    check_split(dpo_loss, outputs, batch, DPOConfig(), [2])
    check_split(dpo_loss, outputs, batch, DPOConfig(), [2, 4])


def test_pair_correct_ties_and_rounding_count_zero() -> None:
    margin = torch.tensor([0.0, 1e-5, -1e-5, 1e-3, -0.2], dtype=F64)
    scale = torch.full((5,), 40.0, dtype=F64)  # beta 0.1 x four log-probabilities near -100
    # rounding bound: 16 * 2**-23 * 40 = 7.63e-5
    assert TIE_RTOL == 16 * 2.0**-23 and 16 * 2.0**-23 * 40.0 == 7.62939453125e-05
    torch.testing.assert_close(
        pair_correct(margin, scale), torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0], dtype=F64), **TOL
    )


def test_dpo_loss_policy_equal_to_reference_up_to_rounding_accuracy_zero() -> None:
    # Step 0: the reference is the policy; float32 rounding of the summed log-probabilities
    # (one ulp of 100 is 7.6e-6) makes some margins +-1.5e-6 instead of 0. None is "correct".
    ref = torch.full((4, 3), -50.0, dtype=torch.float32)
    ref[:, 0] = 0.0
    policy = ref.clone()
    policy[0, 1] += 7.62939453125e-06  # chosen of pair 0 one ulp up
    policy[3, 2] -= 7.62939453125e-06  # rejected of pair 1 one ulp down
    batch = {**_batch(), "loss_mask": MASK.float(), "ref_logprobs": ref}
    _, stats = dpo_loss({"logprobs": policy}, batch, DPOConfig())
    assert float(stats["train/rewards/margin"]) > 0
    assert float(stats["train/rewards/accuracy"]) == 0.0

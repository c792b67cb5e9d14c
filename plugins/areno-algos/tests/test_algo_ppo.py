"""PPO: GAE by hand, whitening, dual-clip policy loss, clipped value loss, KL loss."""

from __future__ import annotations

import math

import pytest
import torch
from areno_algos.common import LOSS_AGG_MODES
from areno_algos.ppo import (
    PPOConfig,
    gae,
    last_token_mask,
    ppo_advantages,
    ppo_loss,
)

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
E = math.exp
LN2 = math.log(2.0)


def test_last_token_mask_marks_each_rows_last_loss_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 1], [0, 0, 0, 0]], dtype=F64)
    expected = [[False, False, True, False], [False, False, False, True], [False] * 4]
    assert last_token_mask(mask).tolist() == expected


def test_gae_four_tokens_gamma_one_lam_095_matches_hand_values() -> None:
    # Position 0 is the prompt; 4 action tokens with values 0.5, 0.4, 0.3, 0.2; reward 1 on
    # the last one; gamma 1, lam 0.95, value after the last action 0.
    #   A4 = 1 + 0 - 0.2                  = 0.8
    #   A3 = (0 + 0.2 - 0.3) + 0.95 * 0.8   = 0.66
    #   A2 = (0 + 0.3 - 0.4) + 0.95 * 0.66  = 0.527
    #   A1 = (0 + 0.4 - 0.5) + 0.95 * 0.527 = 0.40065
    # returns = A + V = 0.90065, 0.927, 0.96, 1.0
    values = torch.tensor([[9.0, 0.5, 0.4, 0.3, 0.2]], dtype=F64)
    mask = torch.tensor([[0, 1, 1, 1, 1]], dtype=F64)
    rewards = torch.tensor([[0, 0, 0, 0, 1.0]], dtype=F64)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(
        adv, torch.tensor([[0, 0.40065, 0.527, 0.66, 0.8]], dtype=F64), **TOL
    )
    torch.testing.assert_close(
        ret, torch.tensor([[0, 0.90065, 0.927, 0.96, 1.0]], dtype=F64), **TOL
    )


def test_gae_gap_in_mask_skips_non_action_token() -> None:
    # mask 0 1 0 1 1 (position 2 is e.g. a tool result; its value 7 must be ignored)
    # gamma 0.9, lam 0.5 (gamma * lam = 0.45), values of the actions 0.5, 0.3, 0.2, reward 1:
    #   A4 = 1 - 0.2                      = 0.8
    #   A3 = 0.9 * 0.2 - 0.3 + 0.45 * 0.8   = 0.24
    #   A1 = 0.9 * 0.3 - 0.5 + 0.45 * 0.24  = -0.122   (next action is position 3)
    values = torch.tensor([[9.0, 0.5, 7.0, 0.3, 0.2]], dtype=F64)
    mask = torch.tensor([[0, 1, 0, 1, 1]], dtype=F64)
    rewards = torch.tensor([[0, 0, 0, 0, 1.0]], dtype=F64)
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0, -0.122, 0, 0.24, 0.8]], dtype=F64), **TOL)
    torch.testing.assert_close(ret, torch.tensor([[0, 0.378, 0, 0.54, 1.0]], dtype=F64), **TOL)


def test_ppo_advantages_reward_on_last_token_then_whitened() -> None:
    batch = {
        "rewards": torch.tensor([1.0], dtype=F64),
        "loss_mask": torch.tensor([[0, 1, 1, 1, 1]], dtype=F64),
        "values": torch.tensor([[9.0, 0.5, 0.4, 0.3, 0.2]], dtype=F64),
    }
    out = ppo_advantages(batch, PPOConfig(gamma=1.0, lam=0.95))
    raw = torch.tensor([0.40065, 0.527, 0.66, 0.8], dtype=F64)  # the hand GAE above
    returns = raw + torch.tensor([0.5, 0.4, 0.3, 0.2], dtype=F64)
    torch.testing.assert_close(out["returns"][0, 1:], returns, **TOL)
    whitened = (raw - raw.mean()) / torch.sqrt(raw.var() + 1e-8)
    torch.testing.assert_close(out["advantages"][0, 1:], whitened, **TOL)
    assert out["advantages"][0, 0] == 0.0
    # explained variance of the old values: 1 - Var(R - V) / Var(R) = 1 - Var(A) / Var(R)
    ev = 1.0 - raw.var() / returns.var()
    torch.testing.assert_close(out["rollout_stats"]["rollout/explained_variance"], ev, **TOL)


def test_ppo_advantages_kl_in_reward_when_kl_loss_off() -> None:
    # gamma = lam = 1, values 0: returns are the sums of the remaining token rewards.
    # k1 KL(old || ref) = 0.5 per token, coef 0.1 -> -0.05 on each action, +1 on the last:
    #   returns = (-0.05 + 0.95, 0.95) = (0.9, 0.95)
    batch = {
        "rewards": torch.tensor([1.0], dtype=F64),
        "loss_mask": torch.tensor([[0, 1, 1]], dtype=F64),
        "values": torch.zeros(1, 3, dtype=F64),
        "old_logprobs": torch.tensor([[0.0, -1.0, -1.0]], dtype=F64),
        "ref_logprobs": torch.tensor([[0.0, -1.5, -1.5]], dtype=F64),
    }
    config = PPOConfig(gamma=1.0, lam=1.0, use_kl_loss=False, kl_loss_coef=0.1, kl_loss_type="k1")
    out = ppo_advantages(batch, config)
    torch.testing.assert_close(out["returns"], torch.tensor([[0.0, 0.9, 0.95]], dtype=F64), **TOL)
    torch.testing.assert_close(
        out["rollout_stats"]["rollout/kl_penalty"], torch.tensor(0.5, dtype=F64), **TOL
    )
    # with the KL loss on, the reward is left alone: returns (1, 1)
    out = ppo_advantages(batch, PPOConfig(gamma=1.0, lam=1.0, kl_loss_type="k1"))
    torch.testing.assert_close(out["returns"], torch.tensor([[0.0, 1.0, 1.0]], dtype=F64), **TOL)


def _loss_case(use_kl_loss: bool) -> tuple[dict, dict]:
    # one row, 4 action tokens (positions 1..4), band [0.8, 1.2], dual clip c = 3
    old = torch.full((1, 5), -1.0, dtype=F64)
    new = old + torch.tensor([[0.0, 0.1, 0.3, -0.3, 1.5]], dtype=F64)
    batch = {
        "loss_mask": torch.tensor([[0, 1, 1, 1, 1]], dtype=F64),
        "old_logprobs": old,
        "ref_logprobs": new.detach() - LN2,  # log(p / ref) = ln 2 on every token
        "advantages": torch.tensor([[0.0, 1.0, 1.0, -1.0, -1.0]], dtype=F64),
        "values": torch.zeros(1, 5, dtype=F64),  # old values
        "returns": torch.tensor([[0.0, 1.0, 0.0, 1.0, 2.0]], dtype=F64),
        "group_loss_tokens": 4.0,
        "group_sequences": 1.0,
    }
    outputs = {
        "logprobs": new.requires_grad_(True),
        "values": torch.tensor([[0.0, 0.2, 1.0, -1.0, 1.0]], dtype=F64, requires_grad=True),
    }
    return outputs, batch


def test_ppo_loss_policy_value_terms_match_hand_values_and_clipped_grads_are_zero() -> None:
    # policy, per token:
    #   A=+1, r=e^0.1=1.105171: inside             -> -1.105171, grad -1.105171/4
    #   A=+1, r=e^0.3=1.349859: clipped at 1.2     -> -1.2,      grad 0
    #   A=-1, r=e^-0.3=0.740818: clipped at 0.8    -> 0.8,       grad 0
    #   A=-1, r=e^1.5=4.481689: dual clip 3 * |A|  -> 3.0,       grad 0
    #   policy_loss = (-1.105171 - 1.2 + 0.8 + 3) / 4 = 0.373707
    # value (old values 0, eps 0.5), 0.5 * max((v - R)^2, (v_clipped - R)^2):
    #   v=0.2,  R=1: v_clipped 0.2  -> 0.5 * 0.64          = 0.32,  grad v - R = -0.8
    #   v=1.0,  R=0: v_clipped 0.5  -> 0.5 * max(1, 0.25)  = 0.5,   grad 1.0
    #   v=-1.0, R=1: v_clipped -0.5 -> 0.5 * max(4, 2.25)  = 2.0,   grad -2.0
    #   v=1.0,  R=2: v_clipped 0.5  -> 0.5 * max(1, 2.25)  = 1.125, grad 0 (value clip binds)
    #   value_loss = (0.32 + 0.5 + 2.0 + 1.125) / 4 = 0.98625
    # loss = policy_loss + 0.5 * value_loss
    outputs, batch = _loss_case(use_kl_loss=False)
    loss, stats = ppo_loss(outputs, batch, PPOConfig(use_kl_loss=False))
    loss.backward()
    policy = (-E(0.1) - 1.2 + 0.8 + 3.0) / 4
    torch.testing.assert_close(stats["train/policy_loss"], torch.tensor(policy, dtype=F64), **TOL)
    torch.testing.assert_close(stats["train/value_loss"], torch.tensor(0.98625, dtype=F64), **TOL)
    torch.testing.assert_close(loss, torch.tensor(policy + 0.5 * 0.98625, dtype=F64), **TOL)
    torch.testing.assert_close(
        outputs["logprobs"].grad, torch.tensor([[0.0, -E(0.1) / 4, 0, 0, 0]], dtype=F64), **TOL
    )
    assert torch.all(outputs["logprobs"].grad[0, 2:] == 0)
    # value grads carry value_loss_coef 0.5 and the 1/4 token mean
    torch.testing.assert_close(
        outputs["values"].grad,
        torch.tensor([[0.0, -0.8, 1.0, -2.0, 0.0]], dtype=F64) * 0.5 / 4,
        **TOL,
    )
    assert outputs["values"].grad[0, 4] == 0
    for key, value in {
        "train/clip_fraction": 2 / 4,
        "train/dual_clip_fraction": 1 / 4,
        "train/value_clip_fraction": 1 / 4,
    }.items():
        torch.testing.assert_close(stats[key], torch.tensor(value, dtype=F64), **TOL)
    assert "train/kl" not in stats


def test_ppo_loss_kl_loss_on_adds_coef_times_low_var_kl() -> None:
    # log(p / ref) = ln 2 on every token -> k3 = 0.5 - 1 + ln 2 = 0.193147;
    # d k3 / d logprob = 1 - ref/p = 0.5, so every token's grad gains 0.001 * 0.5 / 4
    outputs, batch = _loss_case(use_kl_loss=True)
    loss, stats = ppo_loss(outputs, batch, PPOConfig())
    loss.backward()
    kl = 0.5 - 1.0 + LN2
    torch.testing.assert_close(stats["train/kl"], torch.tensor(kl, dtype=F64), **TOL)
    policy = (-E(0.1) - 1.2 + 0.8 + 3.0) / 4
    expected = policy + 0.5 * 0.98625 + 0.001 * kl
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64), **TOL)
    kl_grad = 0.001 * 0.5 / 4
    torch.testing.assert_close(
        outputs["logprobs"].grad,
        torch.tensor([[0.0, -E(0.1) / 4 + kl_grad, kl_grad, kl_grad, kl_grad]], dtype=F64),
        **TOL,
    )


def test_ppo_loss_kl_loss_without_ref_logprobs_raises_keyerror() -> None:
    outputs, batch = _loss_case(use_kl_loss=True)
    del batch["ref_logprobs"]
    with pytest.raises(KeyError, match="use_kl_loss is on but the batch has no ref_logprobs"):
        ppo_loss(outputs, batch, PPOConfig())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_ppo_loss_split_into_microbatches_same_loss_grad_stats(
    mode: str, check_split, random_online_batch
) -> None:
    outputs, batch = random_online_batch(seed=3)
    config = PPOConfig(loss_agg=mode, clip_ratio_c=1.5, value_clip_eps=0.3)
    batch = ppo_advantages(batch, config)
    batch.pop("rollout_stats")
    check_split(ppo_loss, outputs, batch, config, [2])
    check_split(ppo_loss, outputs, batch, config, [1, 3, 5])

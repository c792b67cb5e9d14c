"""The decoupled objective for stale samples: hand-computed losses, gradients and stats.

A batch with ``behaviour_logprobs`` holds samples drawn by an older policy: the ratio and the
clip are taken against ``old_logprobs`` (the proximal policy, at the start of the train step)
and each token's (GSPO: each row's) loss is weighted by ``pi_prox / pi_behav``.
"""

from __future__ import annotations

import math

import pytest
import torch
from areno_algos.common import token_clip_loss
from areno_algos.grpo import GRPOConfig
from areno_algos.gspo import GSPOConfig, gspo_loss
from areno_algos.ppo import PPOConfig, ppo_loss
from areno_algos.rloo import RLOOConfig

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
E = math.exp


def _batch(
    behaviour: list[float] | None, proximal: list[float], step: list[float], adv: list[float]
) -> tuple[dict, dict]:
    """One row: position 0 is the prompt; loss tokens 1.. have the given log-probabilities of
    the behaviour and proximal policies, and the current policy is ``proximal + step``."""
    prox = torch.tensor([[0.0, *proximal]], dtype=F64)
    batch = {
        "loss_mask": torch.tensor([[0.0] + [1.0] * len(proximal)], dtype=F64),
        "old_logprobs": prox,
        "advantages": torch.tensor([[0.0, *adv]], dtype=F64),
        "group_loss_tokens": float(len(proximal)),
        "group_sequences": 1.0,
    }
    if behaviour is not None:
        batch["behaviour_logprobs"] = torch.tensor([[0.0, *behaviour]], dtype=F64)
    current = prox + torch.tensor([[0.0, *step]], dtype=F64)
    return {"logprobs": current.requires_grad_(True)}, batch


# Token 1: ratio e^0.1 (inside the band), weight e^(-0.8 + 1.0) = e^0.2.
# Token 2: ratio e^0.3 (clipped at 1.2 with A > 0: no gradient), weight e^(-2.3 + 2.0) = e^-0.3.
BEHAVIOUR, PROXIMAL, STEP, ADV = [-1.0, -2.0], [-0.8, -2.3], [0.1, 0.3], [1.0, 1.0]


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [(token_clip_loss, GRPOConfig()), (token_clip_loss, RLOOConfig()), (ppo_loss, None)],
    ids=["grpo", "rloo", "ppo"],
)
def test_token_level_decoupled_loss_equals_hand_computed_reference(loss_fn, config) -> None:
    outputs, batch = _batch(BEHAVIOUR, PROXIMAL, STEP, ADV)
    if config is None:  # PPO: a critic that predicts its returns exactly, no KL term
        config = PPOConfig(use_kl_loss=False)
        outputs["values"] = torch.zeros(1, 3, dtype=F64)
        batch["values"] = torch.zeros(1, 3, dtype=F64)
        batch["returns"] = torch.zeros(1, 3, dtype=F64)
    loss, stats = loss_fn(outputs, batch, config)
    loss.backward()
    # (-e^0.2 * e^0.1 - e^-0.3 * 1.2) / 2 tokens
    expected = (-E(0.2) * E(0.1) - E(-0.3) * 1.2) / 2
    torch.testing.assert_close(stats["train/policy_loss"], torch.tensor(expected, dtype=F64), **TOL)
    # d loss / d logprob_1 = -w * ratio * A / 2; the clipped token has no gradient.
    grad = torch.tensor([[0.0, -E(0.2) * E(0.1) / 2, 0.0]], dtype=F64)
    torch.testing.assert_close(outputs["logprobs"].grad, grad, **TOL)
    # The ratio and its clip are against the proximal policy.
    torch.testing.assert_close(stats["train/ratio_max"], torch.tensor(E(0.3), dtype=F64))
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.5, dtype=F64))
    torch.testing.assert_close(
        stats["train/behaviour_weight_mean"], torch.tensor((E(0.2) + E(-0.3)) / 2, dtype=F64)
    )
    torch.testing.assert_close(stats["train/behaviour_weight_max"], torch.tensor(E(0.2), dtype=F64))
    torch.testing.assert_close(
        stats["train/behaviour_weight_min"], torch.tensor(E(-0.3), dtype=F64)
    )
    assert float(stats["train/behaviour_weight_capped"]) == 0.0


def test_grpo_decoupled_weight_truncated_at_the_cap() -> None:
    outputs, batch = _batch(BEHAVIOUR, PROXIMAL, STEP, ADV)
    loss, stats = token_clip_loss(outputs, batch, GRPOConfig(behaviour_weight_cap=1.1))
    loss.backward()
    # Token 1's weight e^0.2 = 1.2214 is truncated to 1.1; token 2's e^-0.3 is below the cap.
    expected = (-1.1 * E(0.1) - E(-0.3) * 1.2) / 2
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64), **TOL)
    torch.testing.assert_close(
        outputs["logprobs"].grad, torch.tensor([[0.0, -1.1 * E(0.1) / 2, 0.0]], dtype=F64)
    )
    torch.testing.assert_close(stats["train/behaviour_weight_capped"], torch.tensor(0.5, dtype=F64))
    torch.testing.assert_close(stats["train/behaviour_weight_max"], torch.tensor(1.1, dtype=F64))


def test_ppo_decoupled_weight_multiplies_the_dual_clipped_loss() -> None:
    # A = -1 and ratio e^1.5 = 4.48 > c = 3: the dual clip bounds the loss at 3 * |A| = 3;
    # the behaviour weight e^0.5 then scales it: 3 * e^0.5 (and no gradient).
    outputs, batch = _batch([-1.5], [-1.0], [1.5], [-1.0])
    outputs["values"] = torch.zeros(1, 2, dtype=F64)
    batch["values"] = torch.zeros(1, 2, dtype=F64)
    batch["returns"] = torch.zeros(1, 2, dtype=F64)
    loss, stats = ppo_loss(outputs, batch, PPOConfig(use_kl_loss=False))
    loss.backward()
    torch.testing.assert_close(
        stats["train/policy_loss"], torch.tensor(3.0 * E(0.5), dtype=F64), **TOL
    )
    assert float(stats["train/dual_clip_fraction"]) == 1.0
    assert float(outputs["logprobs"].grad.abs().sum()) == 0.0


def test_gspo_decoupled_sequence_weight_equals_hand_computed_reference() -> None:
    # Sequence weight exp(mean(prox - behav)) = exp((0.2 - 0.3) / 2) = e^-0.05; sequence ratio
    # exp(mean(0.02, 0.04)) = e^0.03, inside the band 1 +- 0.05, A = 1:
    # loss = -e^-0.05 * e^0.03 = -e^-0.02; d loss / d logprob_t = -e^-0.02 / 2 for both tokens.
    outputs, batch = _batch(BEHAVIOUR, PROXIMAL, [0.02, 0.04], ADV)
    config = GSPOConfig(gspo_clip_eps=0.05, gspo_clip_eps_high=0.05)
    loss, stats = gspo_loss(outputs, batch, config)
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-E(-0.02), dtype=F64), **TOL)
    torch.testing.assert_close(
        outputs["logprobs"].grad, torch.tensor([[0.0, -E(-0.02) / 2, -E(-0.02) / 2]], dtype=F64)
    )
    torch.testing.assert_close(
        stats["train/behaviour_weight_mean"], torch.tensor(E(-0.05), dtype=F64), **TOL
    )
    torch.testing.assert_close(stats["train/ratio_mean"], torch.tensor(E(0.03), dtype=F64))


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        (token_clip_loss, GRPOConfig()),
        (token_clip_loss, RLOOConfig()),
        (gspo_loss, GSPOConfig(gspo_clip_eps=0.05, gspo_clip_eps_high=0.05)),
    ],
    ids=["grpo", "rloo", "gspo"],
)
def test_behaviour_equal_to_proximal_gives_the_on_policy_loss(loss_fn, config) -> None:
    on_outputs, on_batch = _batch(None, PROXIMAL, STEP, ADV)
    off_outputs, off_batch = _batch(PROXIMAL, PROXIMAL, STEP, ADV)
    on_loss, on_stats = loss_fn(on_outputs, on_batch, config)
    off_loss, off_stats = loss_fn(off_outputs, off_batch, config)
    torch.testing.assert_close(off_loss, on_loss, **TOL)
    assert not any(k.startswith("train/behaviour_weight") for k in on_stats)
    torch.testing.assert_close(
        off_stats["train/behaviour_weight_mean"], torch.tensor(1.0, dtype=F64), **TOL
    )

"""GRPO: group-normalised advantages and the token-level clipped ratio loss."""

from __future__ import annotations

import math

import pytest
import torch
from areno_algos.common import LOSS_AGG_MODES, token_clip_loss
from areno_algos.grpo import GRPOConfig, grpo_advantages

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
E = math.exp


def _one_row(diffs: list[float], adv: list[float], tokens: float) -> tuple[dict, dict]:
    """A batch with rows whose loss tokens (positions 1..) have log-ratio ``diffs``."""
    old = torch.tensor([[0.0] + [-1.0] * len(diffs)], dtype=F64)
    new = old + torch.tensor([[0.0, *diffs]], dtype=F64)
    batch = {
        "loss_mask": torch.tensor([[0.0] + [1.0] * len(diffs)], dtype=F64),
        "old_logprobs": old,
        "advantages": torch.tensor([[0.0, *adv]], dtype=F64),
        "group_loss_tokens": tokens,
        "group_sequences": 1.0,
    }
    return {"logprobs": new.requires_grad_(True)}, batch


def test_grpo_advantages_group_of_three_normalised_and_broadcast() -> None:
    # rewards 0, 1, 2 in one group: mean 1, unbiased std 1 -> (-1, 0, 1) / (1 + 1e-6)
    batch = {
        "rewards": torch.tensor([0.0, 1.0, 2.0], dtype=F64),
        "group_index": torch.tensor([4, 4, 4]),
        "loss_mask": torch.tensor([[0, 1, 1], [0, 0, 1], [0, 1, 0]], dtype=F64),
    }
    out = grpo_advantages(batch, GRPOConfig())
    a = 1.0 / (1.0 + 1e-6)
    expected = torch.tensor([[0.0, -a, -a], [0.0, 0.0, 0.0], [0.0, a, 0.0]], dtype=F64)
    torch.testing.assert_close(out["advantages"], expected, **TOL)
    assert "advantages" not in batch  # the input batch is not modified


def test_grpo_advantages_scale_rewards_off_only_centres() -> None:
    batch = {
        "rewards": torch.tensor([0.0, 4.0], dtype=F64),
        "group_index": torch.tensor([0, 0]),
        "loss_mask": torch.tensor([[0, 1], [0, 1]], dtype=F64),
    }
    out = grpo_advantages(batch, GRPOConfig(scale_rewards=False))
    torch.testing.assert_close(out["advantages"][:, 1], torch.tensor([-2.0, 2.0], dtype=F64))


def test_grpo_loss_ratio_inside_band_equals_unclipped_surrogate() -> None:
    # log-ratios 0.1, -0.1 -> ratios e^0.1 = 1.105171, e^-0.1 = 0.904837, both in [0.8, 1.2]
    # A = 1: loss = (-1.105171 - 0.904837) / 2 tokens = -1.005004
    # grad wrt logprob_t = -ratio_t * A / 2
    outputs, batch = _one_row([0.1, -0.1], [1.0, 1.0], tokens=2.0)
    loss, stats = token_clip_loss(outputs, batch, GRPOConfig())
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-(E(0.1) + E(-0.1)) / 2, dtype=F64), **TOL)
    grad = outputs["logprobs"].grad
    torch.testing.assert_close(grad, torch.tensor([[0.0, -E(0.1) / 2, -E(-0.1) / 2]], dtype=F64))
    assert torch.all(grad[0, 1:] != 0)
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.0, dtype=F64))
    torch.testing.assert_close(
        stats["train/ratio_mean"], torch.tensor(1.0050041680558035, dtype=F64)
    )
    torch.testing.assert_close(stats["train/ratio_max"], torch.tensor(E(0.1), dtype=F64))
    torch.testing.assert_close(stats["train/ratio_min"], torch.tensor(E(-0.1), dtype=F64))
    # approx KL (k3 of KL(old || new)): r - 1 - log r = 0.0051709 and 0.0048374, mean 0.0050042
    torch.testing.assert_close(
        stats["train/approx_kl"], torch.tensor((E(0.1) - 1.1 + E(-0.1) - 0.9) / 2, dtype=F64)
    )


def test_grpo_loss_ratio_outside_band_is_clipped_with_zero_grad() -> None:
    # 4 tokens, band [0.8, 1.2]:
    #   A=+1, r=e^0.3=1.349859 -> clipped: -1.2, grad 0
    #   A=+1, r=e^0.1=1.105171 -> inside:  -1.105171, grad -1.105171/4
    #   A=-1, r=e^-0.3=0.740818 -> clipped: max(0.740818, 0.8) = 0.8, grad 0
    #   A=-1, r=e^0.3=1.349859 -> unclipped side: 1.349859, grad +1.349859/4
    # loss = (-1.2 - 1.105171 + 0.8 + 1.349859) / 4 = -0.038828
    outputs, batch = _one_row([0.3, 0.1, -0.3, 0.3], [1.0, 1.0, -1.0, -1.0], tokens=4.0)
    loss, stats = token_clip_loss(outputs, batch, GRPOConfig())
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-0.038828027624911166, dtype=F64), **TOL)
    expected_grad = torch.tensor([[0.0, 0.0, -E(0.1) / 4, 0.0, E(0.3) / 4]], dtype=F64)
    torch.testing.assert_close(outputs["logprobs"].grad, expected_grad, **TOL)
    assert outputs["logprobs"].grad[0, 1] == 0.0 and outputs["logprobs"].grad[0, 3] == 0.0
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.5, dtype=F64))


def test_grpo_loss_clip_higher_widens_upper_band_only() -> None:
    # eps_high 0.4 -> band [0.8, 1.4]: r = 1.349859 with A=+1 is no longer clipped
    outputs, batch = _one_row([0.3, -0.3], [1.0, -1.0], tokens=2.0)
    loss, stats = token_clip_loss(outputs, batch, GRPOConfig(grpo_clip_eps_high=0.4))
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor((-E(0.3) + 0.8) / 2, dtype=F64), **TOL)
    grad = outputs["logprobs"].grad
    torch.testing.assert_close(grad, torch.tensor([[0.0, -E(0.3) / 2, 0.0]], dtype=F64))
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.5, dtype=F64))


def test_grpo_loss_seq_mean_token_mean_weights_rows_equally() -> None:
    # ratio 1 everywhere (loss per token = -A). row 0: 1 token, A=2; row 1: 3 tokens, A=-1.
    # token-mean: (-2 + 3) / 4 = 0.25;  seq-mean-token-mean: (-2 + 1) / 2 = -0.5
    mask = torch.tensor([[0, 0, 0, 1], [0, 1, 1, 1]], dtype=F64)
    adv = torch.tensor([[0.0, 0.0, 0.0, 2.0], [0.0, -1.0, -1.0, -1.0]], dtype=F64)
    zeros = torch.zeros(2, 4, dtype=F64)
    batch = {
        "loss_mask": mask,
        "old_logprobs": zeros,
        "advantages": adv,
        "group_loss_tokens": 4.0,
        "group_sequences": 2.0,
    }
    tok, _ = token_clip_loss({"logprobs": zeros}, batch, GRPOConfig())
    seq, _ = token_clip_loss({"logprobs": zeros}, batch, GRPOConfig(loss_agg="seq-mean-token-mean"))
    torch.testing.assert_close(tok, torch.tensor(0.25, dtype=F64), **TOL)
    torch.testing.assert_close(seq, torch.tensor(-0.5, dtype=F64), **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_grpo_loss_split_into_microbatches_same_loss_grad_stats(
    mode: str, check_split, random_online_batch
) -> None:
    outputs, batch = random_online_batch(seed=11)
    config = GRPOConfig(grpo_clip_eps_high=0.28, loss_agg=mode)
    batch = grpo_advantages(batch, config)
    check_split(token_clip_loss, outputs, batch, config, [1])
    check_split(token_clip_loss, outputs, batch, config, [2, 3, 5])

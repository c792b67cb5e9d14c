"""RLOO: leave-one-out baseline and the token-level clipped ratio loss."""

from __future__ import annotations

import math

import pytest
import torch
from areno_algos.common import LOSS_AGG_MODES, token_clip_loss
from areno_algos.rloo import RLOOConfig, rloo_advantages

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
E = math.exp


def test_rloo_advantages_leave_one_out_baseline_broadcast_over_tokens() -> None:
    # rewards 1, 2, 3, 6 in one group: r_i - (12 - r_i) / 3 = -8/3, -4/3, 0, 4
    batch = {
        "rewards": torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=F64),
        "group_index": torch.tensor([0, 0, 0, 0]),
        "loss_mask": torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 0, 1]], dtype=F64),
    }
    out = rloo_advantages(batch, RLOOConfig())
    expected = torch.tensor(
        [[0, -8 / 3, -8 / 3], [0, -4 / 3, 0], [0, 0, 0], [0, 0, 4.0]], dtype=F64
    )
    torch.testing.assert_close(out["advantages"], expected, **TOL)


def test_rloo_advantages_two_groups_use_only_own_group() -> None:
    # group 0: rewards 1, 3 -> 1 - 3 = -2, 3 - 1 = 2; group 1: 5, 5 -> 0, 0
    batch = {
        "rewards": torch.tensor([1.0, 5.0, 3.0, 5.0], dtype=F64),
        "group_index": torch.tensor([0, 1, 0, 1]),
        "loss_mask": torch.ones(4, 1, dtype=F64),
    }
    out = rloo_advantages(batch, RLOOConfig())
    torch.testing.assert_close(
        out["advantages"][:, 0], torch.tensor([-2.0, 0.0, 2.0, 0.0], dtype=F64)
    )


def _batch(diffs: list[float], adv: list[float]) -> tuple[dict, dict]:
    n = len(diffs)
    old = torch.full((1, n + 1), -1.0, dtype=F64)
    new = (old + torch.tensor([[0.0, *diffs]], dtype=F64)).requires_grad_(True)
    batch = {
        "loss_mask": torch.tensor([[0.0] + [1.0] * n], dtype=F64),
        "old_logprobs": old,
        "advantages": torch.tensor([[0.0, *adv]], dtype=F64),
        "group_loss_tokens": float(n),
        "group_sequences": 1.0,
    }
    return {"logprobs": new}, batch


def test_rloo_loss_ratio_inside_band_equals_unclipped_surrogate() -> None:
    # A = -4/3, r = e^0.15 = 1.161834 (inside [0.8, 1.2]): loss = -r * A = 1.549112, grad = -r*A
    outputs, batch = _batch([0.15], [-4 / 3])
    loss, stats = token_clip_loss(outputs, batch, RLOOConfig())
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(E(0.15) * 4 / 3, dtype=F64), **TOL)
    torch.testing.assert_close(
        outputs["logprobs"].grad, torch.tensor([[0.0, E(0.15) * 4 / 3]], dtype=F64), **TOL
    )
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.0, dtype=F64))


def test_rloo_loss_ratio_outside_band_is_clipped_with_zero_grad() -> None:
    # A = 4, r = e^0.25 = 1.284025 > 1.2 -> loss = -1.2 * 4 = -4.8, grad 0
    # A = -8/3, r = e^-0.5 = 0.606531 < 0.8 -> loss = 0.8 * 8/3 = 2.133333, grad 0
    # mean over 2 tokens: (-4.8 + 2.133333) / 2 = -1.333333
    outputs, batch = _batch([0.25, -0.5], [4.0, -8 / 3])
    loss, stats = token_clip_loss(outputs, batch, RLOOConfig())
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor((-4.8 + 0.8 * 8 / 3) / 2, dtype=F64), **TOL)
    assert torch.equal(outputs["logprobs"].grad, torch.zeros(1, 3, dtype=F64))
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(1.0, dtype=F64))


def test_rloo_loss_clip_eps_option_moves_band() -> None:
    # clip_eps 0.3 -> band [0.7, 1.3]: r = 1.284025 with A = 4 is now inside
    outputs, batch = _batch([0.25], [4.0])
    loss, _ = token_clip_loss(outputs, batch, RLOOConfig(clip_eps=0.3))
    torch.testing.assert_close(loss, torch.tensor(-4.0 * E(0.25), dtype=F64), **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_rloo_loss_split_into_microbatches_same_loss_grad_stats(
    mode: str, check_split, random_online_batch
) -> None:
    outputs, batch = random_online_batch(seed=5)
    config = RLOOConfig(loss_agg=mode)
    batch = rloo_advantages(batch, config)
    check_split(token_clip_loss, outputs, batch, config, [3])
    check_split(token_clip_loss, outputs, batch, config, [1, 2, 4])

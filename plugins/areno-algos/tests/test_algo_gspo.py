"""GSPO: the sequence-level ratio, its clip, and the per-sequence loss."""

from __future__ import annotations

import math

import pytest
import torch
from areno_algos.common import LOSS_AGG_MODES
from areno_algos.gspo import GSPOConfig, gspo_advantages, gspo_loss, sequence_ratio

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
E = math.exp


def _batch(diffs: list[list[float]], adv: list[float]) -> tuple[dict, dict]:
    """Rows of 2 loss tokens (positions 1, 2) with the given log-ratios and row advantages."""
    rows = len(diffs)
    old = torch.full((rows, 3), -2.0, dtype=F64)
    new = old + torch.tensor([[0.0, *d] for d in diffs], dtype=F64)
    mask = torch.tensor([[0.0, 1.0, 1.0]] * rows, dtype=F64)
    batch = {
        "loss_mask": mask,
        "old_logprobs": old,
        "advantages": torch.tensor(adv, dtype=F64)[:, None] * mask,
        "group_loss_tokens": 2.0 * rows,
        "group_sequences": float(rows),
    }
    return {"logprobs": new.requires_grad_(True)}, batch


def test_sequence_ratio_is_exp_of_mean_token_log_ratio() -> None:
    # row 0: log-ratios 0.2, 0.4 -> exp(0.3); row 1 has no loss tokens -> 1
    logprobs = torch.tensor([[0.0, 0.2, 0.4], [5.0, 5.0, 5.0]], dtype=F64)
    mask = torch.tensor([[0, 1, 1], [0, 0, 0]], dtype=F64)
    out = sequence_ratio(logprobs, torch.zeros_like(logprobs), mask)
    torch.testing.assert_close(out, torch.tensor([E(0.3), 1.0], dtype=F64), **TOL)


def test_gspo_advantages_group_normalised_per_row() -> None:
    batch = {
        "rewards": torch.tensor([1.0, 3.0], dtype=F64),
        "group_index": torch.tensor([0, 0]),
        "loss_mask": torch.tensor([[0, 1], [0, 1]], dtype=F64),
    }
    # mean 2, unbiased std sqrt(2) -> -/+ 1 / (sqrt(2) + 1e-6)
    a = 1.0 / (math.sqrt(2.0) + 1e-6)
    out = gspo_advantages(batch, GSPOConfig())
    torch.testing.assert_close(out["advantages"], torch.tensor([[0, -a], [0, a]], dtype=F64))


def test_gspo_loss_sequence_ratio_inside_band_equals_unclipped_surrogate() -> None:
    # log-ratios 0.0002, 0 -> s = e^0.0001 = 1.0001, inside [1 - 3e-4, 1 + 4e-4]
    # A = 1: loss = -s; ds/dlogprob_t = s / 2 (mean over 2 tokens) -> grad -s/2 per token
    outputs, batch = _batch([[2e-4, 0.0]], [1.0])
    loss, stats = gspo_loss(outputs, batch, GSPOConfig())
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-E(1e-4), dtype=F64), **TOL)
    torch.testing.assert_close(
        outputs["logprobs"].grad, torch.tensor([[0.0, -E(1e-4) / 2, -E(1e-4) / 2]], dtype=F64)
    )
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.0, dtype=F64))


def test_gspo_loss_clip_is_on_the_sequence_not_the_tokens() -> None:
    # token log-ratios +0.5 / -0.5 are far outside any token band, but s = e^0 = 1 is inside:
    # nothing is clipped; loss = -1 * A(=2) = -2 and each token gets grad -A * s / 2 = -1
    outputs, batch = _batch([[0.5, -0.5]], [2.0])
    loss, stats = gspo_loss(outputs, batch, GSPOConfig())
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-2.0, dtype=F64), **TOL)
    torch.testing.assert_close(
        outputs["logprobs"].grad, torch.tensor([[0.0, -1.0, -1.0]], dtype=F64), **TOL
    )
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.0, dtype=F64))


def test_gspo_loss_sequence_ratio_outside_band_is_clipped_with_zero_grad() -> None:
    # 4 sequences, band [0.9997, 1.0004]:
    #   row 0: s = e^0.0001, A=+1 -> inside:         -e^0.0001,  grad -e^0.0001 / 2 / 4
    #   row 1: s = e^0.001,  A=+1 -> above, clipped: -1.0004,    grad 0
    #   row 2: s = e^-0.001, A=-1 -> below, clipped: +0.9997,    grad 0
    #   row 3: s = e^0.001,  A=-1 -> unclipped side: +e^0.001,   grad +e^0.001 / 2 / 4
    # loss = (-e^0.0001 - 1.0004 + 0.9997 + e^0.001) / 4
    outputs, batch = _batch(
        [[2e-4, 0.0], [1e-3, 1e-3], [-1e-3, -1e-3], [2e-3, 0.0]], [1.0, 1.0, -1.0, -1.0]
    )
    loss, stats = gspo_loss(outputs, batch, GSPOConfig())
    loss.backward()
    expected = (-E(1e-4) - 1.0004 + 0.9997 + E(1e-3)) / 4
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64), **TOL)
    g0, g3 = -E(1e-4) / 8, E(1e-3) / 8
    expected_grad = torch.tensor(
        [[0.0, g0, g0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, g3, g3]], dtype=F64
    )
    torch.testing.assert_close(outputs["logprobs"].grad, expected_grad, **TOL)
    assert torch.all(outputs["logprobs"].grad[1:3] == 0)
    # per-sequence stats: 2 of 4 sequences clipped; ratio stats over sequence ratios
    torch.testing.assert_close(stats["train/clip_fraction"], torch.tensor(0.5, dtype=F64))
    torch.testing.assert_close(stats["train/ratio_max"], torch.tensor(E(1e-3), dtype=F64))
    torch.testing.assert_close(stats["train/ratio_min"], torch.tensor(E(-1e-3), dtype=F64))
    torch.testing.assert_close(
        stats["train/ratio_mean"],
        torch.tensor((E(1e-4) + E(1e-3) + E(-1e-3) + E(1e-3)) / 4, dtype=F64),
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gspo_loss_split_into_microbatches_same_loss_grad_stats(
    mode: str, check_split, random_online_batch
) -> None:
    outputs, batch = random_online_batch(seed=7)
    # a band wide enough that some sequences are inside and some outside it
    config = GSPOConfig(gspo_clip_eps=0.1, gspo_clip_eps_high=0.15, loss_agg=mode)
    batch = gspo_advantages(batch, config)
    check_split(gspo_loss, outputs, batch, config, [2])
    check_split(gspo_loss, outputs, batch, config, [1, 4])

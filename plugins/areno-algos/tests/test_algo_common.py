"""Hand-checked values for the shared helpers in areno_algos.common."""

from __future__ import annotations

import math

import pytest
import torch
from areno_algos.common import (
    aggregate_loss,
    broadcast_over_tokens,
    clipped_surrogate,
    combine_stats,
    dual_clip,
    group_mean_std,
    group_normalized_rewards,
    kl_estimate,
    leave_one_out_advantages,
    masked_mean,
    masked_whiten,
)

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
LN2 = math.log(2.0)


def t(*values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# ----------------------------------------------------------------------------- aggregation

# row 0: masked tokens 1, 2, 3 -> sum 6, mean 2 (the 9 at position 0 is a prompt token)
# row 1: masked tokens 4, 8    -> sum 12, mean 6 (nan at a masked-out position must not leak)
PER_TOKEN = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 4.0, 8.0, float("nan")]], dtype=F64)
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=F64)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 18.0 / 5.0),  # (6 + 12) / 5 tokens
        ("seq-mean-token-mean", (2.0 + 6.0) / 2.0),  # (mean row 0 + mean row 1) / 2 rows
        ("seq-mean-token-sum", (6.0 + 12.0) / 2.0),  # (sum row 0 + sum row 1) / 2 rows
    ],
)
def test_aggregate_loss_whole_group_matches_hand_values(mode: str, expected: float) -> None:
    out = aggregate_loss(PER_TOKEN, MASK, mode, group_loss_tokens=5.0, group_sequences=2.0)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=F64), **TOL)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 18.0 / 10.0),  # this microbatch is part of a group of 10 tokens
        ("seq-mean-token-mean", 8.0 / 4.0),  # ... and 4 sequences
        ("seq-mean-token-sum", 18.0 / 4.0),
    ],
)
def test_aggregate_loss_part_of_group_divides_by_group_normalisers(
    mode: str, expected: float
) -> None:
    out = aggregate_loss(PER_TOKEN, MASK, mode, group_loss_tokens=10.0, group_sequences=4.0)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=F64), **TOL)


def test_aggregate_loss_unknown_mode_raises_valueerror() -> None:
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate_loss(PER_TOKEN, MASK, "mean", 5.0, 2.0)


def test_masked_mean_row_without_tokens_is_zero() -> None:
    x = t([1.0, 2.0], [3.0, 4.0])
    mask = t([1.0, 1.0], [0.0, 0.0])
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), t(1.5, 0.0), **TOL)


def test_masked_whiten_loss_tokens_have_mean_zero_std_one() -> None:
    x = t([100.0, 1.0, 2.0, 3.0], [100.0, 4.0, 100.0, 5.0])
    mask = t([0, 1, 1, 1], [0, 1, 0, 1])
    out = masked_whiten(x, mask)
    picked = out[mask > 0]
    # values 1..5: mean 3, unbiased var (4+1+0+1+4)/4 = 2.5
    torch.testing.assert_close(picked, (t(1, 2, 3, 4, 5) - 3.0) / math.sqrt(2.5 + 1e-8), **TOL)
    assert torch.all(out[mask == 0] == 0)


# ----------------------------------------------------------------------------- KL estimators


# p(a) = 0.5, ref(a) = 0.25: log(p / ref) = ln 2
#   k1 = ln 2 = 0.693147...
#   k2 = 0.5 * (ln 2)^2 = 0.240227...
#   k3 = ref/p - 1 - ln(ref/p) = 0.5 - 1 + ln 2 = 0.193147...
# p(a) = 0.25, ref(a) = 0.5: log(p / ref) = -ln 2
#   k1 = -ln 2; k2 = 0.5 * (ln 2)^2; k3 = 2 - 1 - ln 2 = 0.306853...
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", (LN2, -LN2, 0.0)),
        ("k2", (0.5 * LN2**2, 0.5 * LN2**2, 0.0)),
        ("k3", (0.5 - 1.0 + LN2, 2.0 - 1.0 - LN2, 0.0)),
        ("low_var_kl", (0.5 - 1.0 + LN2, 2.0 - 1.0 - LN2, 0.0)),
    ],
)
def test_kl_estimate_known_probabilities_match_hand_values(
    kind: str, expected: tuple[float, float, float]
) -> None:
    logp = t(math.log(0.5), math.log(0.25), math.log(0.3))
    ref = t(math.log(0.25), math.log(0.5), math.log(0.3))
    torch.testing.assert_close(kl_estimate(logp, ref, kind), t(*expected), **TOL)


def test_kl_estimate_low_var_kl_extreme_ratio_is_clamped_to_ten() -> None:
    # ref/p = e^30 (log clamped to 20) and e^-30: both estimates exceed 10 and are capped.
    out = kl_estimate(t(-30.0, 0.0), t(0.0, -30.0), "low_var_kl")
    torch.testing.assert_close(out, t(10.0, 10.0), **TOL)


def test_kl_estimate_unknown_kind_raises_valueerror() -> None:
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate(t(0.0), t(0.0), "k4")


# ----------------------------------------------------------------------------- clipping


def test_clipped_surrogate_each_case_matches_hand_values() -> None:
    # eps 0.2 -> band [0.8, 1.2]
    ratio = t(1.1, 1.5, 0.5, 1.5, 0.5)
    adv = t(2.0, 2.0, -1.0, -1.0, 1.0)
    loss, binds = clipped_surrogate(ratio, adv, 0.2, 0.2)
    # inside:             -1.1 * 2            = -2.2
    # above, A > 0:       -min(3.0, 1.2 * 2)  = -2.4   (clip binds)
    # below, A < 0:       -min(-0.5, -0.8)    = 0.8    (clip binds)
    # above, A < 0:       -min(-1.5, -1.2)    = 1.5    (unclipped side wins)
    # below, A > 0:       -min(0.5, 0.8)      = -0.5   (unclipped side wins)
    torch.testing.assert_close(loss, t(-2.2, -2.4, 0.8, 1.5, -0.5), **TOL)
    assert binds.tolist() == [False, True, True, False, False]


def test_clipped_surrogate_asymmetric_band_uses_eps_high_above() -> None:
    # band [0.8, 1.28], A = 1: 1.3 is clipped to 1.28, 1.25 is inside; 0.7 with A = -1 -> 0.8
    loss, binds = clipped_surrogate(t(1.3, 1.25, 0.7), t(1.0, 1.0, -1.0), 0.2, 0.28)
    torch.testing.assert_close(loss, t(-1.28, -1.25, 0.8), **TOL)
    assert binds.tolist() == [True, False, True]


def test_dual_clip_negative_advantage_caps_loss_at_c_times_abs_advantage() -> None:
    # A = -2 with ratio 5: clipped-surrogate loss 10 > 3 * 2 -> 6. A = -2, ratio 1.3: 2.6 stays.
    # A = +2, ratio 5: clipped at 1.2 -> -2.4, the dual clip leaves positive advantages alone.
    ratio, adv = t(5.0, 1.3, 5.0), t(-2.0, -2.0, 2.0)
    loss, _ = clipped_surrogate(ratio, adv, 0.2, 0.2)
    capped, active = dual_clip(loss, adv, 3.0)
    torch.testing.assert_close(capped, t(6.0, 2.6, -2.4), **TOL)
    assert active.tolist() == [True, False, False]


# ----------------------------------------------------------------------------- groups

# group 7 (rows 0, 2, 4): rewards 1, 2, 3 -> mean 2, unbiased std sqrt((1+0+1)/2) = 1
# group 3 (rows 1, 3, 5): rewards 10, 20, 30 -> mean 20, std sqrt((100+0+100)/2) = 10
REWARDS = t(1.0, 10.0, 2.0, 20.0, 3.0, 30.0)
GROUPS = torch.tensor([7, 3, 7, 3, 7, 3])


def test_group_mean_std_interleaved_groups_match_hand_values() -> None:
    mean, std, count = group_mean_std(REWARDS, GROUPS)
    torch.testing.assert_close(mean, t(2, 20, 2, 20, 2, 20), **TOL)
    torch.testing.assert_close(std, t(1, 10, 1, 10, 1, 10), **TOL)
    torch.testing.assert_close(count, t(3, 3, 3, 3, 3, 3), **TOL)


def test_group_normalized_rewards_scaled_divides_by_std_plus_eps() -> None:
    out = group_normalized_rewards(REWARDS, GROUPS)
    a, b = 1.0 / (1.0 + 1e-6), 10.0 / (10.0 + 1e-6)
    torch.testing.assert_close(out, t(-a, -b, 0.0, 0.0, a, b), **TOL)


def test_group_normalized_rewards_unscaled_only_centres() -> None:
    out = group_normalized_rewards(REWARDS, GROUPS, scale=False)
    torch.testing.assert_close(out, t(-1.0, -10.0, 0.0, 0.0, 1.0, 10.0), **TOL)


def test_group_normalized_rewards_constant_or_single_group_gives_zero() -> None:
    out = group_normalized_rewards(t(0.5, 0.5, 4.0), torch.tensor([0, 0, 1]))
    torch.testing.assert_close(out, t(0.0, 0.0, 0.0), **TOL)


def test_leave_one_out_advantages_group_of_four_matches_hand_values() -> None:
    # rewards 1, 2, 3, 6 (sum 12): baseline_i = (12 - r_i) / 3
    #   1 - 11/3 = -8/3;  2 - 10/3 = -4/3;  3 - 9/3 = 0;  6 - 6/3 = 4
    # a lone row in group 9 gets 0 (no other sample to compare with)
    rewards = t(1.0, 2.0, 5.0, 3.0, 6.0)
    groups = torch.tensor([0, 0, 9, 0, 0])
    out = leave_one_out_advantages(rewards, groups)
    torch.testing.assert_close(out, t(-8 / 3, -4 / 3, 0.0, 0.0, 4.0), **TOL)


def test_broadcast_over_tokens_fills_only_loss_tokens() -> None:
    out = broadcast_over_tokens(t(2.0, -1.0), t([0, 1, 1], [0, 0, 1]))
    torch.testing.assert_close(out, t([0.0, 2.0, 2.0], [0.0, 0.0, -1.0]), **TOL)


# ----------------------------------------------------------------------------- stats


def test_combine_stats_suffixes_pick_sum_max_min() -> None:
    a = {"train/x": t(0.25), "train/ratio_max": t(1.5), "train/ratio_min": t(0.9)}
    b = {"train/x": t(0.5), "train/ratio_max": t(1.2), "train/ratio_min": t(0.7)}
    out = combine_stats([a, b])
    torch.testing.assert_close(out["train/x"], t(0.75), **TOL)
    torch.testing.assert_close(out["train/ratio_max"], t(1.5), **TOL)
    torch.testing.assert_close(out["train/ratio_min"], t(0.7), **TOL)

"""SFT loss: hand values and group normalisation across microbatches."""

from __future__ import annotations

import torch
from areno_algos.sft import SFTConfig, sft_loss

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}

# row 0: targets at positions 1..3 with logprobs -1, -2, -3 -> sum -6
# row 1: targets at positions 1..2 with logprobs -0.5, -0.5 -> sum -1
# group: 5 target tokens -> loss = -(-6 - 1) / 5 = 1.4
LOGPROBS = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -0.5, -0.5, -9.0]], dtype=F64)
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=F64)


def _batch(mask: torch.Tensor) -> dict:
    return {"loss_mask": mask, "group_loss_tokens": 5.0, "group_sequences": 2.0}


def test_sft_loss_two_rows_is_mean_nll_over_group_tokens() -> None:
    logprobs = LOGPROBS.clone().requires_grad_(True)
    entropy = torch.full_like(LOGPROBS, 0.5)
    loss, stats = sft_loss({"logprobs": logprobs, "entropy": entropy}, _batch(MASK), SFTConfig())
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(1.4, dtype=F64), **TOL)
    torch.testing.assert_close(stats["train/nll"], torch.tensor(1.4, dtype=F64), **TOL)
    torch.testing.assert_close(stats["train/entropy"], torch.tensor(0.5, dtype=F64), **TOL)
    # d loss / d logprob = -1/5 on every target token, 0 elsewhere
    torch.testing.assert_close(logprobs.grad, -MASK / 5.0, **TOL)


def test_sft_loss_microbatch_of_group_divides_by_group_tokens() -> None:
    # row 1 alone, still part of the 5-token group: -(-1) / 5 = 0.2 (not 1 / 2 = 0.5)
    loss, _ = sft_loss({"logprobs": LOGPROBS[1:]}, _batch(MASK[1:]), SFTConfig())
    torch.testing.assert_close(loss, torch.tensor(0.2, dtype=F64), **TOL)


def test_sft_loss_split_into_microbatches_same_loss_and_grad(check_split) -> None:
    gen = torch.Generator().manual_seed(1)
    mask = (torch.rand(5, 6, generator=gen) > 0.3).to(F64)
    mask[:, 0] = 0.0
    outputs = {"logprobs": -torch.rand(5, 6, generator=gen, dtype=F64)}
    check_split(sft_loss, outputs, {"loss_mask": mask}, SFTConfig(), [2])
    check_split(sft_loss, outputs, {"loss_mask": mask}, SFTConfig(), [1, 3, 4])

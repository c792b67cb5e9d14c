from __future__ import annotations

import math

import torch

from areno_core.train.forward import token_entropy_from_logits, token_logprobs_from_logits


def test_token_logprobs_align_with_predicted_token_and_respect_temperature():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # p(next=2) = 3/6 at temperature 1
    ids = torch.tensor([[1, 2, 0]])
    out = token_logprobs_from_logits(logits, ids)
    assert out.shape == (1, 3)
    torch.testing.assert_close(out[0, 0], torch.tensor(0.0))
    torch.testing.assert_close(out[0, 1], torch.tensor(math.log(0.5)), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0, 2], torch.tensor(math.log(0.25)), atol=1e-6, rtol=0)
    hot = token_logprobs_from_logits(logits, ids, temperature=2.0)
    # logits / 2: weights sqrt(3), 1, 1, 1 -> p(2) = sqrt(3) / (sqrt(3) + 3)
    expected = math.log(math.sqrt(3) / (math.sqrt(3) + 3))
    torch.testing.assert_close(hot[0, 1], torch.tensor(expected), atol=1e-6, rtol=0)


def test_token_entropy_of_uniform_distribution_is_log_vocab():
    logits = torch.zeros(2, 3, 8)
    ent = token_entropy_from_logits(logits)
    torch.testing.assert_close(ent[:, 1:], torch.full((2, 2), math.log(8)), atol=1e-6, rtol=0)
    assert ent[:, 0].abs().max() == 0

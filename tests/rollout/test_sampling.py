"""Unit tests for the pure sampling helpers, on tiny hand-computed distributions."""

from __future__ import annotations

import math

import pytest
import torch

from areno_core.rollout import sampling
from areno_core.rollout.sampling import (
    apply_top_k_top_p,
    counter_uniform,
    sample_from_uniform,
    sample_next,
    stream_state,
    stream_uniform,
    validate_sampling,
)
from areno_core.types import SamplingParams


def _kept(logits: torch.Tensor) -> list[list[int]]:
    return [torch.isfinite(row).nonzero().flatten().tolist() for row in logits]


def test_top_k_distinct_logits_keeps_exactly_k_largest() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = apply_top_k_top_p(logits, top_k=2)
    assert _kept(out) == [[1, 3]]
    torch.testing.assert_close(out[0, [1, 3]], logits[0, [1, 3]], rtol=0.0, atol=0.0)


def test_top_k_tied_logits_keeps_exactly_k() -> None:
    out = apply_top_k_top_p(torch.zeros(3, 6), top_k=2)
    assert all(len(row) == 2 for row in _kept(out))


def test_top_k_disabled_or_too_large_returns_input_unchanged() -> None:
    logits = torch.tensor([[0.5, -1.0, 2.0]])
    assert apply_top_k_top_p(logits, top_k=-1) is logits
    assert apply_top_k_top_p(logits, top_k=3) is logits
    assert apply_top_k_top_p(logits, top_k=0, top_p=1.0) is logits


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [(0.4, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (0.99, [0, 1, 2, 3])],
)
def test_top_p_sorted_probs_keeps_smallest_prefix_reaching_p(
    top_p: float, expected: list[int]
) -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert _kept(apply_top_k_top_p(logits, top_p=top_p)) == [expected]


def test_top_p_shuffled_vocab_keeps_same_tokens() -> None:
    probs = torch.tensor([0.15, 0.05, 0.5, 0.3])  # the table above, permuted
    out = apply_top_k_top_p(probs.log().unsqueeze(0), top_p=0.75)
    assert _kept(out) == [[2, 3]]


def test_top_p_after_top_k_renormalises_before_cutting() -> None:
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # Alone, p=0.75 needs three tokens (0.4 + 0.3 < 0.75); after k=3 the mass is
    # 0.444 + 0.333 >= 0.75, so two tokens suffice.
    assert _kept(apply_top_k_top_p(logits, top_p=0.75)) == [[0, 1, 2]]
    assert _kept(apply_top_k_top_p(logits, top_k=3, top_p=0.75)) == [[0, 1]]


def test_top_p_tiny_p_keeps_the_most_likely_token() -> None:
    logits = torch.tensor([[0.1, 2.0, 0.3]])
    assert _kept(apply_top_k_top_p(logits, top_p=1e-6)) == [[1]]


def test_sample_next_greedy_returns_argmax_and_untempered_logprob() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.5]])
    params = SamplingParams(greedy=True, temperature=0.3)
    tokens, logprobs = sample_next(logits, params)
    assert tokens.tolist() == [1, 0]
    expected = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logprobs, expected, rtol=0.0, atol=1e-6)


def test_sample_next_zero_temperature_is_greedy() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0]])
    tokens, _ = sample_next(logits, SamplingParams(temperature=0.0))
    assert tokens.tolist() == [1]


def test_sample_next_truncated_sampling_reports_untruncated_tempered_logprob() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.5, 1.5]])
    params = SamplingParams(temperature=0.5, top_k=1)
    tokens, logprobs = sample_next(logits, params, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [1]
    expected = math.log(torch.softmax(logits[0] / 0.5, -1)[1].item())
    torch.testing.assert_close(logprobs, torch.tensor([expected]), rtol=0.0, atol=1e-6)


def test_sample_next_same_generator_seed_gives_same_tokens() -> None:
    logits = torch.randn(64, 11, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=0.9, top_p=0.9)
    a, _ = sample_next(logits, params, torch.Generator().manual_seed(7))
    b, _ = sample_next(logits, params, torch.Generator().manual_seed(7))
    c, _ = sample_next(logits, params, torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sample_next_many_draws_match_tempered_distribution() -> None:
    probs = torch.tensor([0.1, 0.2, 0.7])
    logits = (probs.log() * 2.0).expand(40_000, 3)  # temperature 2 gives back ``probs``
    generator = torch.Generator().manual_seed(0)
    tokens, _ = sample_next(logits, SamplingParams(temperature=2.0), generator)
    freq = torch.bincount(tokens, minlength=3).float() / tokens.numel()
    torch.testing.assert_close(freq, probs, rtol=0.0, atol=0.01)


@pytest.mark.parametrize(
    ("uniform", "expected"), [(0.0, 0), (0.1, 0), (0.3, 1), (0.69, 1), (0.71, 2), (0.9999, 2)]
)
def test_sample_from_uniform_inverts_the_cdf(uniform: float, expected: int) -> None:
    probs = torch.tensor([[0.2, 0.5, 0.3]])
    assert sample_from_uniform(probs, torch.tensor([uniform])).tolist() == [expected]


@pytest.mark.parametrize("uniform", [0.0, 0.25, 0.5, 0.75, 0.9999999])
def test_sample_from_uniform_zero_probability_tokens_never_picked(uniform: float) -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]])
    assert sample_from_uniform(probs, torch.tensor([uniform])).item() in (1, 3)


def test_counter_uniform_same_triple_any_batch_gives_same_value() -> None:
    keys = torch.tensor([5, 9, 5, 0], dtype=torch.long)
    counters = torch.tensor([2, 2, 2, 7], dtype=torch.long)
    u = counter_uniform(123, keys, counters)
    alone = counter_uniform(123, keys[1:2], counters[1:2])
    assert u[0] == u[2]
    assert u[1] == alone[0]
    assert not torch.equal(u, counter_uniform(124, keys, counters))


def test_counter_uniform_many_values_look_uniform_in_open_interval() -> None:
    keys = torch.arange(200, dtype=torch.long).repeat_interleave(100)
    counters = torch.arange(100, dtype=torch.long).repeat(200)
    u = counter_uniform(2**40 + 17, keys, counters)
    assert bool(((u > 0) & (u < 1)).all())
    assert u.unique().numel() > 19_900
    torch.testing.assert_close(u.mean(), torch.tensor(0.5), rtol=0.0, atol=0.01)
    torch.testing.assert_close(u.var(), torch.tensor(1 / 12), rtol=0.0, atol=0.005)


def test_stream_state_many_keys_gives_distinct_non_negative_states() -> None:
    keys = torch.cat([torch.arange(100_000), torch.arange(100_000) + 2**33])
    states = stream_state(7, keys)
    assert bool((states >= 0).all())
    assert states.unique().numel() == keys.numel()


def test_stream_uniform_equals_counter_uniform_for_same_seed_and_key() -> None:
    keys = torch.tensor([0, 1, 2**40], dtype=torch.long)
    counters = torch.tensor([0, 5, 3], dtype=torch.long)
    torch.testing.assert_close(
        stream_uniform(stream_state(99, keys), counters),
        counter_uniform(99, keys, counters),
        rtol=0.0,
        atol=0.0,
    )


def test_counter_uniform_values_are_pinned() -> None:
    # The streams decide every sampled token: these numbers must never change (taken before
    # the CPU path moved to numpy).
    keys = torch.tensor([0, 1, 2**40 + 3], dtype=torch.long)
    counters = torch.tensor([0, 5, 2**31], dtype=torch.long)
    u = counter_uniform(7, keys, counters)
    assert u.dtype == torch.float32
    assert u.tolist() == [0.0376400351524353, 0.22197586297988892, 0.32681888341903687]


def test_stream_uniform_on_cpu_equals_the_tensor_arithmetic() -> None:
    # The CPU path hashes in numpy; the same rounds on torch tensors (the GPU path) agree.
    gen = torch.Generator().manual_seed(3)
    states = stream_state(2**33 + 5, torch.randint(0, 2**40, (500,), generator=gen))
    counters = torch.randint(0, 2**31, (500,), generator=gen)
    h = sampling._mix32(((states >> 32) ^ counters) & sampling._MASK32)
    h = sampling._mix32(h ^ (states & sampling._MASK32))
    expected = ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))
    with torch.inference_mode():  # as in the engine
        assert torch.equal(stream_uniform(states, counters), expected)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=0),
        SamplingParams(temperature=-0.1),
        SamplingParams(top_p=0.0),
        SamplingParams(top_p=1.5),
        SamplingParams(top_k=-2),
    ],
)
def test_validate_sampling_bad_values_raise_value_error(params: SamplingParams) -> None:
    with pytest.raises(ValueError):
        validate_sampling(params)

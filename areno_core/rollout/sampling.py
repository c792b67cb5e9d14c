"""Pure tensor helpers for picking the next token of many sequences at once.

Everything here works on a ``[B, V]`` logits tensor (one row per running sequence) with tensor
ops only, so a decode step samples every row in a few kernels and never leaves the device.

Conventions (shared with :class:`areno_core.types.Completion`):

* the sampling distribution is ``softmax(truncate(logits / temperature))`` where ``truncate``
  applies top-k then top-p;
* the log-probability reported for a sampled token is ``log_softmax(logits / temperature)`` at
  that token, taken *before* truncation, with temperature 1 for greedy decoding.

Random draws come either from a ``torch.Generator`` or from :func:`counter_uniform`, a hash of
``(seed, sequence key, token index)``. The second gives every sequence its own random stream,
so what a sequence samples does not depend on which other sequences share its batch.
"""

from __future__ import annotations

from typing import TypeVar

import attrs
import numpy as np
import torch

from areno_core.types import SamplingParams

_MASK32 = 0xFFFFFFFF
# The stream hashes run on torch tensors or numpy arrays of int64 alike.
Int64s = TypeVar("Int64s", torch.Tensor, np.ndarray)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """One draw of a random-stream seed from ``generator`` (torch's global one when None).

    The run owns the random generators; an engine only sees the seed, in
    ``SamplingParams.seed``, so every engine samples reproducibly from the same run state.
    """
    device = generator.device if generator is not None else torch.device("cpu")
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())


def seeded(params: SamplingParams, generator: torch.Generator | None) -> SamplingParams:
    """``params`` with a seed: its own, else one drawn from ``generator`` (greedy decoding
    draws nothing: it uses no random numbers, so it leaves every random stream as it was)."""
    if params.seed is not None:
        return params
    return attrs.evolve(params, seed=0 if is_greedy(params) else draw_seed(generator))


def is_greedy(params: SamplingParams) -> bool:
    """Greedy decoding is asked for explicitly or by a temperature of 0."""
    return params.greedy or params.temperature == 0.0


def validate_sampling(params: SamplingParams) -> None:
    """Raise ``ValueError`` for sampling parameters no engine can honour."""
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1:
        raise ValueError(f"top_k must be -1 (disabled) or a positive integer, got {params.top_k}")
    if params.prompt_offset < 0:
        raise ValueError(f"prompt_offset must be >= 0, got {params.prompt_offset}")


def apply_top_k_top_p(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Return ``logits`` [B, V] with every token outside the kept set replaced by ``-inf``.

    Top-k keeps exactly ``top_k`` tokens per row (ties broken by ``torch.topk``); ``top_k <= 0``
    or ``top_k >= V`` disables it. Top-p then keeps, in the distribution left by top-k, the
    smallest prefix of tokens sorted by probability whose total mass reaches ``top_p``; the most
    likely token is always kept. ``top_p >= 1`` disables it. The input is not modified.
    """
    vocab = logits.shape[-1]
    use_k = 0 < top_k < vocab
    use_p = top_p < 1.0
    if not use_k and not use_p:
        return logits
    if not use_p:
        kept, index = logits.topk(top_k, dim=-1)
        return torch.full_like(logits, float("-inf")).scatter_(-1, index, kept)
    ordered, order = logits.sort(dim=-1, descending=True)
    if use_k:
        ordered[..., top_k:] = float("-inf")
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = mass_before >= top_p
    drop[..., 0] = False
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ordered)


def sample_from_uniform(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Draw one token per row of ``probs`` [B, V] by inverting its CDF at ``uniform`` [B].

    ``uniform`` holds numbers in [0, 1). Tokens of probability zero are never returned.
    """
    cdf = probs.cumsum(dim=-1)
    target = uniform.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    tokens = tokens.clamp_(max=probs.shape[-1] - 1)
    # Rounding can push the target past the last kept token; fall back to the mode then.
    picked = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    kept = picked > 0
    if probs.device.type == "cpu" and bool(kept.all()):  # (the usual case: no mode needed)
        return tokens
    return torch.where(kept, tokens, probs.argmax(dim=-1))


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    uniform: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` [B, V]; return ``(token_ids [B] long, logprobs [B])``.

    Greedy decoding takes the argmax. Otherwise tokens are drawn from the tempered, truncated
    distribution using ``uniform`` [B] (numbers in [0, 1)) when given, else fresh uniforms from
    ``generator`` (or torch's global generator). Log-probabilities are float32 and follow the
    module's convention (tempered, untruncated).
    """
    logits = logits.float()
    if is_greedy(params):
        logprobs = logits.log_softmax(dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    # (dividing by 1.0 returns every value unchanged: skip the operation)
    scaled = logits if params.temperature == 1.0 else logits / params.temperature
    logprobs = scaled.log_softmax(dim=-1)
    probs = apply_top_k_top_p(scaled, params.top_k, params.top_p).softmax(dim=-1)
    if uniform is None:
        device = generator.device if generator is not None else logits.device
        uniform = torch.rand(logits.shape[0], generator=generator, device=device)
        uniform = uniform.to(logits.device)
    tokens = sample_from_uniform(probs, uniform)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _mul32(x: Int64s, constant: int) -> Int64s:
    """``(x * constant) mod 2**32`` for int64 ``x`` in [0, 2**32) without int64 overflow."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: Int64s) -> Int64s:
    """A 32-bit integer finaliser (xorshift-multiply rounds) on int64 tensors."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_state(seed: int, keys: torch.Tensor) -> torch.Tensor:
    """Per-sequence random-stream states (int64, 63 bits) for ``seed`` and ``keys`` (int64, >= 0).

    Two independent 32-bit hashes of ``(seed, key)`` are packed together, so two keys share a
    stream only if both hashes collide. Feed the result to :func:`stream_uniform`.
    """
    seed &= (1 << 64) - 1
    if keys.device.type == "cpu" and keys.dtype == torch.int64:  # in numpy, as stream_uniform
        return torch.from_numpy(_stream_state(seed, keys.numpy(), np.full_like(keys.numpy(), 0)))
    return _stream_state(seed, keys, torch.zeros_like(keys))


def _stream_state(seed: int, keys: Int64s, zeros: Int64s) -> Int64s:
    base = _mix32(zeros + (seed & _MASK32))
    base = _mix32(base ^ (seed >> 32))
    first = _mix32(_mix32(base ^ (keys & _MASK32)) ^ (keys >> 32))
    second = _mix32(_mix32((base ^ 0x5BD1E995) ^ (keys >> 32)) ^ (keys & _MASK32))
    return ((first & 0x7FFFFFFF) << 32) | second


def stream_uniform(states: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Uniform float32 numbers in (0, 1): draw number ``counters`` of each stream in ``states``.

    Costs two hash rounds per element, so it is cheap enough to call once per decode step.
    On a CPU the rounds run in numpy (the same integer arithmetic, so the same numbers): each
    of their ~40 operations on a decode step's few hundred rows costs a microsecond there
    against several as a torch operation.
    """
    if states.device.type == "cpu" and states.dtype == counters.dtype == torch.int64:
        h = _mix32(((states.numpy() >> 32) ^ counters.numpy()) & _MASK32)
        h = _mix32(h ^ (states.numpy() & _MASK32))
        scaled = ((h >> 9).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / (1 << 23))
        return torch.from_numpy(scaled)
    h = _mix32(((states >> 32) ^ counters) & _MASK32)
    h = _mix32(h ^ (states & _MASK32))
    # 23 bits keep ``k + 0.5`` exact in float32, so the result never rounds to 0 or 1.
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


def counter_uniform(seed: int, keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Uniform float32 numbers in (0, 1), one per element of ``keys`` / ``counters`` (int64).

    The result is a fixed function of ``(seed, key, counter)``: the same triple gives the same
    number on any device and in any batch, and different triples give independent-looking
    numbers. Keys and counters must be non-negative (counters below 2**32).
    """
    return stream_uniform(stream_state(seed, keys), counters)


__all__ = [
    "apply_top_k_top_p",
    "counter_uniform",
    "is_greedy",
    "sample_from_uniform",
    "sample_next",
    "stream_state",
    "stream_uniform",
    "validate_sampling",
]

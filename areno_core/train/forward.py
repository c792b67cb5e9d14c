"""Scoring tokens with a model: per-token log-probabilities, entropies and values."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def token_logprobs_from_logits(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``out[:, t]`` = log p(input_ids[:, t] | input_ids[:, :t]); ``out[:, 0]`` = 0.

    ``logits`` is the model output [B, T, V] (position t predicts token t + 1).
    """
    logp = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (1, 0), value=0.0)


def token_entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the next-token distribution that predicted each token, aligned like logprobs."""
    logp = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return F.pad(entropy, (1, 0), value=0.0)


def policy_outputs(
    model: Any,
    batch: dict[str, Any],
    *,
    temperature: float = 1.0,
    need_entropy: bool = False,
) -> dict[str, torch.Tensor]:
    """Run ``model`` on a microbatch and return ``logprobs`` (and ``entropy``) [B, T]."""
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    )
    logits = out.logits
    result = {"logprobs": token_logprobs_from_logits(logits, batch["input_ids"], temperature)}
    if need_entropy:
        with torch.no_grad():
            result["entropy"] = token_entropy_from_logits(logits.detach(), temperature)
    return result


def value_outputs(critic: Any, batch: dict[str, Any]) -> torch.Tensor:
    """Per-token values [B, T] from a critic; ``values[:, t]`` is the value before token t.

    The critic reads the prefix up to t - 1, so its output at position t - 1 is shifted right
    by one to align with the token it values.
    """
    values = critic(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return F.pad(values[:, :-1].float(), (1, 0), value=0.0)

"""A reward model as a reward function (``--reward-ckpt``): each sample is scored by the
model's value at its last token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from areno_core.models.loading import load_value_model


def reward_model_fn(
    ref: str,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    attn_implementation: str | None = None,
) -> Callable[[Any], float]:
    """A reward function over rollout records (``prompt_ids`` + ``token_ids``) that scores each
    with the reward model at ``ref``, loaded on ``device`` in ``dtype``."""
    scorer = load_value_model(
        ref,
        device=str(device),
        role="reward",
        dtype=dtype,
        attn_implementation=attn_implementation,
    )
    scorer.eval()

    def reward_fn(record: Any) -> float:
        ids = torch.tensor([[*record.prompt_ids, *record.token_ids]], device=device)
        with torch.no_grad():
            return float(scorer.score_last(ids, torch.ones_like(ids))[0])

    return reward_fn


__all__ = ["reward_model_fn"]

"""A reward model as a reward function (``--reward-ckpt``): each sample is scored by the
model's value at its last token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from areno_core.accel.attention import attention_of
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


def reward_model_beside(model: Any, ref: str) -> Callable[[Any], float]:
    """:func:`reward_model_fn` for ``ref`` loaded as the policy of ``model`` (a
    :class:`~areno_core.model.TrainableModel`) is: same device, dtype and attention."""
    return reward_model_fn(
        ref,
        device=model.device,
        dtype=model.dtype,
        attn_implementation=attention_of(model.policy),
    )


__all__ = ["reward_model_beside", "reward_model_fn"]

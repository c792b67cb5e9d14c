"""GSPO: group sequence policy optimisation, the clip applied to a sequence-level ratio.

    areno train --algo gspo --recipe math/gsm8k --n-samples 8

Advantages: as GRPO, the row's reward normalised within its group, ``(r - mean) / (std + 1e-6)``.

Loss: for row ``i`` with loss tokens ``t``, the sequence ratio is the geometric mean of the token
ratios, ``s_i = exp(mean_t(logprobs - old_logprobs))``. Each row contributes
``-min(s_i * A_i, clip(s_i, 1 - gspo_clip_eps, 1 + gspo_clip_eps_high) * A_i)``; with the default
``seq-mean-token-mean`` aggregation the loss is the mean of that over the group's sequences.
The gradient reaches every token of the row through ``s_i`` (``d s_i = s_i * mean_t d logprobs``),
and is exactly zero for a row whose clip binds. The band is narrow (3e-4 / 4e-4, the GSPO
paper's values) because a sequence ratio moves much less than a token ratio.

Other ``loss_agg`` values spread the row's loss over its tokens (``token-mean`` weights a row by
its length; ``seq-mean-token-sum`` multiplies it by its length).

Stale samples (``--async-rollout``): with ``behaviour_logprobs`` in the batch the sequence
ratio is taken against the proximal policy (``old_logprobs``) and each row's loss is
multiplied by the sequence-level importance weight ``exp(mean_t(old_logprobs -
behaviour_logprobs))``, the same geometric mean the ratio uses (truncated at
``behaviour_weight_cap``); see docs/async.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from areno_algos.common import (
    LOG_RATIO_LIMIT,
    aggregate_loss,
    behaviour_stats,
    behaviour_weight_cap_field,
    clipped_surrogate,
    group_normalized_rewards,
    loss_agg_field,
    masked_mean,
    policy_stats,
)
from areno_algos.group import group_advantages, group_policy_spec
from areno_core.options import option
from areno_core.validators import number

DEFAULT_LOSS_AGG = "seq-mean-token-mean"


@attrs.frozen
class GSPOConfig:
    gspo_clip_eps: float = option(
        3e-4, "GSPO lower clip on the sequence ratio.", validator=number(min=0.0)
    )
    gspo_clip_eps_high: float = option(
        4e-4, "GSPO upper clip on the sequence ratio.", validator=number(min=0.0)
    )
    loss_agg: str | None = loss_agg_field(DEFAULT_LOSS_AGG)
    behaviour_weight_cap: float | None = behaviour_weight_cap_field()


def gspo_advantages(batch: dict[str, Any], config: GSPOConfig) -> dict[str, Any]:
    return group_advantages(batch, group_normalized_rewards, "gspo")


def sequence_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``exp(mean over the row's loss tokens of (logprobs - old_logprobs))``. ``[B, T] -> [B]``.

    A row without loss tokens gets ratio 1.
    """
    log_ratio = masked_mean(logprobs - old_logprobs, mask, dim=-1)
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def gspo_loss(
    outputs: Mapping[str, Any], batch: Mapping[str, Any], config: GSPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logprobs, old = outputs["logprobs"], batch["old_logprobs"]
    mask, tokens, seqs = batch["loss_mask"], batch["group_loss_tokens"], batch["group_sequences"]
    seq_ratio = sequence_ratio(logprobs, old, mask)
    # The advantage is constant over a row's loss tokens: read it back as a per-row value.
    seq_adv = masked_mean(batch["advantages"], mask, dim=-1)
    row_loss, clipped = clipped_surrogate(
        seq_ratio, seq_adv, config.gspo_clip_eps, config.gspo_clip_eps_high
    )
    weight = None
    if "behaviour_logprobs" in batch:
        weight = sequence_ratio(old.detach(), batch["behaviour_logprobs"], mask)
        if config.behaviour_weight_cap is not None:
            weight = weight.clamp(max=config.behaviour_weight_cap)
        row_loss = row_loss * weight
    per_token = row_loss[:, None].expand_as(logprobs)
    loss = aggregate_loss(per_token, mask, config.loss_agg or DEFAULT_LOSS_AGG, tokens, seqs)

    has_tokens = (mask > 0).any(dim=-1)
    ratio = seq_ratio.detach()
    stats = {
        "train/policy_loss": loss.detach(),
        # Per sequence: clipped rows / group_sequences; ratio stats over sequence ratios.
        "train/clip_fraction": (clipped & has_tokens).to(ratio.dtype).sum() / seqs,
        **policy_stats(
            ratio,
            logprobs,
            old,
            mask,
            tokens,
            outputs,
            ratio_mean=torch.where(has_tokens, ratio, torch.zeros_like(ratio)).sum() / seqs,
            ratio_mask=has_tokens,
        ),
    }
    if weight is not None:  # per sequence, like the ratio stats
        stats.update(behaviour_stats(weight, has_tokens, seqs, config.behaviour_weight_cap))
    return loss, {k: v.detach() for k, v in stats.items()}


SPEC = group_policy_spec(
    name="gspo",
    summary="Group sequence policy optimisation: group-normalised rewards, sequence-level clip.",
    config_cls=GSPOConfig,
    loss=gspo_loss,
    advantages=gspo_advantages,
)

"""GRPO: group-relative policy optimisation with a token-level clipped ratio.

    areno train --algo grpo --recipe math/gsm8k --n-samples 8

Advantages: each prompt is sampled ``--n-samples`` times; a row's advantage is its reward
normalised within its group, ``(r - mean) / (std + 1e-6)`` (only ``r - mean`` with
``scale_rewards`` off), the same value on every loss token of the row.

Loss: with ``ratio = exp(logprobs - old_logprobs)`` per token (``old_logprobs`` are the rollout
policy's), the PPO clipped surrogate ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)``,
aggregated with ``loss_agg`` (default ``token-mean``). ``grpo_clip_eps_high`` gives the
asymmetric "clip-higher" band of DAPO.

Stale samples (``--async-rollout``): when the batch carries ``behaviour_logprobs`` the ratio
and the clip are taken against the proximal policy (``old_logprobs``, the policy at the start
of the train step) and each token's loss is multiplied by the importance weight
``pi_prox / pi_behav`` (truncated at ``behaviour_weight_cap``); see docs/async.md.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from areno_algos.common import (
    TOKEN_CLIP_LOSS_AGG,
    behaviour_weight_cap_field,
    group_normalized_rewards,
    loss_agg_field,
)
from areno_algos.group import group_advantages, group_policy_spec
from areno_core.options import option
from areno_core.validators import boolean, number

DEFAULT_LOSS_AGG = TOKEN_CLIP_LOSS_AGG


@attrs.frozen
class GRPOConfig:
    grpo_clip_eps: float = option(
        0.2, "GRPO clip on the token ratio (the lower side of the band).", validator=number(min=0.0)
    )
    grpo_clip_eps_high: float | None = option(
        None,
        "GRPO upper clip on the token ratio (DAPO's clip-higher).",
        validator=number(min=0.0),
        default_text="--grpo-clip-eps",
    )
    scale_rewards: bool = option(
        True,
        "GRPO: divide group-centred rewards by the group's reward std.",
        validator=boolean,
        negatable=True,
    )
    loss_agg: str | None = loss_agg_field(DEFAULT_LOSS_AGG)
    behaviour_weight_cap: float | None = behaviour_weight_cap_field()

    @property
    def eps_low(self) -> float:
        return self.grpo_clip_eps

    @property
    def eps_high(self) -> float:
        return self.grpo_clip_eps if self.grpo_clip_eps_high is None else self.grpo_clip_eps_high


def grpo_advantages(batch: dict[str, Any], config: GRPOConfig) -> dict[str, Any]:
    normalise = functools.partial(group_normalized_rewards, scale=config.scale_rewards)
    return group_advantages(batch, normalise, "grpo")


SPEC = group_policy_spec(
    name="grpo",
    summary="Group-relative policy optimisation: group-normalised rewards, token-level clip.",
    config_cls=GRPOConfig,
    advantages=grpo_advantages,
)

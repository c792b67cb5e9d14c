"""RLOO: REINFORCE with a leave-one-out baseline, plus a token-level clipped ratio.

    areno train --algo rloo --recipe math/gsm8k --n-samples 8

Advantages: a row's baseline is the mean reward of the *other* rows sampled for the same prompt,
``A_i = r_i - mean_{j != i} r_j``, the same value on every loss token of the row. It needs no
critic and, unlike GRPO, does not divide by the group's std. A prompt sampled once gets 0.

Loss: the PPO clipped surrogate on the token ratio ``exp(logprobs - old_logprobs)`` with the
band ``[1 - clip_eps, 1 + clip_eps]`` (so several updates per rollout batch stay close to the
sampling policy), aggregated with ``loss_agg`` (default ``token-mean``). Stale samples
(``--async-rollout``) get the decoupled objective, as in GRPO (see docs/async.md).
"""

from __future__ import annotations

from typing import Any

import attrs

from areno_algos.common import (
    TOKEN_CLIP_LOSS_AGG,
    behaviour_weight_cap_field,
    clip_eps_field,
    leave_one_out_advantages,
    loss_agg_field,
)
from areno_algos.group import group_advantages, group_policy_spec

DEFAULT_LOSS_AGG = TOKEN_CLIP_LOSS_AGG


@attrs.frozen
class RLOOConfig:
    clip_eps: float = clip_eps_field()
    loss_agg: str | None = loss_agg_field(DEFAULT_LOSS_AGG)
    behaviour_weight_cap: float | None = behaviour_weight_cap_field()

    @property
    def eps_low(self) -> float:
        return self.clip_eps

    @property
    def eps_high(self) -> float:
        return self.clip_eps


def rloo_advantages(batch: dict[str, Any], config: RLOOConfig) -> dict[str, Any]:
    return group_advantages(batch, leave_one_out_advantages, "rloo")


SPEC = group_policy_spec(
    name="rloo",
    summary="REINFORCE leave-one-out: baseline from the group's other samples, token clip.",
    config_cls=RLOOConfig,
    advantages=rloo_advantages,
)

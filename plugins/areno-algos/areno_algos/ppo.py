"""PPO: actor-critic with GAE, a dual-clipped policy loss, a clipped value loss and a KL loss.

    areno train --algo ppo --ckpt /path/to/policy --ref-ckpt /path/to/reference \\
        --critic-ckpt /path/to/critic --dataset-path /path/to/data

Roles: a critic (required; the backend returns its ``values`` [B, T] next to the policy's
logprobs), a reference model (needed while ``use_kl_loss`` is on, the default), and optionally a
reward model that produces the rows' scalar rewards. ``values[:, t]`` is the critic's estimate
for the state in which token ``input_ids[:, t]`` is chosen.

Advantages (once per rollout batch, on the old values):

* token rewards: the row's scalar reward on its **last** loss token, 0 elsewhere. When a
  reference is present but ``use_kl_loss`` is off, the KL penalty moves into the reward instead:
  ``kl_loss_coef * KL(old || ref)`` (estimator ``kl_loss_type``) is subtracted on every loss
  token;
* GAE over each row's loss tokens only: tokens outside the loss mask (prompt, tool results) are
  skipped, so the "next state" of an action is the next action. With the value after the last
  action taken as 0::

      delta_t = r_t + gamma * V(next action) - V_t,   A_t = delta_t + gamma * lam * A_(next action)

* ``returns = A + V`` (the value target), then ``A`` is whitened over all loss tokens of the batch.

The batch also gets ``rollout_stats``, a dict of 0-dim tensors to log once per rollout batch
(**not** a per-row tensor, so the core must not slice it into microbatches):
``rollout/explained_variance`` = ``1 - Var(R - V_old) / Var(R)`` over the batch's loss tokens
(nan when ``Var(R)`` is 0) and, when the KL penalty is in the reward, ``rollout/kl_penalty``.
Explained variance is a ratio of variances, so it cannot be summed across microbatches; taken
here, it is exact over the whole batch and shows how well the critic predicted the returns it is
about to be trained on.

Loss (per microbatch, every term aggregated with ``loss_agg``, default ``token-mean``)::

    policy: max(-r*A, -clip(r, 1 - clip_eps, 1 + clip_eps)*A), and for A < 0 at most
            clip_ratio_c * |A|   (dual clip)
    value:  0.5 * max((V - R)^2, (clip(V, V_old - value_clip_eps, V_old + value_clip_eps) - R)^2)
    kl:     kl_loss_type estimate of KL(pi || ref) per token
    loss  = policy + value_loss_coef * value + kl_loss_coef * kl     (kl only with use_kl_loss)

Stale samples (``--async-rollout``): with ``behaviour_logprobs`` in the batch, ``r`` is taken
against the proximal policy (``old_logprobs``) and the dual-clipped policy term of each token
is multiplied by ``pi_prox / pi_behav`` (truncated at ``behaviour_weight_cap``); see
docs/async.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from areno_algos.common import (
    KL_TYPES,
    ONLINE_ROW_SCHEMA,
    aggregate_loss,
    behaviour_stats,
    behaviour_weight,
    behaviour_weight_cap_field,
    broadcast_over_tokens,
    clip_eps_field,
    clipped_surrogate,
    dual_clip,
    importance_ratio,
    kl_estimate,
    loss_agg_field,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_stats,
    require,
    token_share,
)
from areno_core.algorithm import AlgorithmSpec
from areno_core.options import option
from areno_core.validators import boolean, number

DEFAULT_LOSS_AGG = "token-mean"


@attrs.frozen
class PPOConfig:
    clip_eps: float = clip_eps_field()
    clip_ratio_c: float = option(
        3.0,
        "PPO dual-clip bound c (> 1): a negative-advantage token's loss is at most c·|A|.",
        validator=number(min=1.0, min_inclusive=False),
    )
    value_clip_eps: float = option(0.5, "PPO value clipping range.", validator=number(min=0.0))
    value_loss_coef: float = option(0.5, "PPO value loss weight.", validator=number(min=0.0))
    gamma: float = option(1.0, "PPO discount for GAE.", validator=number(min=0.0, max=1.0))
    lam: float = option(0.95, "PPO GAE lambda.", validator=number(min=0.0, max=1.0))
    use_kl_loss: bool = option(
        True,
        "PPO: add a KL loss against the reference model.",
        validator=boolean,
        negatable=True,
    )
    kl_loss_coef: float = option(0.001, "PPO KL loss weight.", validator=number(min=0.0))
    kl_loss_type: str = option(
        "low_var_kl", "PPO KL estimator (low_var_kl is k3).", choices=KL_TYPES
    )
    loss_agg: str | None = loss_agg_field(DEFAULT_LOSS_AGG)
    behaviour_weight_cap: float | None = behaviour_weight_cap_field()


def last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, T]``: true at each row's last loss token."""
    active = mask > 0
    remaining = active.flip(-1).to(torch.int64).cumsum(-1).flip(-1)  # loss tokens at or after t
    return active & (remaining == 1)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's loss tokens. Returns (advantages, returns).

    Positions outside the mask are skipped (they get 0) and do not break the recursion. The loop
    runs backwards over the T positions, each step vectorised over the rows; it runs once per
    rollout batch, outside the loss.
    """
    with torch.no_grad():
        active = mask > 0
        rows = values.shape[0]
        next_value = values.new_zeros(rows)
        running = values.new_zeros(rows)
        columns: list[torch.Tensor] = []
        for t in range(values.shape[1] - 1, -1, -1):
            on = active[:, t]
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * running
            columns.append(torch.where(on, adv_t, torch.zeros_like(adv_t)))
            running = torch.where(on, adv_t, running)
            next_value = torch.where(on, values[:, t], next_value)
        advantages = torch.stack(columns[::-1], dim=1)
        returns = torch.where(active, advantages + values, torch.zeros_like(values))
    return advantages, returns


def explained_variance(
    returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``1 - Var(R - V) / Var(R)`` over the loss tokens; nan when ``Var(R)`` is 0."""
    var_returns = masked_var(returns, mask)
    ratio = masked_var(returns - values, mask) / var_returns
    return torch.where(var_returns > 0, 1.0 - ratio, torch.full_like(ratio, float("nan")))


def ppo_advantages(batch: dict[str, Any], config: PPOConfig) -> dict[str, Any]:
    require(batch, ("rewards", "loss_mask", "values"), "ppo")
    mask = batch["loss_mask"]
    values = batch["values"].detach()
    token_rewards = broadcast_over_tokens(batch["rewards"], last_token_mask(mask)).to(values.dtype)
    rollout_stats: dict[str, torch.Tensor] = {}
    if not config.use_kl_loss and "ref_logprobs" in batch:
        require(batch, ("old_logprobs",), "ppo (KL penalty in the reward)")
        kl = kl_estimate(batch["old_logprobs"], batch["ref_logprobs"], config.kl_loss_type)
        kl = torch.where(mask > 0, kl, torch.zeros_like(kl)).detach()
        token_rewards = token_rewards - config.kl_loss_coef * kl
        rollout_stats["rollout/kl_penalty"] = masked_mean(kl, mask)
    advantages, returns = gae(token_rewards, values, mask, config.gamma, config.lam)
    rollout_stats["rollout/explained_variance"] = explained_variance(returns, values, mask)
    return {
        **batch,
        "advantages": masked_whiten(advantages, mask),
        "returns": returns,
        "rollout_stats": rollout_stats,
    }


def ppo_loss(
    outputs: Mapping[str, Any], batch: Mapping[str, Any], config: PPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logprobs, old = outputs["logprobs"], batch["old_logprobs"]
    mask, tokens, seqs = batch["loss_mask"], batch["group_loss_tokens"], batch["group_sequences"]
    mode = config.loss_agg or DEFAULT_LOSS_AGG
    advantages = batch["advantages"]

    ratio = importance_ratio(logprobs, old)
    pg, clipped = clipped_surrogate(ratio, advantages, config.clip_eps, config.clip_eps)
    pg, dual_clipped = dual_clip(pg, advantages, config.clip_ratio_c)
    weight = behaviour_weight(batch, old, config.behaviour_weight_cap)
    if weight is not None:
        pg = pg * weight
    policy_loss = aggregate_loss(pg, mask, mode, tokens, seqs)

    values, old_values, returns = outputs["values"], batch["values"], batch["returns"]
    values_clipped = old_values + (values - old_values).clamp(
        -config.value_clip_eps, config.value_clip_eps
    )
    vf_unclipped = (values - returns) ** 2
    vf_clipped = (values_clipped - returns) ** 2
    vf = 0.5 * torch.maximum(vf_unclipped, vf_clipped)
    value_loss = aggregate_loss(vf, mask, mode, tokens, seqs)

    loss = policy_loss + config.value_loss_coef * value_loss
    stats = {
        "train/policy_loss": policy_loss.detach(),
        "train/value_loss": value_loss.detach(),
        "train/clip_fraction": token_share(clipped.to(ratio.dtype), mask, tokens),
        "train/dual_clip_fraction": token_share(dual_clipped.to(ratio.dtype), mask, tokens),
        "train/value_clip_fraction": token_share(
            (vf_clipped > vf_unclipped).to(ratio.dtype), mask, tokens
        ),
        **policy_stats(ratio, logprobs, old, mask, tokens, outputs),
    }
    if weight is not None:
        stats.update(behaviour_stats(weight, mask, tokens, config.behaviour_weight_cap))
    if config.use_kl_loss:
        if "ref_logprobs" not in batch:
            raise KeyError(
                "ppo: use_kl_loss is on but the batch has no ref_logprobs; give a reference "
                "model (--ref-ckpt) or turn the KL loss off (--no-use-kl-loss)"
            )
        kl_tokens = kl_estimate(logprobs, batch["ref_logprobs"], config.kl_loss_type)
        kl = aggregate_loss(kl_tokens, mask, mode, tokens, seqs)
        loss = loss + config.kl_loss_coef * kl
        stats["train/kl"] = kl.detach()
    return loss, stats


SPEC = AlgorithmSpec(
    name="ppo",
    summary="Proximal policy optimisation with a critic: GAE, dual clip, value clip, KL loss.",
    kind="online",
    row_schema=ONLINE_ROW_SCHEMA,
    config_cls=PPOConfig,
    loss=ppo_loss,
    advantages=ppo_advantages,
    roles=frozenset({"critic"}),
    optional_roles=frozenset({"reference", "reward_model"}),
    wants_reference=lambda config: config.use_kl_loss,
    needs_values=True,
    decoupled=True,
    proximal_in_advantages=True,  # the KL penalty in the reward reads old_logprobs
)

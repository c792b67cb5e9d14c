"""Pure tensor helpers shared by the algorithms in this package.

Everything here is a function of tensors: no Python loops over elements, and nothing in the
loss-side helpers moves a value from the device to the host (no ``.item()``/``.tolist()``).
Per-token tensors are ``[B, T]`` and aligned with ``input_ids``; ``mask`` is the loss mask
(1.0 where the token is a trainable action).

Normalisers
    A loss is computed on one microbatch but divided by numbers that describe the whole
    accumulation group (``group_loss_tokens``, ``group_sequences``), so that summing the
    microbatch losses gives the group's loss exactly, whatever the microbatch split.

Loss aggregation (``loss_agg``)
    ``token-mean``           sum of every loss token's value / ``group_loss_tokens``
    ``seq-mean-token-mean``  each row's mean over its loss tokens, summed / ``group_sequences``
    ``seq-mean-token-sum``   each row's sum over its loss tokens, summed / ``group_sequences``

How the core combines stats across microbatches
    Every loss returns ``stats``: detached 0-dim tensors. A key is combined over the
    microbatches of one accumulation group by **summing**, because its value is already
    divided by a group normaliser (for example ``train/clip_fraction`` is "clipped tokens in
    this microbatch / group_loss_tokens"). Two exceptions, decided by the key's suffix:

    * a key ending in ``_max`` is already a maximum over the microbatch: combine with ``max``;
    * a key ending in ``_min`` is already a minimum over the microbatch: combine with ``min``.

    :func:`combine_stats` implements this rule and is the reference for the core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

from areno_core.algorithm import RowSchema
from areno_core.options import option
from areno_core.validators import number

Tensor = torch.Tensor
Normaliser = float | Tensor

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")

# The rows the loader of an online (rollout) algorithm must produce.
ONLINE_ROW_SCHEMA = RowSchema(
    required={"prompt": (str, list)},
    optional={"answer": (str, int, float), "solutions": (list, tuple)},
    description="prompt: text or a list of chat messages; answer / solutions: what the reward "
    "function checks against.",
)

# Log-ratios are clamped before exp() so a wildly off token cannot overflow to inf.
LOG_RATIO_LIMIT = 20.0
# The k3 estimate is clamped from above, as is usual, so one token cannot dominate a batch.
KL_VALUE_LIMIT = 10.0


# --------------------------------------------------------------------------------------------
# Combining stats
# --------------------------------------------------------------------------------------------


def combine_stats(per_microbatch: Iterable[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Combine the stats of the microbatches of one accumulation group (see module docstring)."""
    out: dict[str, Tensor] = {}
    for stats in per_microbatch:
        for key, value in stats.items():
            if key not in out:
                out[key] = value
            elif key.endswith("_max"):
                out[key] = torch.maximum(out[key], value)
            elif key.endswith("_min"):
                out[key] = torch.minimum(out[key], value)
            else:
                out[key] = out[key] + value
    return out


# --------------------------------------------------------------------------------------------
# Masked reductions
# --------------------------------------------------------------------------------------------


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is nonzero (masked positions may hold anything, even nan)."""
    picked = torch.where(mask > 0, x, torch.zeros_like(x))
    return picked.sum() if dim is None else picked.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the masked positions; 0 where there are none."""
    count = (mask > 0).to(x.dtype)
    count = count.sum() if dim is None else count.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all masked positions (Bessel-corrected by default)."""
    count = (mask > 0).to(x.dtype).sum()
    mean = masked_sum(x, mask) / count.clamp(min=1.0)
    sq = masked_sum((x - mean) ** 2, mask)
    denom = (count - 1.0) if unbiased else count
    return sq / denom.clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Shift and scale ``x`` to mean 0 and (unbiased) std 1 over the masked positions.

    Masked-out positions come back as 0.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return torch.where(mask > 0, out, torch.zeros_like(out))


def tokens_per_row(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Number of loss tokens of each row, as a ``[B]`` tensor of ``dtype``."""
    return (mask > 0).to(dtype).sum(-1)


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    group_loss_tokens: Normaliser,
    group_sequences: Normaliser,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to this microbatch's share of the group loss."""
    if mode == "token-mean":
        return masked_sum(per_token, mask) / group_loss_tokens
    row_sum = masked_sum(per_token, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return row_sum.sum() / group_sequences
    if mode == "seq-mean-token-mean":
        row_mean = row_sum / tokens_per_row(mask, row_sum.dtype).clamp(min=1.0)
        return row_mean.sum() / group_sequences
    raise ValueError(
        f"unknown loss aggregation {mode!r}; choose one of: {', '.join(LOSS_AGG_MODES)}"
    )


def token_share(x: Tensor, mask: Tensor, group_loss_tokens: Normaliser) -> Tensor:
    """A per-token stat as this microbatch's share of the group's token mean (detached)."""
    return (masked_sum(x.detach(), mask) / group_loss_tokens).detach()


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest value over the masked positions (``-inf`` when there are none), detached."""
    x = x.detach()
    return torch.where(mask > 0, x, torch.full_like(x, float("-inf"))).max()


def masked_min(x: Tensor, mask: Tensor) -> Tensor:
    """Smallest value over the masked positions (``+inf`` when there are none), detached."""
    x = x.detach()
    return torch.where(mask > 0, x, torch.full_like(x, float("inf"))).min()


# --------------------------------------------------------------------------------------------
# Ratios, clipping, KL
# --------------------------------------------------------------------------------------------


def importance_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """Per-token ratio ``pi(a) / pi_old(a)``; the log-ratio is clamped to +-20 before exp."""
    return torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate, as a loss: ``max(-r*A, -clip(r, 1-eps_low, 1+eps_high)*A)``.

    Returns ``(loss, clipped)`` elementwise; ``clipped`` is a bool tensor that is true where
    the clip binds (ratio above the band with ``A > 0``, or below it with ``A < 0``). There the
    loss is a constant, so its gradient with respect to the ratio is exactly zero.
    """
    unclipped = -ratio * advantages
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, -clipped_ratio * advantages)
    binds = ((advantages > 0) & (ratio > 1.0 + eps_high)) | (
        (advantages < 0) & (ratio < 1.0 - eps_low)
    )
    return loss, binds


def dual_clip(loss: Tensor, advantages: Tensor, clip_ratio_c: float) -> tuple[Tensor, Tensor]:
    """Bound the clipped loss of negative-advantage tokens by ``clip_ratio_c * |A|``.

    Without it a token with ``A < 0`` and a huge ratio contributes an unbounded loss. Returns
    ``(loss, bound_active)``; where the bound is active the loss is constant (zero gradient).
    """
    cap = -clip_ratio_c * advantages
    negative = advantages < 0
    active = negative & (loss > cap)
    return torch.where(active, cap, loss), active


# --------------------------------------------------------------------------------------------
# The decoupled objective (stale samples, see docs/async.md)
# --------------------------------------------------------------------------------------------


def behaviour_weight(
    batch: Mapping[str, Any], old_logprobs: Tensor, cap: float | None
) -> Tensor | None:
    """Per-token ``pi_prox(a) / pi_behav(a)``, detached, or None for an on-policy batch.

    The core puts ``behaviour_logprobs`` (those of the policy that sampled) into a batch only
    when some of its samples come from a policy older than the one at the start of the train
    step; ``old_logprobs`` then hold that proximal policy's log-probabilities. The weight is
    truncated at ``cap`` when one is given (``None``: no truncation).
    """
    behaviour = batch.get("behaviour_logprobs")
    if behaviour is None:
        return None
    weight = importance_ratio(old_logprobs.detach(), behaviour)
    return weight if cap is None else weight.clamp(max=cap)


def behaviour_stats(
    weight: Tensor, mask: Tensor, normaliser: Normaliser, cap: float | None
) -> dict[str, Tensor]:
    """``train/behaviour_weight_*`` of a decoupled batch: the mean (a share of ``normaliser``,
    the group's token or sequence count, matching how ``weight`` is laid out), the microbatch
    extremes, and the share of weights the cap truncated."""
    capped = weight >= cap if cap is not None else torch.zeros_like(weight, dtype=torch.bool)
    return {
        "train/behaviour_weight_mean": token_share(weight, mask, normaliser),
        "train/behaviour_weight_max": masked_max(weight, mask),
        "train/behaviour_weight_min": masked_min(weight, mask),
        "train/behaviour_weight_capped": token_share(capped.to(weight.dtype), mask, normaliser),
    }


def behaviour_weight_cap_field() -> Any:
    """The ``behaviour_weight_cap`` option of the algorithms with the decoupled objective."""
    return option(
        None,
        "Decoupled objective (stale samples of --async-rollout): truncate each importance "
        "weight pi_proximal / pi_behaviour at this value.",
        validator=number(min=1.0),
        default_text="no truncation",
    )


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token estimate of ``KL(p || ref)`` from tokens sampled from ``p``.

    With ``log_r = ref_logprobs - logprobs`` (the log of ``ref(a) / p(a)``):

    * ``k1``: ``-log_r`` (unbiased, high variance, can be negative);
    * ``k2``: ``0.5 * log_r**2`` (biased, low variance);
    * ``k3`` / ``low_var_kl``: ``exp(log_r) - 1 - log_r`` (unbiased, never negative). As is
      usual, ``log_r`` is clamped to +-20 and the estimate to at most 10.
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind in ("k3", "low_var_kl"):
        log_r = (ref_logprobs - logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        return (torch.exp(log_r) - 1.0 - log_r).clamp(max=KL_VALUE_LIMIT)
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of: {', '.join(KL_TYPES)}")


def policy_stats(
    ratio: Tensor,
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    group_loss_tokens: Normaliser,
    outputs: Mapping[str, Any],
    *,
    ratio_mean: Tensor | None = None,
    ratio_mask: Tensor | None = None,
) -> dict[str, Tensor]:
    """Stats every ratio-based algorithm reports.

    ``train/ratio_mean`` and ``train/approx_kl`` (the k3 estimate of ``KL(old || new)``, since
    tokens were sampled from the old policy) are shares of the group token mean;
    ``train/ratio_max`` / ``train/ratio_min`` are microbatch extremes; ``train/entropy`` is
    reported when the backend computed it. An algorithm whose ratio is not per token (GSPO's
    is per sequence) gives its own ``ratio_mean`` and the ``ratio_mask`` of its ratio's
    entries (default: the loss mask).
    """
    if ratio_mask is None:
        ratio_mask = mask
    stats = {
        "train/ratio_mean": (
            token_share(ratio, mask, group_loss_tokens) if ratio_mean is None else ratio_mean
        ),
        "train/ratio_max": masked_max(ratio, ratio_mask),
        "train/ratio_min": masked_min(ratio, ratio_mask),
        "train/approx_kl": token_share(
            kl_estimate(old_logprobs.detach(), logprobs.detach(), "k3"), mask, group_loss_tokens
        ),
    }
    if "entropy" in outputs:
        stats["train/entropy"] = token_share(outputs["entropy"], mask, group_loss_tokens)
    return stats


TOKEN_CLIP_LOSS_AGG = "token-mean"


class TokenClipConfig(Protocol):
    """What :func:`token_clip_loss` reads from an algorithm's config."""

    @property
    def eps_low(self) -> float: ...
    @property
    def eps_high(self) -> float: ...
    @property
    def loss_agg(self) -> str | None: ...
    @property
    def behaviour_weight_cap(self) -> float | None: ...


def token_clip_loss(
    outputs: Mapping[str, Any], batch: Mapping[str, Any], config: TokenClipConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """The token-level clipped policy loss of GRPO and RLOO, with its stats.

    Each loss token's :func:`clipped_surrogate` on the band ``[1 - eps_low, 1 + eps_high]``
    (times its :func:`behaviour_weight` in a decoupled batch), aggregated with ``loss_agg``
    (unset: ``token-mean``); stats are ``train/policy_loss``, ``train/clip_fraction``,
    :func:`policy_stats` and, in a decoupled batch, :func:`behaviour_stats`.
    """
    eps_low, eps_high, weight_cap = config.eps_low, config.eps_high, config.behaviour_weight_cap
    loss_agg = config.loss_agg or TOKEN_CLIP_LOSS_AGG
    logprobs, old = outputs["logprobs"], batch["old_logprobs"]
    mask, tokens = batch["loss_mask"], batch["group_loss_tokens"]
    ratio = importance_ratio(logprobs, old)
    per_token, clipped = clipped_surrogate(ratio, batch["advantages"], eps_low, eps_high)
    weight = behaviour_weight(batch, old, weight_cap)
    if weight is not None:
        per_token = per_token * weight
    loss = aggregate_loss(per_token, mask, loss_agg, tokens, batch["group_sequences"])
    stats = {
        "train/policy_loss": loss.detach(),
        "train/clip_fraction": token_share(clipped.to(ratio.dtype), mask, tokens),
        **policy_stats(ratio, logprobs, old, mask, tokens, outputs),
    }
    if weight is not None:
        stats.update(behaviour_stats(weight, mask, tokens, weight_cap))
    return loss, stats


# --------------------------------------------------------------------------------------------
# Groups (rows sampled from the same prompt share a group_index)
# --------------------------------------------------------------------------------------------


def group_sum(values: Tensor, group_index: Tensor) -> Tensor:
    """For each row, the sum of ``values`` over the rows of its group. ``[B] -> [B]``.

    ``group_index`` may hold any integers (they need not be contiguous or sorted).
    """
    uniq, inverse = torch.unique(group_index, return_inverse=True)
    sums = values.new_zeros(uniq.numel()).index_add_(0, inverse, values)
    return sums[inverse]


def group_mean_std(values: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row ``(mean, std, count)`` of the row's group; ``std`` is Bessel-corrected.

    A group of one row has std 0.
    """
    count = group_sum(torch.ones_like(values), group_index)
    mean = group_sum(values, group_index) / count
    sq = group_sum((values - mean) ** 2, group_index)
    std = torch.sqrt(sq / (count - 1.0).clamp(min=1.0))
    return mean, std, count


def group_normalized_rewards(
    rewards: Tensor, group_index: Tensor, scale: bool = True, eps: float = 1e-6
) -> Tensor:
    """``(r - mean_group) / (std_group + eps)``, or just ``r - mean_group`` when not ``scale``."""
    mean, std, _ = group_mean_std(rewards, group_index)
    centred = rewards - mean
    return centred / (std + eps) if scale else centred


def leave_one_out_advantages(rewards: Tensor, group_index: Tensor) -> Tensor:
    """``r_i`` minus the mean reward of the *other* rows of its group (0 for a lone row)."""
    total = group_sum(rewards, group_index)
    count = group_sum(torch.ones_like(rewards), group_index)
    baseline = (total - rewards) / (count - 1.0).clamp(min=1.0)
    return torch.where(count > 1, rewards - baseline, torch.zeros_like(rewards))


def broadcast_over_tokens(per_row: Tensor, mask: Tensor) -> Tensor:
    """Spread a ``[B]`` value over each row's loss tokens; 0 elsewhere. Returns ``[B, T]``."""
    dtype = mask.dtype if mask.is_floating_point() else per_row.dtype
    return per_row.to(dtype)[:, None] * (mask > 0).to(dtype)


def require(batch: Mapping[str, Any], keys: Sequence[str], algo: str) -> None:
    """Fail with a clear message when a batch lacks a key the algorithm needs."""
    missing = [k for k in keys if k not in batch]
    if missing:
        raise KeyError(f"{algo}: the batch has no {', '.join(missing)} (has: {', '.join(batch)})")


# --------------------------------------------------------------------------------------------
# Options shared by several algorithms
# --------------------------------------------------------------------------------------------


def clip_eps_field() -> Any:
    """The ``clip_eps`` option RLOO and PPO share: the symmetric clip on the token ratio."""
    return option(0.2, "RLOO and PPO: clip on the token ratio.", validator=number(min=0.0))


def loss_agg_field(default_mode: str) -> Any:
    """The ``loss_agg`` option every online algorithm reads (unset: ``default_mode``)."""
    return option(
        None,
        "How token losses are averaged: token-mean, seq-mean-token-mean or "
        f"seq-mean-token-sum (this algorithm's default: {default_mode}).",
        choices=LOSS_AGG_MODES,
        default_text=default_mode,
    )

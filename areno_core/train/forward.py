"""Scoring tokens with a model: per-token log-probabilities, entropies and values.

Rows that start with the same prompt (the samples of one GRPO group, the two answers of a DPO
pair) share that prompt's computation: :func:`policy_outputs` runs each distinct prompt once,
hands its keys and values to every row that starts with it, and runs only the rest of each
row on top (see :func:`shared_prefix_plan`). The gradient flows back through the shared keys
and values into the prompt's forward pass, so the result is the same as running every row in
full, up to floating-point rounding, for a fraction of the work when prompts are long.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from areno_core.accel.attention import uses_flash
from areno_core.errors import ConfigError
from areno_core.log import get_logger, warn_once, warned
from areno_core.models.families import has_sliding_window
from areno_core.models.loading import cache_argument, is_activation_checkpointing, output_cache
from areno_core.train.lean_prefix import lean_prefix_reason, shared_prefix_logits
from areno_core.train.packed import build_layout, packed_hidden, packed_unavailable_reason

logger = get_logger(__name__)
_PACKED_HINT = "forward.packed_hint"

# Share prompts only when that cuts the padded token count of a microbatch by at least this.
MIN_SHARED_SAVING = 0.2


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
    share_prefix: bool = True,
    packed: bool = False,
) -> dict[str, torch.Tensor]:
    """Run ``model`` on a microbatch and return ``logprobs`` (and ``entropy``) [B, T].

    With ``share_prefix`` (and a batch worth it, see :func:`shared_prefix_plan`) rows that
    start with the same tokens share that prefix's forward pass; the outputs before each row's
    first loss token are then 0 (they are masked out of every loss and statistic anyway).
    Rows run packed, without padding (:func:`packed_outputs`), whenever the model uses
    flash-attn, and with ``packed`` for any other model that :mod:`areno_core.train.packed`
    supports (Qwen3, Qwen2 and Llama with SDPA attention, on any device; prompts shared
    inside the packed stream); the outputs outside the loss tokens are then 0.
    """
    flash = uses_flash(model)
    if packed and not flash:
        reason = packed_unavailable_reason(model)
        if reason is None:
            # Packed rows cost their real tokens only, so any shared prompt is worth sharing.
            plan = shared_prefix_plan(batch, min_saving=0.0) if share_prefix else None
            return _lean_packed_outputs(model, batch, temperature, need_entropy, plan)
        warn_once(
            logger,
            f"forward.not_packed.{type(model).__name__}",
            "--packed-forward: %s trains through its padded transformers forward (the packed "
            "forward does not run it: %s)",
            type(model).__name__,
            reason,
            level=logging.INFO,
        )
    plan = shared_prefix_plan(batch) if share_prefix and supports_shared_prefix(model) else None
    if plan is None and share_prefix and not flash and torch.is_grad_enabled():
        _hint_packed_forward(model, batch)
    if plan is not None:
        return _shared_prefix_outputs(model, batch, plan, temperature, need_entropy)
    if flash and not bool(batch["attention_mask"].all()):
        return packed_outputs(model, batch, temperature=temperature, need_entropy=need_entropy)
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    )
    ids = batch["input_ids"]
    logprobs, entropy = _scored_tokens(out.logits[:, :-1], ids[:, 1:], temperature, need_entropy)
    result = {"logprobs": F.pad(logprobs, (1, 0), value=0.0)}
    if entropy is not None:
        result["entropy"] = F.pad(entropy, (1, 0), value=0.0)
    return result


def _hint_packed_forward(model: Any, batch: dict[str, Any]) -> None:
    """Say once when activation checkpointing keeps the padded forward from sharing prompts
    that the packed forward would share (measured 4x less CPU time per GRPO step on the
    GSM8K-shaped benchmark, docs/performance.md)."""
    if warned(_PACKED_HINT):  # said already: keep the checks off the hot path
        return
    if not is_activation_checkpointing(model) or not getattr(model, "training", False):
        return
    if packed_unavailable_reason(model) is not None or shared_prefix_plan(batch) is None:
        return
    warn_once(
        logger,
        _PACKED_HINT,
        "activation checkpointing is on, so the padded training forward runs every row's "
        "prompt in full; --packed-forward shares prompts with checkpointing on (or pass "
        "--no-activation-checkpointing when memory allows), see docs/performance.md",
    )


def _scored_tokens(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, need_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of ``targets`` under ``logits`` [B, T, V] (and the entropy), with one
    log-softmax shared by both; same values as :func:`token_logprobs_from_logits` and
    :func:`token_entropy_from_logits`."""
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    logp = F.log_softmax(scaled, dim=-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if need_entropy:
        with torch.no_grad():
            detached = logp.detach()
            entropy = -(detached.exp() * detached).sum(-1)
    return picked, entropy


def packed_outputs(
    model: Any,
    batch: dict[str, Any],
    *,
    temperature: float = 1.0,
    need_entropy: bool = False,
    plan: SharedPrefixPlan | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`policy_outputs` without padding: the rows' tokens run as one row ``[1, N]``
    whose position ids restart at 0 for each row, so no layer computes on padding.

    A model with flash-attn runs through its transformers module, which reads the restarts as
    sequence boundaries (variable-length kernels); so does any model that
    :func:`~areno_core.train.packed.packed_unavailable_reason` rejects (SDPA or eager
    attention with a block-diagonal mask; ``plan`` is then ignored). Any other model runs
    through :func:`~areno_core.train.packed.packed_hidden` (attention per row, rows of one
    ``plan`` prefix attending to that prompt's single copy) and the output projection runs
    only where a loss token is predicted. Outputs are the same as the padded forward's up to
    rounding; padding positions (and, on the second path, positions outside the loss tokens)
    are 0.
    """
    if not uses_flash(model) and packed_unavailable_reason(model) is None:
        return _lean_packed_outputs(model, batch, temperature, need_entropy, plan)
    mask = batch["attention_mask"].bool()
    ids = batch["input_ids"]
    flat_ids = ids[mask].unsqueeze(0)
    positions = (mask.long().cumsum(-1) - 1)[mask].unsqueeze(0)
    out = model(input_ids=flat_ids, position_ids=positions, use_cache=False)
    # Each token predicts the next one of the flat row; only predictions inside a row are kept.
    targets = flat_ids.roll(-1, dims=1)
    logprobs, entropy = _scored_tokens(out.logits, targets, temperature, need_entropy)
    slot = torch.full(ids.shape, -1, dtype=torch.long, device=ids.device)
    slot[mask] = torch.arange(flat_ids.shape[1], device=ids.device)
    previous = slot[:, :-1].clamp(min=0)  # the flat position that predicts token t (t >= 1)
    scored = mask[:, 1:]

    def to_rows(values: torch.Tensor) -> torch.Tensor:
        picked = values[0][previous].masked_fill(~scored, 0.0)
        return F.pad(picked, (1, 0), value=0.0)

    result = {"logprobs": to_rows(logprobs)}
    if entropy is not None:
        result["entropy"] = to_rows(entropy)
    return result


def _lean_packed_outputs(
    model: Any,
    batch: dict[str, Any],
    temperature: float,
    need_entropy: bool,
    plan: SharedPrefixPlan | None,
) -> dict[str, torch.Tensor]:
    layout = build_layout(batch, plan)
    logits = model.lm_head(packed_hidden(model, layout))
    logprobs, entropy = _scored_tokens(
        logits[None], layout.score_target[None], temperature, need_entropy
    )
    where = (layout.score_row, layout.score_col)

    def to_rows(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(layout.shape).index_put(where, values[0])

    result = {"logprobs": to_rows(logprobs)}
    if entropy is not None:
        result["entropy"] = to_rows(entropy)
    return result


@attrs.frozen
class SharedPrefixPlan:
    """How a microbatch shares prompts: row ``r`` starts with prefix ``row_prefix[r]``, whose
    tokens are ``input_ids[prefix_rows[u], :prefix_len[u]]``; ``start[r]`` (= that prefix's
    length) is the row's first scored position, the first loss token."""

    row_prefix: torch.Tensor  # [B]
    prefix_rows: torch.Tensor  # [U]
    prefix_len: torch.Tensor  # [U]
    start: torch.Tensor  # [B]
    prefix_width: int
    suffix_width: int


def supports_shared_prefix(model: Any) -> bool:
    """Whether ``model`` can run a prefix once and continue it from its key/value cache with
    gradients: a transformers causal LM with full attention in every layer (no sliding
    window) and without activation checkpointing (which turns the cache off in training)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_output_embeddings"):
        return False
    if is_activation_checkpointing(model):
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "is_encoder_decoder", False):
        return False
    # The continued rows sit at other cache columns than their positions (the prompts are
    # right-padded), which a sliding window, a mask over column distances, would misread.
    try:
        return not has_sliding_window(text)
    except ConfigError:
        return False


def shared_prefix_plan(
    batch: dict[str, Any], min_saving: float = MIN_SHARED_SAVING
) -> SharedPrefixPlan | None:
    """Group the rows of ``batch`` by the tokens before their first loss token.

    Returns None when no two rows share a prefix, or when sharing would cut the padded token
    count (``B * T`` against ``U * P + B * S`` for ``U`` distinct prefixes of at most ``P``
    tokens and row remainders of at most ``S``) by less than ``min_saving``.
    """
    ids, loss_mask = batch["input_ids"], batch.get("loss_mask")
    if loss_mask is None or ids.shape[0] < 2:
        return None
    rows, width = ids.shape
    lengths = batch["attention_mask"].sum(-1)
    scored = loss_mask > 0
    start = torch.where(scored.any(-1), scored.long().argmax(-1), lengths)
    if bool((start < 1).any()):  # a row scored from its first token has no prefix to share
        return None
    columns = torch.arange(width, device=ids.device)
    keys = ids.masked_fill(columns >= start.unsqueeze(-1), -1)
    unique, row_prefix = _unique_rows(keys)
    prefixes = unique.shape[0]
    if prefixes == rows:
        return None
    prefix_len = (unique >= 0).sum(-1)
    prefix_width = int(prefix_len.max())
    suffix_width = int((lengths - start).max())
    if suffix_width == 0:
        return None
    if prefixes * prefix_width + rows * suffix_width > (1.0 - min_saving) * rows * width:
        return None
    order = torch.arange(rows, device=ids.device)
    prefix_rows = torch.full((prefixes,), rows, dtype=torch.long, device=ids.device)
    prefix_rows = prefix_rows.scatter_reduce(0, row_prefix, order, reduce="amin")
    return SharedPrefixPlan(
        row_prefix=row_prefix,
        prefix_rows=prefix_rows,
        prefix_len=prefix_len,
        start=start,
        prefix_width=prefix_width,
        suffix_width=suffix_width,
    )


def _unique_rows(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(keys, dim=0, return_inverse=True)`` for a small integer [B, T] matrix on
    a CPU: the distinct rows in lexicographic order and each row's index among them, the
    same tensors, from Python tuples (which order the same way) at a fraction of the cost."""
    if keys.device.type != "cpu":
        return torch.unique(keys, dim=0, return_inverse=True)
    rows = [tuple(row) for row in keys.tolist()]
    distinct = sorted(set(rows))
    index = {row: i for i, row in enumerate(distinct)}
    unique = torch.tensor(distinct, dtype=keys.dtype).view(len(distinct), keys.shape[1])
    return unique, torch.tensor([index[row] for row in rows], dtype=torch.long)


def _shared_prefix_outputs(
    model: Any,
    batch: dict[str, Any],
    plan: SharedPrefixPlan,
    temperature: float,
    need_entropy: bool,
) -> dict[str, torch.Tensor]:

    ids = batch["input_ids"]
    rows, width = ids.shape
    device = ids.device
    lengths = batch["attention_mask"].sum(-1)

    # Two passes: each distinct prefix once (right-padded; only the logits of its last token
    # are kept), then the rest of every row, attending to its prefix's keys and values.
    columns = torch.arange(plan.prefix_width, device=device)
    prefix_mask = columns < plan.prefix_len.unsqueeze(-1)
    prefix_ids = ids[plan.prefix_rows, : plan.prefix_width].masked_fill(~prefix_mask, 0)
    last = plan.prefix_len - 1
    offsets = torch.arange(plan.suffix_width, device=device)
    positions = plan.start.unsqueeze(-1) + offsets
    suffix_mask = positions < lengths.unsqueeze(-1)
    suffix_ids = ids.gather(1, positions.clamp(max=width - 1)).masked_fill(~suffix_mask, 0)
    attention = torch.cat([prefix_mask[plan.row_prefix], suffix_mask], dim=1)
    if lean_prefix_reason(model) is None:
        # The module's own operations without its per-call overhead (same numbers).
        keep = torch.unique(last)
        prefix_logits, suffix_logits = shared_prefix_logits(
            model, prefix_ids, prefix_mask, keep, plan.row_prefix, suffix_ids, attention, positions
        )
        first_logits = prefix_logits[
            torch.arange(len(last), device=device), torch.searchsorted(keep, last)
        ]
    else:
        first_logits, suffix_logits = _module_prefix_logits(
            model, prefix_ids, prefix_mask, last, plan.row_prefix, suffix_ids, attention, positions
        )
    predicting = torch.cat(
        [first_logits[plan.row_prefix].unsqueeze(1), suffix_logits[:, :-1]], dim=1
    )
    logprobs, entropy = _scored_tokens(predicting, suffix_ids, temperature, need_entropy)

    def to_rows(values: torch.Tensor) -> torch.Tensor:
        values = values.masked_fill(~suffix_mask, 0.0)
        out = values.new_zeros(rows, width + plan.suffix_width).scatter(1, positions, values)
        return out[:, :width]

    result = {"logprobs": to_rows(logprobs)}
    if entropy is not None:
        result["entropy"] = to_rows(entropy)
    return result


def _module_prefix_logits(
    model: Any,
    prefix_ids: torch.Tensor,
    prefix_mask: torch.Tensor,
    last: torch.Tensor,
    row_prefix: torch.Tensor,
    suffix_ids: torch.Tensor,
    attention: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two calls of the shared-prefix forward through the transformers module: the
    logits [U, V] of each prompt's last token and those of every row's remainder [B, S, V]
    (see :func:`areno_core.train.lean_prefix.shared_prefix_logits` for the arguments)."""
    device = prefix_ids.device
    kwargs: dict[str, Any] = {}
    slot = last
    if _takes_logits_to_keep(model):
        keep = torch.unique(last)
        kwargs["logits_to_keep"] = keep
        slot = torch.searchsorted(keep, last)
    prefix_out = model(
        input_ids=prefix_ids, attention_mask=prefix_mask.long(), use_cache=True, **kwargs
    )
    first_logits = prefix_out.logits[torch.arange(len(last), device=device), slot]
    cache = DynamicCache()
    for index, layer in enumerate(output_cache(prefix_out).layers):
        cache.update(
            layer.keys.index_select(0, row_prefix), layer.values.index_select(0, row_prefix), index
        )
    suffix_out = model(
        input_ids=suffix_ids,
        attention_mask=attention.long(),
        position_ids=positions,
        use_cache=True,
        **{cache_argument(model): cache},
    )
    return first_logits, suffix_out.logits


def _takes_logits_to_keep(model: Any) -> bool:
    forward = getattr(model, "forward", None)
    try:
        return "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def value_outputs(critic: Any, batch: dict[str, Any]) -> torch.Tensor:
    """Per-token values [B, T] from a critic; ``values[:, t]`` is the value before token t.

    The critic reads the prefix up to t - 1, so its output at position t - 1 is shifted right
    by one to align with the token it values.
    """
    values = critic(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return F.pad(values[:, :-1].float(), (1, 0), value=0.0)

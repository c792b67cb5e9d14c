"""The shared-prompt training forward of :func:`areno_core.train.forward.policy_outputs`
without the transformers module.

The padded training forward that shares prompts runs the model twice per microbatch: once
over each distinct prompt (keeping its keys and values), once over every row's remainder
on top of its prompt's keys and values. For a small model on a CPU, most of such a call is
spent outside the kernels (module tree, mask factory, cache object, output wrappers). Where
the rollout engine's lean forward pass runs the model
(:func:`~areno_core.models.lean.lean_unavailable_reason`), :func:`shared_prefix_logits`
issues the transformers module's operations in the module's order instead, with the same
attention masks, so its logits and the gradients that flow back from them are the module's
bit for bit in float32 (tests/train/test_lean_prefix.py compares both).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from areno_core.models.lean import LeanDecoder, lean_training_reason

_DECODERS: weakref.WeakKeyDictionary[nn.Module, LeanDecoder] = weakref.WeakKeyDictionary()


def lean_prefix_reason(model: nn.Module) -> str | None:
    """Why :func:`shared_prefix_logits` cannot run ``model`` (None when it can): the lean
    forward pass must support it (SDPA attention included, so the numbers are the module's)
    and, in training mode, attention dropout must be off
    (:func:`~areno_core.models.lean.lean_training_reason`, remembered per model)."""
    return lean_training_reason(model, require_sdpa=True)


def _decoder(model: nn.Module) -> LeanDecoder:
    """The lean pass over ``model``'s parameters, built once per model (again after a move to
    another device or dtype, which replaces the parameters)."""
    lean = _DECODERS.get(model)
    if lean is None or not lean.is_current(model):
        lean = LeanDecoder(model)
        _DECODERS[model] = lean
    return lean


def causal_padding_mask(valid: torch.Tensor, q_length: int, q_offset: int) -> torch.Tensor:
    """The boolean [B, 1, Q, K] attention mask transformers builds for SDPA from a 2D mask
    ``valid`` [B, K] (True: a real token) when the ``Q`` queries sit at key columns
    ``q_offset ..``: query ``q`` sees key ``j`` where ``j <= q_offset + q`` and ``valid[b, j]``."""
    device = valid.device
    queries = torch.arange(q_length, device=device) + q_offset
    keys = torch.arange(valid.shape[-1], device=device)
    causal = keys[None, None, None, :] <= queries[None, None, :, None]
    return causal & valid[:, None, None, :]


def shared_prefix_logits(
    model: nn.Module,
    prefix_ids: torch.Tensor,
    prefix_valid: torch.Tensor,
    keep: torch.Tensor,
    row_prefix: torch.Tensor,
    suffix_ids: torch.Tensor,
    suffix_valid: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of the two calls of the shared-prompt forward.

    ``prefix_ids`` [U, P]: each distinct prompt, right-padded (``prefix_valid`` [U, P] marks
    its tokens); ``keep`` [K]: the prompt columns whose logits are wanted (the module's
    ``logits_to_keep``). ``suffix_ids`` [B, S]: each row's remainder at ``positions`` [B, S],
    attending to prompt ``row_prefix[b]``'s keys and values then causally to itself;
    ``suffix_valid`` [B, P + S] marks the visible prompt columns and real suffix tokens.
    Returns ``(prefix_logits [U, K, V], suffix_logits [B, S, V])``, what
    ``model(prefix_ids, attention_mask=prefix_valid, use_cache=True, logits_to_keep=keep)``
    and the continued call on its cache return.
    """
    lean = _decoder(model)
    width = prefix_ids.shape[1]
    # transformers drops the prompts' mask when no token is padding (SDPA's causal kernel).
    mask = None if bool(prefix_valid.all()) else causal_padding_mask(prefix_valid, width, 0)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    empty = torch.tensor([], dtype=lean.embed.dtype, device=prefix_ids.device)

    def cache_prompt(index: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # The module's cache appends to an empty tensor: attention reads that copy.
        keys.append(torch.cat([empty, k], dim=-2))
        values.append(torch.cat([empty, v], dim=-2))
        return keys[-1], values[-1]

    positions_p = torch.arange(width, device=prefix_ids.device).unsqueeze(0)
    hidden = lean.hidden_states(prefix_ids, positions_p, mask, cache_prompt)
    prefix_logits = lean.lm_head(hidden[:, keep, :])

    rows_keys = [k.index_select(0, row_prefix) for k in keys]
    rows_values = [v.index_select(0, row_prefix) for v in values]

    def continue_prompt(index: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.cat([rows_keys[index], k], dim=-2), torch.cat([rows_values[index], v], dim=-2)

    length = suffix_ids.shape[1]
    # Continued rows keep their mask unless a single query sees every column.
    skip = length == 1 and bool(suffix_valid.all())
    mask = None if skip else causal_padding_mask(suffix_valid, length, width)
    hidden = lean.hidden_states(suffix_ids, positions, mask, continue_prompt)
    return prefix_logits, lean.lm_head(hidden)


__all__ = ["causal_padding_mask", "lean_prefix_reason", "shared_prefix_logits"]

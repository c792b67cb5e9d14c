"""Training forwards without padding: a microbatch's rows packed into one token stream.

:func:`packed_hidden` runs a microbatch laid out by :func:`build_layout` through a
Llama-family model that the lean forward pass supports
(:func:`areno_core.models.lean.lean_unavailable_reason`), and returns the final hidden states
only where a loss token is predicted; :func:`areno_core.train.forward.packed_outputs` turns them
into log-probabilities (``policy_outputs(..., packed=True)``). It reads the module's own
parameters, so gradients reach them as usual.

What it saves against running the padded [B, T] batch through the transformers module:

* every projection, MLP and norm runs on the real tokens only (a packed [N, hidden] matrix);
* rows that start with the same prompt (a GRPO group, a DPO pair) can share it: each
  distinct prompt is one *root* sequence and each row's remainder a *child* sequence that
  attends to its root's keys and values, then causally to itself;
* the output projection and log-softmax run only where a loss token is predicted;
* no module tree, mask factory or output wrappers per call.

Attention still runs padded, per sequence group: each group of sequences is scattered into a
right-padded [S, heads, L, head_dim] block (roots causally, with SDPA's own causal kernel;
children with an explicit mask over their root's tokens and their own), so attention does
some arithmetic on padding, the matrix products do none.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from areno_core.models.lean import (
    _repeat_kv,
    apply_rotary,
    lean_training_reason,
    rms_norm,
)
from areno_core.models.loading import is_activation_checkpointing


def packed_unavailable_reason(model: nn.Module) -> str | None:
    """Why :func:`packed_policy_outputs` cannot run ``model`` (None when it can): the lean
    forward pass must support it, and attention dropout must be off
    (:func:`~areno_core.models.lean.lean_training_reason`, remembered per model). Activation
    checkpointing is fine: :func:`packed_hidden` then checkpoints each decoder layer itself."""
    return lean_training_reason(model, require_sdpa=False)


@attrs.frozen
class PackedLayout:
    """Where every token of a microbatch lives in the packed stream.

    Packed order: the root sequences' tokens row by row, then the child sequences' tokens.
    ``root_valid`` [R, Lr] / ``child_valid`` [C, Lc] mark the real tokens of the padded views
    (right padding); ``child_parent`` [C] is each child's root. ``score_src`` [M] are the
    packed positions whose outputs predict the scored tokens ``score_target`` [M], written to
    ``(score_row, score_col)`` of the [B, T] result.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    root_valid: torch.Tensor
    child_valid: torch.Tensor | None
    child_parent: torch.Tensor | None
    score_src: torch.Tensor
    score_target: torch.Tensor
    score_row: torch.Tensor
    score_col: torch.Tensor
    shape: tuple[int, int]

    @property
    def num_root_tokens(self) -> int:
        return int(self.root_valid.sum())


def build_layout(batch: dict[str, Any], plan: Any = None) -> PackedLayout:
    """The packed layout of a right-padded microbatch (``input_ids``, ``attention_mask``,
    ``loss_mask``), sharing prompts as ``plan`` (a :class:`~areno_core.train.forward.
    SharedPrefixPlan`) says, or with every row its own root when ``plan`` is None."""
    ids = batch["input_ids"]
    device = ids.device
    rows, width = ids.shape
    lengths = batch["attention_mask"].sum(-1)
    columns = torch.arange(width, device=device)
    # where[r, t]: packed position of row r's token t (-1: not in the stream)
    where = torch.full((rows, width), -1, dtype=torch.long, device=device)
    if plan is None:
        root_valid = columns < lengths.unsqueeze(-1)
        count = int(root_valid.sum())
        where[root_valid] = torch.arange(count, device=device)
        tokens = ids[root_valid]
        positions = columns.expand(rows, width)[root_valid]
        child_valid = child_parent = None
    else:
        prefix_len = plan.prefix_len
        root_width = int(prefix_len.max())
        root_valid = columns[:root_width] < prefix_len.unsqueeze(-1)
        roots = int(root_valid.sum())
        root_ids = ids[plan.prefix_rows, :root_width][root_valid]
        root_where = torch.full(root_valid.shape, -1, dtype=torch.long, device=device)
        root_where[root_valid] = torch.arange(roots, device=device)
        # Each row's prompt tokens come from its root.
        prompt = columns < plan.start.unsqueeze(-1)
        where[:, :root_width] = torch.where(
            prompt[:, :root_width], root_where[plan.row_prefix], where[:, :root_width]
        )
        suffix_len = lengths - plan.start
        child_width = max(int(suffix_len.max()), 1)
        offsets = columns[:child_width]
        child_valid = offsets < suffix_len.unsqueeze(-1)
        child_cols = (plan.start.unsqueeze(-1) + offsets).clamp(max=width - 1)
        children = int(child_valid.sum())
        child_pos = torch.arange(roots, roots + children, device=device)
        row_index = torch.arange(rows, device=device).unsqueeze(-1).expand_as(child_cols)
        where[row_index[child_valid], child_cols[child_valid]] = child_pos
        child_ids = ids.gather(1, child_cols)[child_valid]
        tokens = torch.cat([root_ids, child_ids])
        root_positions = columns[:root_width].expand_as(root_valid)[root_valid]
        positions = torch.cat([root_positions, child_cols[child_valid]])
        child_parent = plan.row_prefix
    loss_mask = batch.get("loss_mask")
    scored = (
        loss_mask > 0 if loss_mask is not None else torch.ones_like(ids, dtype=torch.bool)
    ) & (columns < lengths.unsqueeze(-1))
    scored[:, 0] = False
    score_row, score_col = scored.nonzero(as_tuple=True)
    score_src = where[score_row, score_col - 1]
    if bool((score_src < 0).any()):
        raise ValueError("a scored token's predecessor is missing from the packed layout")
    return PackedLayout(
        tokens=tokens,
        positions=positions,
        root_valid=root_valid,
        child_valid=child_valid,
        child_parent=child_parent,
        score_src=score_src,
        score_target=ids[score_row, score_col],
        score_row=score_row,
        score_col=score_col,
        shape=(rows, width),
    )


def _padded(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Scatter packed rows ``x`` [n, ...] into a zero-padded [S, L, ...] view."""
    out = x.new_zeros((*valid.shape, *x.shape[1:]))
    return out.index_put((valid,), x) if x.shape[0] else out


class _Attention:
    """Per-layer attention over a :class:`PackedLayout` (built once per forward)."""

    def __init__(self, layout: PackedLayout, n_rep: int, scaling: float) -> None:
        self.layout = layout
        self.n_rep = n_rep
        self.scaling = scaling
        self.split = layout.num_root_tokens
        self.child_mask: torch.Tensor | None = None
        if layout.child_valid is not None:
            assert layout.child_parent is not None
            child_width = layout.child_valid.shape[1]
            causal = torch.ones(
                child_width, child_width, dtype=torch.bool, device=layout.tokens.device
            ).tril()
            own = causal[None] & layout.child_valid[:, None, :]
            inherited = layout.root_valid[layout.child_parent][:, None, :].expand(
                -1, child_width, -1
            )
            self.child_mask = torch.cat([inherited, own], dim=-1)[:, None]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` [N, heads, D], ``k``/``v`` [N, kv_heads, D] -> attended values [N, heads*D]."""
        layout, split = self.layout, self.split
        root_valid = layout.root_valid

        def heads_first(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            return _padded(x, valid).transpose(1, 2)

        rq = heads_first(q[:split], root_valid)
        rk = heads_first(k[:split], root_valid)
        rv = heads_first(v[:split], root_valid)
        # Roots take no mask, so the kernel reads each key/value head for its query heads
        # itself (enable_gqa) instead of attending over repeated copies of them.
        out = F.scaled_dot_product_attention(
            rq, rk, rv, is_causal=True, scale=self.scaling, enable_gqa=self.n_rep > 1
        )
        parts = [out.transpose(1, 2)[root_valid]]
        if layout.child_valid is not None:
            assert layout.child_parent is not None and self.child_mask is not None
            cq = heads_first(q[split:], layout.child_valid)
            ck = torch.cat(
                [rk[layout.child_parent], heads_first(k[split:], layout.child_valid)], dim=2
            )
            cv = torch.cat(
                [rv[layout.child_parent], heads_first(v[split:], layout.child_valid)], dim=2
            )
            out = F.scaled_dot_product_attention(
                cq,
                _repeat_kv(ck, self.n_rep),
                _repeat_kv(cv, self.n_rep),
                attn_mask=self.child_mask,
                scale=self.scaling,
            )
            parts.append(out.transpose(1, 2)[layout.child_valid])
        attended = torch.cat(parts) if len(parts) > 1 else parts[0]
        return attended.reshape(attended.shape[0], -1)


def packed_hidden(model: nn.Module, layout: PackedLayout) -> torch.Tensor:
    """Final-norm hidden states [M, hidden] at ``layout.score_src`` (the lean forward pass of
    a Llama-family model over the packed tokens, with autograd).

    When the model has activation checkpointing on and gradients are being recorded, each
    decoder layer runs under a non-reentrant checkpoint, as the module's own layers would: only
    the layer inputs are kept, and the backward pass runs each layer again. Shared prompts stay
    shared (the recomputation reads the same packed stream).
    """
    config, base = model.config, model.model
    attn0 = base.layers[0].self_attn
    head_dim = int(attn0.head_dim)
    n_rep = int(config.num_attention_heads) // int(config.num_key_value_heads)
    eps = float(config.rms_norm_eps)
    attention = _Attention(layout, n_rep, float(attn0.scaling))
    hidden = base.embed_tokens(layout.tokens)
    cos, sin = base.rotary_emb(hidden[None], layout.positions[None])
    cos, sin = cos[0], sin[0]  # [N, D]; apply_rotary broadcasts them over the heads
    tokens = hidden.shape[0]

    def run_layer(layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        attn, mlp = layer.self_attn, layer.mlp
        x = rms_norm(hidden, layer.input_layernorm.weight, eps)
        q = attn.q_proj(x).view(tokens, -1, head_dim)
        k = attn.k_proj(x).view(tokens, -1, head_dim)
        v = attn.v_proj(x).view(tokens, -1, head_dim)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if q_norm is not None:
            q = rms_norm(q, q_norm.weight, eps)
        if k_norm is not None:
            k = rms_norm(k, k_norm.weight, eps)
        q, k = apply_rotary(q, k, cos, sin)
        hidden = hidden + attn.o_proj(attention(q, k, v))
        x = rms_norm(hidden, layer.post_attention_layernorm.weight, eps)
        return hidden + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))

    checkpointed = model.training and torch.is_grad_enabled() and is_activation_checkpointing(model)
    for layer in base.layers:
        if checkpointed:
            hidden = checkpoint(run_layer, layer, hidden, use_reentrant=False)
        else:
            hidden = run_layer(layer, hidden)
    return rms_norm(hidden[layout.score_src], base.norm.weight, eps)

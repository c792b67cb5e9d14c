"""Decode attention to a shared prompt, read once per group of samples.

When a prompt is sampled ``n`` times (GRPO-shaped rollouts), its ``n`` rows share the same
prompt keys and values. Instead of copying them into every row, the native engine keeps them
once per *group* in a :class:`PrefixStore` and keeps only each row's generated tokens (its
*suffix*) in the per-row cache. A decode step then attends in two parts:

* the group's live queries against the shared prompt, one batched product per layer for all
  groups (the prompt's keys and values are read once per group, not once per row);
* each row's query against its own suffix.

Each part returns its attention output and the log of its softmax denominator
(log-sum-exp); :func:`merge_partial_attention` combines the two exactly, so the result is
ordinary attention over ``[prompt ; suffix]`` up to floating-point rounding.

Queries of a group are laid out in a padded ``[groups, kv_heads, slots, n_rep, head_dim]``
block: every row has a group and a slot (its place in the group, ``< slots``). Empty slots
hold zero queries whose results are never read.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

_COLUMN_ALIGN = 16


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` [B, Hk, L, D] over ``k``/``v`` [B, Hk, S, D] with an additive
    ``bias`` broadcastable to [B, 1, L, S] (0 visible, -inf hidden); returns the output
    [B, Hk, L, D] and the natural-log softmax denominator [B, Hk, L] (of the scaled, biased
    scores). On a CPU it is torch's fused attention kernel, elsewhere plain tensor math."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=bias.to(q.dtype), scale=scale
        )
        return out, lse
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v)
    return out, lse


def merge_partial_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over the union of two disjoint key sets, from each set's output [..., D]
    and log-sum-exp [...]: the outputs weighted by their share of the joint denominator."""
    weight_a = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)  # exp(a) / (exp(a) + exp(b))
    return out_b + weight_a * (out_a - out_b)


def grouped_prefix_attention(
    q: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    prefix_bias: torch.Tensor,
    suffix_k: torch.Tensor,
    suffix_v: torch.Tensor,
    suffix_bias: torch.Tensor,
    group: torch.Tensor,
    slot: torch.Tensor,
    slots: int,
    scale: float,
) -> torch.Tensor:
    """One decode step's attention, split into a shared prefix and per-row suffixes.

    ``q`` [B, H, 1, D]: one query per row. ``prefix_k``/``prefix_v`` [G, Hk, P, D]: each
    group's prompt; ``prefix_bias`` [G, 1, 1, P] (0 visible, -inf hidden). ``suffix_k`` /
    ``suffix_v`` [B, Hk, S, D]: each row's own tokens; ``suffix_bias`` [B, 1, 1, S]; every row
    must see at least one suffix column. ``group`` / ``slot`` [B]: each row's group and its
    place in it (``< slots``; no two rows share both). Grouped-query attention when ``H`` is a
    multiple of ``Hk``. Returns [B, 1, H, D] in ``q``'s dtype; a CPU computes in float32 for
    bfloat16/float16 inputs.
    """
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        prefix_k, prefix_v = prefix_k.float(), prefix_v.float()
        suffix_k, suffix_v, q = suffix_k.float(), suffix_v.float(), q.float()
    batch, heads, _, dim = q.shape
    groups, kv_heads = prefix_k.shape[:2]
    n_rep = heads // kv_heads
    # Each row's query heads folded over their key/value head: [B, Hk, n_rep, D].
    rows = q.reshape(batch, kv_heads, n_rep, dim)
    out_s, lse_s = attention_with_lse(rows, suffix_k, suffix_v, suffix_bias, scale)
    # A group's live rows become the query positions of one attention call over its prompt:
    # block [G, Hk, slots, n_rep, D], read as [G, Hk, slots * n_rep, D] without a copy.
    block = rows.new_zeros(groups, kv_heads, slots, n_rep, dim)
    block[group, :, slot] = rows
    out_p, lse_p = attention_with_lse(
        block.view(groups, kv_heads, slots * n_rep, dim), prefix_k, prefix_v, prefix_bias, scale
    )
    out_p = out_p.view(groups, kv_heads, slots, n_rep, dim)[group, :, slot]
    lse_p = lse_p.view(groups, kv_heads, slots, n_rep)[group, :, slot]
    merged = merge_partial_attention(out_p, lse_p, out_s, lse_s)
    return merged.view(batch, 1, heads, dim).to(dtype)


@attrs.define
class PrefixStep:
    """What every layer of one decode step needs to read the shared prompts: each row's
    ``group`` and ``slot`` [B], the group range ``[0, groups)``, ``slots`` per group, the
    prompt columns ``[cols - width, cols)`` and their bias [groups, 1, 1, width]."""

    group: torch.Tensor
    slot: torch.Tensor
    groups: int
    slots: int
    width: int
    bias: torch.Tensor


class PrefixStore:
    """Each group's prompt keys/values, once: per layer ``[groups, kv_heads, cols, head_dim]``
    buffers, prompts right-aligned at the last column, plus a ``[groups, cols]`` validity mask.

    A group holds one prefilled prompt for the rows that sample it; it is freed when its last
    row finishes, and its slot is reused. Buffers grow as needed and are kept between
    ``generate()`` calls (like the per-row cache) until :meth:`free`.
    """

    def __init__(self, num_layers: int, device: torch.device) -> None:
        self.device = device
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=device)
        self.capacity = 0  # group slots
        self.cols = 0
        self.length = np.zeros(0, dtype=np.int64)  # prompt length of each group
        self.live = np.zeros(0, dtype=np.int64)  # running rows of each group

    def nbytes(self) -> int:
        total = self.valid.numel()
        for buf in (*self.keys, *self.values):
            if buf is not None:
                total += buf.numel() * buf.element_size()
        return total

    def reset(self) -> None:
        """Forget every group (a new generate() call); buffers are kept."""
        self.live[:] = 0

    def free(self) -> None:
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        self.capacity = self.cols = 0
        self.length = np.zeros(0, dtype=np.int64)
        self.live = np.zeros(0, dtype=np.int64)

    def allocate(self, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Take a free group for each prompt of ``lengths`` tokens, sampled by ``rows[i]``
        running rows; return the groups."""
        free = np.flatnonzero(self.live == 0)
        missing = len(lengths) - len(free)
        width = int(lengths.max())
        if missing > 0 or width > self.cols:
            capacity = self.capacity + max(0, missing)
            if missing > 0:
                capacity = max(capacity, 2 * self.capacity)
            self._grow(capacity, max(self.cols, _round_up(width, _COLUMN_ALIGN)))
            free = np.flatnonzero(self.live == 0)
        groups = free[: len(lengths)]
        self.length[groups] = lengths
        self.live[groups] = rows
        columns = torch.arange(self.cols, device=self.device)
        first = torch.from_numpy(self.cols - lengths).to(self.device)
        groups_t = torch.from_numpy(groups).to(self.device)
        self.valid[groups_t] = columns.unsqueeze(0) >= first.unsqueeze(1)
        return groups

    def release(self, groups: np.ndarray) -> None:
        """One running row of each of ``groups`` finished (repeats count once each)."""
        np.subtract.at(self.live, groups, 1)

    def _grow(self, capacity: int, cols: int) -> None:
        old_cap, old_cols = self.capacity, self.cols
        shift = cols - old_cols
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                if old is None:
                    continue
                new = old.new_zeros(capacity, old.shape[1], cols, old.shape[3])
                new[:old_cap, :, shift:] = old
                store[i] = new
        valid = torch.zeros(capacity, cols, dtype=torch.bool, device=self.device)
        valid[:old_cap, shift:] = self.valid
        self.valid = valid
        self.length = np.concatenate([self.length, np.zeros(capacity - old_cap, np.int64)])
        self.live = np.concatenate([self.live, np.zeros(capacity - old_cap, np.int64)])
        self.capacity, self.cols = capacity, cols

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor, groups: torch.Tensor
    ) -> None:
        """Store one layer's prefill keys/values [b, kv_heads, T, head_dim] (left-padded
        prompts, padding zeroed) as the prompts of ``groups`` [b]."""
        if self.keys[layer] is None:
            shape = (self.capacity, keys.shape[1], self.cols, keys.shape[3])
            self.keys[layer] = keys.new_zeros(shape)
            self.values[layer] = values.new_zeros((*shape[:3], values.shape[3]))
        buf_k, buf_v = self.keys[layer], self.values[layer]
        assert buf_k is not None and buf_v is not None
        width = keys.shape[2]
        buf_k[groups, :, self.cols - width :] = keys
        buf_v[groups, :, self.cols - width :] = values

    def step(self, row_group: np.ndarray, row_slot: np.ndarray) -> PrefixStep:
        """The shared-prompt layout of a decode step over rows with these groups/slots."""
        groups = int(row_group.max()) + 1
        slots = int(row_slot.max()) + 1
        width = int(self.length[np.unique(row_group)].max())
        group = torch.from_numpy(row_group.copy()).to(self.device)
        slot = torch.from_numpy(row_slot.copy()).to(self.device)
        visible = self.valid[:groups, self.cols - width :]
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=self.device)
        bias.masked_fill_(~visible, float("-inf"))
        return PrefixStep(group, slot, groups, slots, width, bias[:, None, None, :])

    def layer(self, index: int, step: PrefixStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s prompt keys and values for ``step``: [groups, kv_heads, width, D]."""
        buf_k, buf_v = self.keys[index], self.values[index]
        assert buf_k is not None and buf_v is not None
        first = self.cols - step.width
        return buf_k[: step.groups, :, first:], buf_v[: step.groups, :, first:]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


__all__ = [
    "PrefixStep",
    "PrefixStore",
    "attention_with_lse",
    "grouped_prefix_attention",
    "merge_partial_attention",
]

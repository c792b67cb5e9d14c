"""The native engine's KV cache: one preallocated ``[rows, kv_heads, columns, head_dim]`` buffer
per layer and a ``[rows, columns]`` attention mask, shared column window ``[lo, hi)`` (see
:mod:`areno_core.rollout.native` for the layout), and the static-shape inputs of a captured
decode step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from areno_core.log import get_logger
from areno_core.models.lean import Attender
from areno_core.rollout.prefix import PrefixStep, PrefixStore, grouped_prefix_attention

logger = get_logger(__name__)

COLUMN_ALIGN = 64


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class StoreLayer(CacheLayerMixin):
    """One model layer's slice of the :class:`KVStore`, seen by transformers as a cache layer.

    ``keys`` / ``values`` are the whole preallocated buffers; what attention sees is decided by
    the store (its row count and column window).
    """

    is_sliding = False
    is_compileable = False

    def __init__(self, store: KVStore, index: int) -> None:
        super().__init__()
        self._store = store
        self.index = index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._store.write(self, key_states, value_states)

    def get_seq_length(self) -> int:
        return self._store.past_length

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        if isinstance(query_length, torch.Tensor):  # older transformers pass cache_position
            query_length = int(query_length.shape[0])
        return self._store.past_length + query_length, 0

    def get_max_length(self) -> int:
        return -1


@attrs.define
class PrefillPlan:
    """Where the keys/values of one prefill forward go: ``rows`` of the store, taking batch
    row ``src[i]`` for store row ``rows[i]`` (``src`` None: the identity), with ``pad`` [b, 1, P, 1]
    marking left-padding columns to zero out. With ``groups`` [b] the prompts go once each
    into those groups of the :class:`PrefixStore` instead (shared-prompt layout)."""

    rows: torch.Tensor
    src: torch.Tensor | None
    pad: torch.Tensor | None
    groups: torch.Tensor | None = None


class KVStore:
    """Preallocated KV buffers shared by the running rows, plus per-row decode state."""

    def __init__(self, num_layers: int, device: torch.device) -> None:
        self.device = device
        self.layers = [StoreLayer(self, i) for i in range(num_layers)]
        self.cache = Cache(layers=list(self.layers))
        self.rows = 0  # row capacity
        self.cols = 0  # column capacity
        self.n = 0  # rows in use: [0, n)
        self.lo = 0  # column window [lo, hi) seen by attention
        self.hi = 0
        self.start = np.zeros(0, dtype=np.int64)  # first valid column of each row
        self.mask: torch.Tensor | None = None  # [rows, cols] bool
        self.next_token = torch.zeros(0, dtype=torch.long)  # token each row feeds next
        self.position = torch.zeros(0, dtype=torch.long)  # its position id
        self.rng_state = torch.zeros(0, dtype=torch.long)  # the row's random stream
        self.count = torch.zeros(0, dtype=torch.long)  # tokens the row has sampled
        self._plan: PrefillPlan | None = None
        # Shared prompts, once per group of samples (only the rows' own tokens are above).
        self.prefix = PrefixStore(num_layers, device)
        # Captured decode graphs point at the buffers: every reallocation bumps this.
        self.generation = 0
        # lo, hi and the running-row count as device scalars, read by static decode steps.
        self.lo_t = torch.zeros((), dtype=torch.long, device=device)
        self.hi_t = torch.zeros((), dtype=torch.long, device=device)
        self.n_t = torch.zeros((), dtype=torch.long, device=device)
        self._static_rows = 0  # > 0 while a static decode step runs over that many rows

    # -- sizes -------------------------------------------------------------------------------

    @property
    def past_length(self) -> int:
        if self._static_rows:
            return self.cols - 1
        return 0 if self._plan is not None else self.hi - self.lo

    def nbytes(self) -> int:
        total = self.prefix.nbytes() + (0 if self.mask is None else self.mask.numel())
        for layer in self.layers:
            for buf in (layer.keys, layer.values):
                if buf is not None:
                    total += buf.numel() * buf.element_size()
        return total

    def begin(self, rows: int) -> None:
        """Start a generate() call needing ``rows`` rows; keeps buffers that are big enough."""
        if rows > self.rows or self.mask is None:
            self.free()
            self.generation += 1
            self.rows = rows
            self.mask = torch.zeros(rows, self.cols, dtype=torch.bool, device=self.device)
            self.next_token = torch.zeros(rows, dtype=torch.long, device=self.device)
            self.position = torch.zeros_like(self.next_token)
            self.rng_state = torch.zeros_like(self.next_token)
            self.count = torch.zeros_like(self.next_token)
        self.start = np.zeros(self.rows, dtype=np.int64)
        self.n = 0
        self.lo = self.hi = 0
        self.prefix.reset()

    def free(self) -> None:
        self.generation += 1
        self.prefix.free()
        for layer in self.layers:
            layer.keys = layer.values = None
            layer.is_initialized = False
        self.mask = None
        empty = torch.zeros(0, dtype=torch.long)
        self.next_token = self.position = self.rng_state = self.count = empty
        self.rows = self.cols = self.n = self.lo = self.hi = 0

    # -- layout ------------------------------------------------------------------------------

    def _allocated_buffers(self) -> Iterator[tuple[StoreLayer, str]]:
        for layer in self.layers:
            if layer.keys is not None:
                yield layer, "keys"
                yield layer, "values"

    def reserve(
        self, left: int, right: int, pending_left: int = 0, max_right: int | None = None
    ) -> None:
        """Make columns ``[hi - left, hi + right)`` exist, moving or growing buffers if needed.

        ``pending_left`` is the longest prompt still waiting: when the window has to move
        anyway, it is placed so that prompt will fit without another move. ``max_right``, when
        known, is the most columns the window can still grow by (no prompt waiting, every row's
        remaining token budget): growth never allocates beyond it.
        """
        if self.n == 0:
            self.lo = self.hi
        if self.hi >= left and self.hi + right <= self.cols:
            return
        width = self.hi - self.lo
        new_lo = max(0, left - width, pending_left - width)
        end = new_lo + width + right
        slack = max(COLUMN_ALIGN, width // 2, right)
        if end + slack <= self.cols:
            self._move_window(new_lo)
            return
        cols = round_up(end + slack, COLUMN_ALIGN)
        if max_right is not None:
            cols = min(cols, new_lo + width + max(right, max_right))
        self._resize(cols, new_lo)

    def _move_window(self, new_lo: int) -> None:
        n, lo, hi = self.n, self.lo, self.hi
        width = hi - lo
        if n and width:
            for layer, name in self._allocated_buffers():
                buf = getattr(layer, name)
                buf[:n, :, new_lo : new_lo + width] = buf[:n, :, lo:hi].clone()
            assert self.mask is not None
            self.mask[:n, new_lo : new_lo + width] = self.mask[:n, lo:hi].clone()
        self._shift(new_lo - lo)

    def _resize(self, cols: int, new_lo: int) -> None:
        n, lo, hi = self.n, self.lo, self.hi
        width = hi - lo
        for layer, name in self._allocated_buffers():
            old = getattr(layer, name)
            new = old.new_zeros(old.shape[0], old.shape[1], cols, old.shape[3])
            if n and width:
                new[:n, :, new_lo : new_lo + width] = old[:n, :, lo:hi]
            setattr(layer, name, new)
        assert self.mask is not None
        mask = self.mask.new_zeros(self.rows, cols)
        if n and width:
            mask[:n, new_lo : new_lo + width] = self.mask[:n, lo:hi]
        self.mask = mask
        self.cols = cols
        self.generation += 1
        self._shift(new_lo - lo)
        logger.debug("rollout KV cache now %d rows x %d columns", self.rows, cols)

    def _shift(self, delta: int) -> None:
        self.start[: self.n] += delta
        self.lo += delta
        self.hi += delta

    def refresh_window(self) -> None:
        """Move the window's left edge to the first column any running row uses."""
        self.lo = int(self.start[: self.n].min()) if self.n else self.hi

    # -- rows --------------------------------------------------------------------------------

    def open_rows(self, rows: np.ndarray, starts: np.ndarray) -> None:
        """Prepare ``rows`` to receive prompts whose first tokens sit at columns ``starts``."""
        assert self.mask is not None
        new_lo = int(starts.min())
        if self.n and new_lo < self.lo:
            self.mask[: self.n, new_lo : self.lo] = False
        self.lo = min(self.lo, new_lo) if self.n else new_lo
        self.n = max(self.n, int(rows.max()) + 1)
        self.start[rows] = starts
        columns = torch.arange(self.lo, self.hi, device=self.device)
        rows_t = torch.from_numpy(rows).to(self.device)
        starts_t = torch.from_numpy(starts).to(self.device)
        self.mask[rows_t, self.lo : self.hi] = columns.unsqueeze(0) >= starts_t.unsqueeze(1)

    def move_rows(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy the state of rows ``src`` into rows ``dst`` (disjoint sets)."""
        assert self.mask is not None
        s = torch.tensor(src, dtype=torch.long, device=self.device)
        d = torch.tensor(dst, dtype=torch.long, device=self.device)
        lo, hi = self.lo, self.hi
        for layer, name in self._allocated_buffers():
            buf = getattr(layer, name)
            buf[d, :, lo:hi] = buf[s, :, lo:hi]
        self.mask[d, lo:hi] = self.mask[s, lo:hi]
        for state in (self.next_token, self.position, self.rng_state, self.count):
            state[d] = state[s]
        self.start[list(dst)] = self.start[list(src)]

    # -- what the model's attention layers call -----------------------------------------------

    def write(
        self, layer: StoreLayer, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self._plan
        if plan is not None and plan.groups is not None:
            if plan.pad is not None:
                keys = keys.masked_fill(plan.pad, 0)
                values = values.masked_fill(plan.pad, 0)
            self.prefix.write(layer.index, keys, values, plan.groups)
            return keys, values
        if layer.keys is None:
            shape = (self.rows, keys.shape[1], self.cols, keys.shape[3])
            layer.keys = keys.new_zeros(shape)
            layer.values = values.new_zeros((*shape[:3], values.shape[3]))
            layer.lazy_initialization(keys, values)
            self.generation += 1
        assert layer.values is not None
        if self._static_rows:
            # A static decode step: write column hi of the first rows (a device scalar, so
            # the step can be replayed from a CUDA graph) and attend over every column.
            b = self._static_rows
            column = self.hi_t.view(1)
            layer.keys[:b].index_copy_(2, column, keys)
            layer.values[:b].index_copy_(2, column, values)
            return layer.keys[:b], layer.values[:b]
        if plan is not None:
            if plan.pad is not None:
                keys = keys.masked_fill(plan.pad, 0)
                values = values.masked_fill(plan.pad, 0)
            first = self.hi - keys.shape[2]
            picked_k = keys if plan.src is None else keys.index_select(0, plan.src)
            picked_v = values if plan.src is None else values.index_select(0, plan.src)
            layer.keys[plan.rows, :, first : self.hi] = picked_k
            layer.values[plan.rows, :, first : self.hi] = picked_v
            return keys, values
        n, lo, hi = self.n, self.lo, self.hi
        end = hi + keys.shape[2]
        layer.keys[:n, :, hi:end] = keys
        layer.values[:n, :, hi:end] = values
        return layer.keys[:n, :, lo:end], layer.values[:n, :, lo:end]

    def write_layer(
        self, index: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`write` by layer index (what the lean forward pass calls)."""
        return self.write(self.layers[index], keys, values)

    def shared_attention(
        self, step: PrefixStep, suffix_mask: torch.Tensor, scale: float
    ) -> Attender:
        """The attention of a shared-prompt decode step (see :mod:`areno_core.rollout.prefix`):
        each layer writes its new keys/values into the rows, then attends to the group's
        prompt and to the row's own tokens (``suffix_mask`` [n, window], True: visible)."""
        bias = torch.zeros(suffix_mask.shape, dtype=torch.float32, device=self.device)
        bias = bias.masked_fill_(~suffix_mask, float("-inf"))[:, None, None, :]

        def attend(
            index: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
        ) -> torch.Tensor:
            own_k, own_v = self.write(self.layers[index], keys, values)
            prompt_k, prompt_v = self.prefix.layer(index, step)
            return grouped_prefix_attention(
                q,
                prompt_k,
                prompt_v,
                step.bias,
                own_k,
                own_v,
                bias,
                step.group,
                step.slot,
                step.slots,
                scale,
            )

        return attend

    @contextlib.contextmanager
    def prefilling(self, plan: PrefillPlan) -> Iterator[None]:
        self._plan = plan
        try:
            yield
        finally:
            self._plan = None

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs for one decode step of every running row: ids, 2D mask, position ids."""
        assert self.mask is not None
        n = self.n
        self.mask[:n, self.hi] = True
        return (
            self.next_token[:n].unsqueeze(1),
            self.mask[:n, self.lo : self.hi + 1],
            self.position[:n].unsqueeze(1),
        )

    def advance(self) -> None:
        self.hi += 1
        self.position[: self.n] += 1

    # -- static decode steps (CUDA graphs) ---------------------------------------------------

    def static_inputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ids, 4D boolean mask and position ids of a decode step over the first ``rows`` rows
        and every column, computed from device state only (``lo_t``, ``hi_t``, ``n_t``): each
        running row sees its valid columns inside the window ``[lo, hi]``, and each padding row
        (``>= n``) only its own new column, so no row is fully masked."""
        assert self.mask is not None
        columns = torch.arange(self.cols, device=self.device)
        in_window = (columns >= self.lo_t) & (columns <= self.hi_t)
        padding_rows = torch.arange(rows, device=self.device) >= self.n_t
        own_column = padding_rows.unsqueeze(1) & (columns == self.hi_t)
        mask = (self.mask[:rows] & in_window) | own_column
        return (
            self.next_token[:rows].unsqueeze(1),
            mask[:, None, None, :],
            self.position[:rows].unsqueeze(1),
        )

    def set_scalars(self) -> None:
        """Copy ``lo``, ``hi`` and ``n`` into their device scalars (before a static step)."""
        self.lo_t.fill_(self.lo)
        self.hi_t.fill_(self.hi)
        self.n_t.fill_(self.n)

    @contextlib.contextmanager
    def static_step(self, rows: int) -> Iterator[None]:
        self._static_rows = rows
        try:
            yield
        finally:
            self._static_rows = 0

    def skip_ahead(self, columns: int, then: int) -> None:
        """Pretend every running row already holds ``columns`` more tokens (their keys and
        values stay zero), with room for ``then`` more: the window reaches the length a long
        rollout would reach, without computing it. Only for memory probes (see
        :meth:`NativeEngine.probe_memory`)."""
        if columns <= 0 or self.n == 0:
            return
        self.reserve(left=0, right=columns + then, max_right=columns + then)
        assert self.mask is not None
        self.mask[: self.n, self.hi : self.hi + columns] = True
        self.hi += columns
        self.position[: self.n] += columns


def prefill_mask(valid: torch.Tensor) -> torch.Tensor:
    """The [B, 1, T, T] boolean mask of a left-padded prefill: causal, padding keys hidden
    (what transformers builds for SDPA from the same 2D mask)."""
    width = valid.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
    return causal[None, None] & valid[:, None, None, :]

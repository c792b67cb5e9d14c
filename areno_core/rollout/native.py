"""The native rollout engine: batched sampling from the very module being trained.

``NativeEngine`` runs the policy (a transformers causal LM) with a KV cache on CPU or one GPU,
in ``torch.inference_mode()`` and eval mode, then puts the module back as it found it. No
weights are copied, so ``sync_weights`` is free when handed the shared module.

How a ``generate()`` call runs
------------------------------
Each (prompt, sample) pair is a *request*. At most ``max_running`` requests occupy *rows* of a
batch at once (continuous batching): when a row finishes (EOS or ``max_new_tokens``) a waiting
request takes it over, so the batch stays full while long and short completions mix.

The KV cache (:class:`_KVStore`) is one preallocated ``[rows, kv_heads, columns, head_dim]``
buffer per layer, plus a ``[rows, columns]`` attention mask. All rows share one column window
``[lo, hi)``: a row's tokens are right-aligned at ``hi`` (left padding) and the mask hides the
columns before its first token; every token carries an explicit position id, so where a row
sits in the buffer does not change what the model computes. A decode step writes column ``hi``
for every row and moves ``hi`` one to the right; the window's left edge follows the oldest
running row, so finished rows stop costing attention. Admitting requests prefills their prompts
in batches (identical prompts of the ``n`` samples are run once) and writes their keys and
values straight into the rows they take, ending at column ``hi``. Rows that finish with nobody
waiting are closed by moving the last rows into the gaps. The buffers grow (or the window is
moved back to the left) only when the window reaches the end, so this happens rarely; between
``generate()`` calls they are kept unless the session ends with ``drop_state``.

When a prompt is sampled ``n > 1`` times and the lean forward pass runs (a CPU), its keys and
values are kept once per group of samples in a :class:`~areno_core.rollout.prefix.PrefixStore`
instead of in each row, and the rows hold only their generated tokens; decode steps attend to
the group's prompt once per group and merge it with each row's own attention (see
:mod:`areno_core.rollout.prefix`; ``shared_prompt_cache=False`` turns it off). With the
transformers module (GPUs, ``lean_forward`` off, other model families) every row holds a copy.

Per decode step the engine makes one device-to-host copy (the sampled tokens and their
logprobs, needed to spot EOS); everything else is tensor ops on all rows or numpy bookkeeping.

On a GPU a decode step whose running rows fit a batch-size bucket is replayed from a captured
CUDA graph of a static-shape step (every cache column, the window applied by a mask computed
from device scalars; see :mod:`areno_core.rollout.cuda_graphs`); ``eager_decode`` turns that
off. The static step computes what the eager step computes, up to rounding.

Random numbers are a hash of ``(seed, request, token index)``, so a request samples the same
tokens whatever else runs in its batch and whatever ``max_running`` is (up to floating-point
differences between batch shapes). A request is numbered by its prompt's place in the whole
step's batch (``SamplingParams.prompt_offset`` plus its index in the call), so data-parallel
ranks that each sample a share of the prompts draw what one process would.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

from areno_core.accel.attention import FLASH, attention_of, choose_attention
from areno_core.contracts.engine import EngineOptions, EngineSpec
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.log import get_logger, warn_once
from areno_core.models.families import has_sliding_window
from areno_core.models.lean import Attender, LeanDecoder, lean_unavailable_reason
from areno_core.models.loading import cache_argument
from areno_core.options import option
from areno_core.rollout.cuda_graphs import DecodeGraphs
from areno_core.rollout.prefix import PrefixStep, PrefixStore, grouped_prefix_attention
from areno_core.rollout.sampling import (
    draw_seed,
    is_greedy,
    sample_next,
    stream_state,
    stream_uniform,
    validate_sampling,
)
from areno_core.types import Completion, FinishReason, SamplingParams
from areno_core.validators import number

TokenCallback = Callable[[list[tuple[int, int, int]]], None]
"""``on_tokens`` of :meth:`NativeEngine.generate`: ``(prompt index, sample index, token id)``
for every row that sampled a token in one step."""

logger = get_logger(__name__)

_COLUMN_ALIGN = 64
_STAT_KEYS = (
    "prompts",
    "skipped_prompts",
    "completions",
    "prompt_tokens",
    "generated_tokens",
    "prefill_forwards",
    "decode_steps",
    "peak_running",
    "generate_time_s",
    "tokens_per_s",
    "weight_syncs",
    "graph_decode_steps",
    "graph_captures",
)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _StoreLayer(CacheLayerMixin):
    """One model layer's slice of the :class:`_KVStore`, seen by transformers as a cache layer.

    ``keys`` / ``values`` are the whole preallocated buffers; what attention sees is decided by
    the store (its row count and column window).
    """

    is_sliding = False
    is_compileable = False

    def __init__(self, store: _KVStore, index: int) -> None:
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
class _PrefillPlan:
    """Where the keys/values of one prefill forward go: ``rows`` of the store, taking batch
    row ``src[i]`` for store row ``rows[i]`` (``src`` None: the identity), with ``pad`` [b, 1, P, 1]
    marking left-padding columns to zero out. With ``groups`` [b] the prompts go once each
    into those groups of the :class:`PrefixStore` instead (shared-prompt layout)."""

    rows: torch.Tensor
    src: torch.Tensor | None
    pad: torch.Tensor | None
    groups: torch.Tensor | None = None


class _KVStore:
    """Preallocated KV buffers shared by the running rows, plus per-row decode state."""

    def __init__(self, num_layers: int, device: torch.device) -> None:
        self.device = device
        self.layers = [_StoreLayer(self, i) for i in range(num_layers)]
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
        self._plan: _PrefillPlan | None = None
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

    def _allocated_buffers(self) -> Iterator[tuple[_StoreLayer, str]]:
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
        slack = max(_COLUMN_ALIGN, width // 2, right)
        if end + slack <= self.cols:
            self._move_window(new_lo)
            return
        cols = _round_up(end + slack, _COLUMN_ALIGN)
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
        self, layer: _StoreLayer, keys: torch.Tensor, values: torch.Tensor
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
    def prefilling(self, plan: _PrefillPlan) -> Iterator[None]:
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


def _prefill_mask(valid: torch.Tensor) -> torch.Tensor:
    """The [B, 1, T, T] boolean mask of a left-padded prefill: causal, padding keys hidden
    (what transformers builds for SDPA from the same 2D mask)."""
    width = valid.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
    return causal[None, None] & valid[:, None, None, :]


@attrs.define
class _RawOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


class _Generation:
    """The state of one ``generate()`` call: waiting requests, running rows, finished outputs."""

    def __init__(
        self,
        engine: NativeEngine,
        store: _KVStore,
        prompts: Sequence[Sequence[int]],
        kept: list[int],
        sampling: SamplingParams,
        n: int,
        seed: int,
        *,
        skip_ahead: int = 0,
        stop: bool = True,
        on_tokens: TokenCallback | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.n = n
        self.on_tokens = on_tokens
        self.lean = engine._lean_decoder()
        # Shared-prompt layout: each prompt's keys/values once per group of its n samples.
        # Only with the lean forward pass and eager decode steps (not with CUDA graphs).
        self.shared = (
            engine.config.shared_prompt_cache
            and n > 1
            and self.lean is not None
            and engine._graphs is None
        )
        self.prompts = prompts
        self.sampling = sampling
        self.seed = seed
        self.greedy = is_greedy(sampling)
        self.max_new = sampling.max_new_tokens
        self.budget = engine.config.prefill_batch_tokens
        stop_ids = set(engine.eos_token_ids) | set(sampling.stop_token_ids) if stop else set()
        self.stop_ids = np.array(sorted(stop_ids), dtype=np.int64)
        self.skip_ahead = skip_ahead  # memory probes only: see NativeEngine.probe_memory
        kept_arr = np.asarray(kept, dtype=np.int64)
        self.req_prompt = np.repeat(kept_arr, n)
        # Keyed by the prompt's place in the whole batch (``prompt_offset``), so a share of a
        # batch samples what the whole batch would.
        global_prompt = self.req_prompt + sampling.prompt_offset
        self.req_key = global_prompt * n + np.tile(np.arange(n, dtype=np.int64), len(kept))
        self.prompt_len = np.zeros(len(prompts), dtype=np.int64)
        self.prompt_len[kept_arr] = [len(prompts[i]) for i in kept]
        req_len = self.prompt_len[self.req_prompt]
        self.pending_max = np.maximum.accumulate(req_len[::-1])[::-1]  # longest waiting prompt
        self.num_requests = len(self.req_prompt)
        self.next_request = 0
        running = engine.options.max_running or self.num_requests
        self.capacity = min(running, self.num_requests)
        store.begin(self.capacity)
        self.row_request = np.full(self.capacity, -1, dtype=np.int64)
        self.row_count = np.zeros(self.capacity, dtype=np.int64)
        self.row_group = np.zeros(self.capacity, dtype=np.int64)  # shared layout only
        self.row_slot = np.zeros(self.capacity, dtype=np.int64)
        self.history_tokens = np.zeros((self.capacity, self.max_new), dtype=np.int64)
        self.history_logprobs = np.zeros((self.capacity, self.max_new), dtype=np.float32)
        self.outputs: list[_RawOutput | None] = [None] * self.num_requests
        self.prefill_forwards = 0
        self.decode_steps = 0
        self.peak_running = 0

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> list[_RawOutput | None]:
        store = self.store
        holes: list[int] = []
        while True:
            while self.next_request < self.num_requests and (holes or store.n < self.capacity):
                free = holes + list(range(store.n, self.capacity))
                take = min(len(free), self.num_requests - self.next_request)
                n_before = store.n
                holes = [r for r in free[take:] if r < n_before]
                holes += self._admit(np.asarray(free[:take], dtype=np.int64))
            if holes:
                self._close(holes)
                holes = []
            if store.n == 0:
                return self.outputs
            if self.skip_ahead:
                store.skip_ahead(self.skip_ahead, then=self.max_new)
                self.skip_ahead = 0
            self.peak_running = max(self.peak_running, store.n)
            holes = self._decode_step()

    def _pending_left(self) -> int:
        if self.next_request >= self.num_requests:
            return 0
        return int(self.pending_max[self.next_request])

    def _admit(self, rows: np.ndarray) -> list[int]:
        """Give the next ``len(rows)`` requests these rows; return rows that already finished."""
        first = self.next_request
        requests = np.arange(first, first + len(rows))
        self.next_request += len(rows)
        unique_prompts, which = np.unique(self.req_prompt[requests], return_inverse=True)
        by_length = np.argsort(-self.prompt_len[unique_prompts], kind="stable")
        finished: list[int] = []
        chunk: list[int] = []
        for u in by_length.tolist():
            longest = self.prompt_len[unique_prompts[chunk[0] if chunk else u]]
            if chunk and (len(chunk) + 1) * longest > self.budget:
                finished += self._prefill(rows, requests, unique_prompts, which, chunk)
                chunk = []
            chunk.append(u)
        finished += self._prefill(rows, requests, unique_prompts, which, chunk)
        return finished

    def _prefill(
        self,
        rows: np.ndarray,
        requests: np.ndarray,
        unique_prompts: np.ndarray,
        which: np.ndarray,
        chunk: list[int],
    ) -> list[int]:
        """Prefill the prompts ``unique_prompts[chunk]`` and start every request using them."""
        store, device = self.store, self.store.device
        chunk_arr = np.asarray(chunk, dtype=np.int64)
        selected = np.isin(which, chunk_arr)
        rows, requests = rows[selected], requests[selected]
        remap = np.full(len(unique_prompts), -1, dtype=np.int64)
        remap[chunk_arr] = np.arange(len(chunk_arr))
        src = remap[which[selected]]
        prompt_ids = unique_prompts[chunk_arr]
        lengths = self.prompt_len[prompt_ids]
        width = int(lengths.max())

        ids = np.zeros((len(prompt_ids), width), dtype=np.int64)
        valid = np.zeros((len(prompt_ids), width), dtype=bool)
        for j, p in enumerate(prompt_ids.tolist()):
            ids[j, width - lengths[j] :] = self.prompts[p]
            valid[j, width - lengths[j] :] = True
        ids_t = torch.from_numpy(ids).to(device)
        valid_t = torch.from_numpy(valid).to(device)
        positions = (valid_t.long().cumsum(-1) - 1).clamp_(min=0)

        pending = self._pending_left()
        # Nothing left to admit: these rows can grow by at most their token budget.
        max_right = None if pending else self.max_new
        groups_t = None
        if self.shared:
            # The rows hold only their own tokens; the prompts go to the prefix store.
            store.reserve(left=0, right=0, max_right=max_right)
            store.open_rows(rows, np.full(len(rows), store.hi, dtype=np.int64))
            groups = store.prefix.allocate(lengths, np.bincount(src, minlength=len(lengths)))
            groups_t = torch.from_numpy(groups).to(device)
            self.row_group[rows] = groups[src]
            self.row_slot[rows] = _slots(src)
        else:
            store.reserve(left=width, right=0, pending_left=pending, max_right=max_right)
            store.open_rows(rows, store.hi - lengths[src])
        rows_t = torch.from_numpy(rows).to(device)
        identity = len(src) == len(prompt_ids) and bool((src == np.arange(len(src))).all())
        src_t = None if identity else torch.from_numpy(src).to(device)
        plan = _PrefillPlan(
            rows=rows_t,
            src=src_t,
            pad=None if valid.all() else ~valid_t[:, None, :, None],
            groups=groups_t,
        )
        with store.prefilling(plan):
            if self.lean is not None:
                mask = None if bool(valid_t.all()) else _prefill_mask(valid_t)
                logits = self.lean.forward(ids_t, positions, mask, store.write_layer)
            else:
                logits = self.engine._forward(ids_t, valid_t, positions, store.cache)
        self.prefill_forwards += 1
        if src_t is not None:
            logits = logits.index_select(0, src_t)

        streams = stream_state(self.seed, torch.from_numpy(self.req_key[requests]).to(device))
        store.position[rows_t] = torch.from_numpy(lengths[src]).to(device)
        store.rng_state[rows_t] = streams
        tokens, logprobs = self._sample(logits, streams, torch.zeros_like(streams))
        store.next_token[rows_t] = tokens
        store.count[rows_t] = 1
        self.row_request[rows] = requests
        self.row_count[rows] = 0
        return self._record(rows, tokens, logprobs)

    def _decode_step(self) -> list[int]:
        store = self.store
        pending = self._pending_left()
        # With nothing left to admit, no row needs more columns than its remaining budget.
        max_right = None if pending else int((self.max_new - self.row_count[: store.n]).max())
        # (In the shared-prompt layout a waiting prompt needs no room in the rows.)
        left_room = 0 if self.shared else pending
        store.reserve(left=0, right=1, pending_left=left_room, max_right=max_right)
        input_ids, mask, positions = store.decode_inputs()
        logits = self.engine._graph_step(store)
        if logits is None and self.shared:
            assert self.lean is not None
            n = store.n
            step = store.prefix.step(self.row_group[:n], self.row_slot[:n])
            attend = store.shared_attention(step, mask, self.lean.scaling)
            logits = self.lean.forward(input_ids, positions, None, store.write_layer, attend)
        if logits is None and self.lean is not None:
            # transformers drops an all-true mask (so does the lean pass, for the same numbers)
            window = None if bool(mask.all()) else mask[:, None, None, :]
            logits = self.lean.forward(input_ids, positions, window, store.write_layer)
        if logits is None:
            logits = self.engine._forward(input_ids, mask, positions, store.cache)
        store.advance()
        self.decode_steps += 1
        n = store.n
        tokens, logprobs = self._sample(logits, store.rng_state[:n], store.count[:n])
        store.next_token[:n] = tokens
        store.count[:n] += 1
        return self._record(np.arange(n), tokens, logprobs)

    def _sample(
        self, logits: torch.Tensor, streams: torch.Tensor, counters: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.greedy:
            return sample_next(logits, self.sampling)
        uniform = stream_uniform(streams, counters)
        return sample_next(logits, self.sampling, uniform=uniform)

    def _record(self, rows: np.ndarray, tokens: torch.Tensor, logprobs: torch.Tensor) -> list[int]:
        """Append one sampled token to each row; finish rows that stopped; return them."""
        host = torch.stack((tokens.double(), logprobs.double())).cpu().numpy()  # the one sync
        token_np = host[0].astype(np.int64)
        if self.on_tokens is not None:
            requests = self.row_request[rows]
            self.on_tokens(
                [
                    (int(self.req_prompt[q]), int(q % self.n), int(t))
                    for q, t in zip(requests.tolist(), token_np.tolist(), strict=True)
                ]
            )
        counts = self.row_count[rows]
        self.history_tokens[rows, counts] = token_np
        self.history_logprobs[rows, counts] = host[1]
        counts += 1
        self.row_count[rows] = counts
        stopped = np.isin(token_np, self.stop_ids)
        done = stopped | (counts >= self.max_new)
        finished = rows[done]
        if self.shared and len(finished):
            self.store.prefix.release(self.row_group[finished])
        for row, stop in zip(finished.tolist(), stopped[done].tolist(), strict=True):
            count = int(self.row_count[row])
            self.outputs[int(self.row_request[row])] = _RawOutput(
                token_ids=self.history_tokens[row, :count].tolist(),
                logprobs=self.history_logprobs[row, :count].tolist(),
                finish_reason="stop" if stop else "length",
            )
            self.row_request[row] = -1
        return finished.tolist()

    def _close(self, holes: list[int]) -> None:
        """Remove finished rows nobody is waiting for by moving the last rows into the gaps."""
        store = self.store
        gone = set(holes)
        keep = store.n - len(gone)
        gaps = sorted(h for h in gone if h < keep)
        movers = [r for r in range(keep, store.n) if r not in gone]
        if gaps:
            store.move_rows(movers, gaps)
            self.row_request[gaps] = self.row_request[movers]
            self.row_count[gaps] = self.row_count[movers]
            self.row_group[gaps] = self.row_group[movers]
            self.row_slot[gaps] = self.row_slot[movers]
            self.history_tokens[gaps] = self.history_tokens[movers]
            self.history_logprobs[gaps] = self.history_logprobs[movers]
        store.n = keep
        store.refresh_window()


@attrs.frozen
class NativeEngineConfig:
    """The native engine's own options (``--rollout-engine native``)."""

    prefill_batch_tokens: int = option(
        16384,
        "Native engine: most padded prompt tokens per prefill forward pass; larger admissions "
        "are split into several passes (lower it to bound prefill memory).",
        validator=number(min=1, integer=True),
    )
    lean_forward: bool = option(
        True,
        "Native engine: on a CPU, run Qwen3, Qwen2 and Llama models through areno's lean "
        "forward pass (the same operations as the transformers module with SDPA attention, so "
        "the same numbers in float32, without its per-call overhead; a bfloat16 model attends "
        "in float32); off, or for other models and on GPUs, the transformers module runs.",
        negatable=True,
    )
    shared_prompt_cache: bool = option(
        True,
        "Native engine: when a prompt is sampled several times (n > 1) and the lean forward "
        "pass runs, keep its keys/values once per group of samples and let decode steps "
        "attend to it once per group (exact up to rounding; less memory); off, every sample's "
        "row holds its own copy of the prompt.",
        negatable=True,
    )


def _slots(src: np.ndarray) -> np.ndarray:
    """Each entry's place among the earlier entries with the same value ([0, 1, 0, 2] for
    [4, 4, 7, 4])."""
    order = np.argsort(src, kind="stable")
    ranked = src[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(src)]))
    slots = np.empty(len(src), dtype=np.int64)
    slots[order] = np.arange(len(src)) - run_start
    return slots


class NativeEngine:
    """Rollout engine that samples from the training module itself (see the module docstring).

    ``tokenizer_or_eos_ids`` is either a tokenizer (its ``eos_token_id`` and the model's
    ``generation_config.eos_token_id`` end a completion, and completions get decoded ``text``)
    or the exact EOS token ids (an int or a sequence of ints; ``text`` is then empty).
    """

    name = "native"
    lora_weights = "module"  # see EngineSpec: it samples from the module, adapters included

    def __init__(
        self,
        model: nn.Module,
        tokenizer_or_eos_ids: Any = None,
        options: EngineOptions | None = None,
        config: NativeEngineConfig | None = None,
    ) -> None:
        self.model = model
        self.options = options if options is not None else EngineOptions()
        self.config = config if config is not None else NativeEngineConfig()
        self.tokenizer, self.eos_token_ids = _resolve_eos(model, tokenizer_or_eos_ids)
        text_config = _text_config(model)
        # Sliding windows are masks over the kept keys; a static decode step (CUDA graphs)
        # passes one mask to every layer, so windowed models decode eagerly.
        self._windowed = _check_attention(text_config)
        self._num_layers = int(text_config.num_hidden_layers)
        self.attn_implementation = _pick_attention(model, self.options.attn_backend)
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._cache_argument = cache_argument(model)
        self._store: _KVStore | None = None
        self._lean: LeanDecoder | None = None
        # Decode steps from captured CUDA graphs: created with the first store on a GPU,
        # never with eager_decode (tests may install one with capture=False on a CPU).
        self._graphs: DecodeGraphs | None = None
        self._weights_key: tuple[int, ...] = ()
        self._in_session = False
        self.policy_version = 0
        self.stats: dict[str, float] = dict.fromkeys(_STAT_KEYS, 0.0)

    # -- session -----------------------------------------------------------------------------

    def start_session(self) -> None:
        if self._in_session:
            raise RuntimeError("start_session() called while a rollout session is already open")
        self._in_session = True
        self.stats = dict.fromkeys(_STAT_KEYS, 0.0)

    def end_session(self, *, drop_state: bool = False) -> None:
        self._in_session = False
        if drop_state:
            self.drop_state()

    def drop_state(self) -> None:
        """Free the KV cache, per-row buffers and captured decode graphs (they are rebuilt on
        the next generate())."""
        if self._graphs is not None:
            self._graphs.reset()
        if self._store is not None:
            device = self._store.device
            self._store.free()
            self._store = None
            if device.type == "cuda":
                torch.cuda.empty_cache()

    @property
    def state_bytes(self) -> int:
        """Bytes held by the KV cache and masks between generate() calls."""
        return 0 if self._store is None else self._store.nbytes()

    def sync_weights(self, weights: Mapping[str, Any] | nn.Module, *, version: int) -> None:
        """Sample from ``weights`` (version ``version``) from now on. The shared module itself
        costs nothing; a state dict (possibly partial) or another module's weights are copied
        into the module in place."""
        if isinstance(weights, nn.Module):
            state = None if weights is self.model else weights.state_dict()
        elif isinstance(weights, Mapping):
            state = dict(weights)
        else:
            raise TypeError(
                f"sync_weights() takes a state dict or a torch module, got {type(weights).__name__}"
            )
        self.stats["weight_syncs"] += 1
        self.policy_version = int(version)
        if state is None:
            return
        with torch.no_grad():
            result = self.model.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise ValueError(
                "sync_weights(): keys not in the policy model: "
                + ", ".join(sorted(result.unexpected_keys)[:5])
            )
        logger.debug("synced %d tensors into the rollout model", len(state))

    # -- generation --------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        n: int = 1,
        on_tokens: TokenCallback | None = None,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt (token ids). See the module docstring.

        The random stream comes from ``sampling.seed`` when set, else one draw from torch's
        global generator. ``on_tokens`` (optional; the agent endpoint streams with it) is
        called after every prefill and decode step, on this thread, with one ``(prompt index,
        sample index, token id)`` per row that sampled a token.
        """
        validate_sampling(sampling)
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        began = time.perf_counter()
        kept: list[int] = []
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompt {i} has no tokens")
            if len(prompt) <= self.options.max_prompt_tokens:
                kept.append(i)
        skipped = len(prompts) - len(kept)
        if skipped:
            warn_once(
                logger,
                "rollout.skipped_prompts",
                "skipping prompts longer than max_prompt_tokens=%d (counted in "
                "rollout stats 'skipped_prompts')",
                self.options.max_prompt_tokens,
            )
        results: list[list[Completion]] = [[] for _ in prompts]
        run: _Generation | None = None
        if kept:
            seed = sampling.seed if sampling.seed is not None else draw_seed()
            with self._rollout_mode():
                run = _Generation(
                    self, self._get_store(), prompts, kept, sampling, n, seed, on_tokens=on_tokens
                )
                raw = run.run()
            self._fill_results(results, prompts, run, raw, n)
        self._update_stats(prompts, kept, results, run, time.perf_counter() - began)
        return results

    def probe_memory(
        self,
        rows: int,
        *,
        prompt_tokens: int,
        context_tokens: int,
        sampling: SamplingParams,
        n: int = 1,
        decode_steps: int = 2,
    ) -> None:
        """Reproduce the most memory-hungry moment of a rollout, for memory probes
        (``--tune-params``): ``rows`` sequences decoded at once, each with a prompt of
        ``prompt_tokens`` random tokens (``n`` samples per prompt, so prefills are shared as in a
        run) and a cache window of ``context_tokens``; then ``decode_steps`` decode steps with
        ``sampling`` (top-k/top-p included; EOS never stops a row).

        The tokens between the prompt and the last decode steps are not computed: the rows
        jump there with zero keys and values, which cost the same memory. Stats and the
        session are left alone; the cache is kept like after ``generate``.
        """
        if rows < 1 or prompt_tokens < 1 or decode_steps < 1:
            raise ValueError("probe_memory: rows, prompt_tokens and decode_steps must be >= 1")
        per_prompt = n if rows % n == 0 else 1
        vocab = int(_text_config(self.model).vocab_size)
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, vocab, (rows // per_prompt, prompt_tokens), generator=generator)
        steps = SamplingParams(
            max_new_tokens=decode_steps + 1,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            greedy=sampling.greedy,
        )
        skip = max(0, context_tokens - prompt_tokens - steps.max_new_tokens)
        previous = self.options
        self.options = attrs.evolve(previous, max_running=rows)
        try:
            with self._rollout_mode():
                run = _Generation(
                    self,
                    self._get_store(),
                    prompts.tolist(),
                    list(range(len(prompts))),
                    steps,
                    per_prompt,
                    seed=0,
                    skip_ahead=skip,
                    stop=False,
                )
                run.run()
        finally:
            self.options = previous

    def _get_store(self) -> _KVStore:
        device = _model_device(self.model)
        if self._store is None or self._store.device != device:
            self.drop_state()
            self._store = _KVStore(self._num_layers, device)
        if (
            self._graphs is None
            and device.type == "cuda"
            and not self.options.eager_decode
            and not self._windowed
        ):
            self._graphs = DecodeGraphs(capture=True)
        if self._graphs is not None:
            self._weights_key = _weights_key(self.model)
        return self._store

    def _lean_decoder(self) -> LeanDecoder | None:
        """The lean forward pass for this generate() call (None: the transformers module runs,
        on GPUs, with ``lean_forward`` off, or for a model the lean pass does not support)."""
        if not self.config.lean_forward or _model_device(self.model).type != "cpu":
            self._lean = None
            return None
        lean = self._lean
        if lean is not None and lean.is_current(self.model):
            return lean
        self._lean = None
        reason = lean_unavailable_reason(self.model)
        if reason is not None:
            warn_once(
                logger,
                f"rollout.no_lean.{type(self.model).__name__}",
                "native engine: %s decodes through its transformers forward (the lean forward "
                "pass does not run it: %s)",
                type(self.model).__name__,
                reason,
                level=logging.INFO,
            )
            return None
        self._lean = LeanDecoder(self.model)
        return self._lean

    def _graph_step(self, store: _KVStore) -> torch.Tensor | None:
        """Logits of this decode step from a captured graph (a static step without capture on
        a CPU); None when graphs are off or the running rows fit no graph size."""
        graphs = self._graphs
        if graphs is None or self._windowed:
            return None
        store.set_scalars()
        key = (id(store), store.generation, self._weights_key)
        before = graphs.stats.captures
        logits = graphs.step(key, store.n, store.rows, lambda rows: self._static_forward(rows))
        if logits is None:
            return None
        self.stats["graph_decode_steps"] += 1
        self.stats["graph_captures"] += graphs.stats.captures - before
        return logits[: store.n]

    def _static_forward(self, rows: int) -> torch.Tensor:
        """One decode step over the first ``rows`` rows and every cache column (what a graph
        records). It runs SDPA with an explicit 4D mask whatever the model's attention
        implementation, since flash-attn's padded decode reads lengths back to the host."""
        store = self._store
        assert store is not None
        input_ids, mask, positions = store.static_inputs(rows)
        with _attention(self.model, "sdpa"), store.static_step(rows):
            return self._forward(input_ids, mask, positions, store.cache)

    @contextlib.contextmanager
    def _rollout_mode(self) -> Iterator[None]:
        model = self.model
        was_training = model.training
        config = getattr(model, "config", None)
        previous = getattr(config, "_attn_implementation", None)
        switch = (
            previous is not None
            and previous != self.attn_implementation
            and hasattr(model, "set_attn_implementation")
        )
        model.eval()
        try:
            if switch:
                model.set_attn_implementation(self.attn_implementation)
            with torch.inference_mode():
                yield
        finally:
            if switch:
                model.set_attn_implementation(previous)
            model.train(was_training)

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Cache,
    ) -> torch.Tensor:
        """Run the model; return the logits of the last position of each row, [B, V]."""
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            self._cache_argument: cache,
            "use_cache": True,
        }
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs).logits[:, -1, :]

    def _fill_results(
        self,
        results: list[list[Completion]],
        prompts: Sequence[Sequence[int]],
        run: _Generation,
        raw: list[_RawOutput | None],
        n: int,
    ) -> None:
        outputs = [out for out in raw if out is not None]
        assert len(outputs) == len(raw), "every request must finish"
        texts = [""] * len(outputs)
        if self.tokenizer is not None:
            bodies = [
                o.token_ids[:-1] if o.finish_reason == "stop" else o.token_ids for o in outputs
            ]
            texts = self.tokenizer.batch_decode(bodies, skip_special_tokens=False)
        for out, text, p in zip(outputs, texts, run.req_prompt.tolist(), strict=True):
            results[p].append(
                Completion(
                    prompt_ids=tuple(prompts[p]),
                    token_ids=tuple(out.token_ids),
                    logprobs=tuple(out.logprobs),
                    text=text,
                    finish_reason=out.finish_reason,
                    policy_version=self.policy_version,
                )
            )

    def _update_stats(
        self,
        prompts: Sequence[Sequence[int]],
        kept: list[int],
        results: list[list[Completion]],
        run: _Generation | None,
        seconds: float,
    ) -> None:
        stats = self.stats
        stats["prompts"] += len(prompts)
        stats["skipped_prompts"] += len(prompts) - len(kept)
        stats["completions"] += sum(len(r) for r in results)
        stats["prompt_tokens"] += sum(len(prompts[i]) * len(results[i]) for i in kept)
        stats["generated_tokens"] += sum(len(c.token_ids) for r in results for c in r)
        stats["generate_time_s"] += seconds
        if run is not None:
            stats["prefill_forwards"] += run.prefill_forwards
            stats["decode_steps"] += run.decode_steps
            stats["peak_running"] = max(stats["peak_running"], float(run.peak_running))
        if stats["generate_time_s"] > 0:
            stats["tokens_per_s"] = stats["generated_tokens"] / stats["generate_time_s"]


def create_native_engine(
    model: nn.Module,
    tokenizer: Any,
    options: EngineOptions | None = None,
    config: NativeEngineConfig | None = None,
) -> NativeEngine:
    """Factory of the ``native`` rollout engine."""
    return NativeEngine(model, tokenizer, options, config)


NATIVE_ENGINE = EngineSpec(
    name="native",
    summary="Samples from the module being trained, with a KV cache and continuous batching "
    "(CPU or one GPU); weight syncs cost nothing.",
    factory=create_native_engine,
    config_cls=NativeEngineConfig,
    lora_weights="module",  # it samples from the training module, adapters included
)


# -- helpers ----------------------------------------------------------------------------------


def _model_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def _text_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError("NativeEngine needs a transformers model (with a .config)")
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _check_attention(config: Any) -> bool:
    """Whether some layers of a model with this config attend through a sliding window (the
    cache keeps every key; each layer's mask applies its window). Layer kinds other than full
    and sliding attention are refused."""
    try:
        return has_sliding_window(config)
    except ConfigError as exc:
        raise NotAvailableError(f"the native rollout engine cannot run this model: {exc}") from None


def _resolve_eos(model: nn.Module, tokenizer_or_eos_ids: Any) -> tuple[Any, tuple[int, ...]]:
    def as_ids(value: Any) -> set[int]:
        if value is None:
            return set()
        if isinstance(value, int):
            return {int(value)}
        return {int(v) for v in value}

    source = tokenizer_or_eos_ids
    is_ids = isinstance(source, (list, tuple, set, frozenset)) and all(
        isinstance(v, int) for v in source
    )
    if isinstance(source, int) or is_ids:
        return None, tuple(sorted(as_ids(source)))
    ids: set[int] = set()
    if source is not None:
        ids |= as_ids(getattr(source, "eos_token_id", None))
    generation_config = getattr(model, "generation_config", None)
    ids |= as_ids(getattr(generation_config, "eos_token_id", None))
    if not ids:
        logger.debug("no EOS token known: completions end at max_new_tokens or stop_token_ids")
    return source, tuple(sorted(ids))


def _pick_attention(model: nn.Module, backend: str) -> str:
    """flash_attention_2 when ``backend`` is flash and flash-attn can run this model (see
    :func:`areno_core.accel.attention.choose_attention`, which warns once otherwise); else the
    model's own SDPA or eager attention."""
    dtype = next(model.parameters()).dtype
    chosen = choose_attention(backend, _model_device(model), dtype)
    if chosen == FLASH:
        return chosen
    current = attention_of(model) or "sdpa"
    return current if current in ("sdpa", "eager") else "sdpa"


def _weights_key(model: nn.Module) -> tuple[int, ...]:
    """Where the model's weights live: captured graphs read them there, so any move (an
    offload, a reload) must drop the graphs."""
    return tuple(p.data_ptr() for p in model.parameters())


@contextlib.contextmanager
def _attention(model: nn.Module, implementation: str) -> Iterator[None]:
    """Run ``model`` with ``implementation`` for the block (no change when it already does)."""
    previous = attention_of(model)
    switch = previous not in (None, implementation) and hasattr(model, "set_attn_implementation")
    if switch:
        model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(previous)


def benchmark_decode(
    model: nn.Module,
    *,
    batch_size: int,
    prompt_len: int = 16,
    new_tokens: int = 64,
    with_hf_generate: bool = True,
) -> dict[str, float]:
    """Rough decode throughput (generated tokens per second) of the native engine and, for
    reference, of ``model.generate``, on random prompts with EOS disabled. For humans, not
    tests: the numbers depend on the machine."""
    vocab = int(_text_config(model).vocab_size)
    device = _model_device(model)
    rng = torch.Generator().manual_seed(0)
    prompt_t = torch.randint(0, vocab, (batch_size, prompt_len), generator=rng)
    sampling = SamplingParams(max_new_tokens=new_tokens, greedy=True)
    engine = NativeEngine(model, (), EngineOptions(attn_backend="native"))
    engine.generate(prompt_t[:, :4].tolist(), SamplingParams(max_new_tokens=2, greedy=True))
    began = time.perf_counter()
    out = engine.generate(prompt_t.tolist(), sampling)
    seconds = time.perf_counter() - began
    result = {"native_tokens_per_s": sum(len(c[0].token_ids) for c in out) / seconds}
    if with_hf_generate:
        ids = prompt_t.to(device)
        with torch.inference_mode():
            began = time.perf_counter()
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )
            seconds = time.perf_counter() - began
        result["hf_generate_tokens_per_s"] = batch_size * new_tokens / seconds
    return result


__all__ = [
    "NATIVE_ENGINE",
    "EngineOptions",
    "NativeEngine",
    "NativeEngineConfig",
    "benchmark_decode",
    "create_native_engine",
]

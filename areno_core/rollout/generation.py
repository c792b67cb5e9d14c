"""One ``generate()`` call of the native engine: requests waiting for a row, rows running
(continuous batching), prefill of admitted prompts, decode steps, sampling and bookkeeping
(see :mod:`areno_core.rollout.native` for how a call runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np
import torch

from areno_core.contracts.engine import EngineOptions
from areno_core.models.lean import LeanDecoder
from areno_core.rollout.kv_cache import KVStore, PrefillPlan, prefill_mask
from areno_core.rollout.native_config import SHARED_PROMPT_MIN_TOKENS
from areno_core.rollout.sampling import (
    is_greedy,
    sample_next,
    stream_state,
    stream_uniform,
)
from areno_core.types import FinishReason, SamplingParams

TokenCallback = Callable[[list[tuple[int, int, int, float]]], None]
"""``on_tokens`` of :meth:`NativeEngine.generate`: ``(prompt index, sample index, token id,
logprob)`` for every row that sampled a token in one step."""


def share_prompts(setting: bool | None, prompts: Sequence[Sequence[int]], kept: list[int]) -> bool:
    """``shared_prompt_cache`` for one call: the setting, or for ``None`` (auto) whether the
    kept prompts average at least :data:`SHARED_PROMPT_MIN_TOKENS` tokens."""
    if setting is not None:
        return setting
    if not kept:
        return False
    return sum(len(prompts[i]) for i in kept) >= SHARED_PROMPT_MIN_TOKENS * len(kept)


class StepModel(Protocol):
    """What a :class:`Generation` asks of its engine
    (:class:`~areno_core.rollout.native.NativeEngine`)."""

    config: Any  # prefill_batch_tokens, shared_prompt_cache
    options: EngineOptions
    eos_token_ids: tuple[int, ...]

    @property
    def uses_graphs(self) -> bool:
        """Whether decode steps may replay captured CUDA graphs."""

    def lean_decoder(self) -> LeanDecoder | None:
        """The lean forward pass, when it runs this model on this device."""

    def forward_logits(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """The last position's logits of an eager forward pass over the cache."""

    def graph_step(self, store: KVStore) -> torch.Tensor | None:
        """A decode step replayed from a captured graph, or None when none fits."""


@attrs.define
class RawOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


class Generation:
    """The state of one ``generate()`` call: waiting requests, running rows, finished outputs."""

    def __init__(
        self,
        engine: StepModel,
        store: KVStore,
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
        self.lean = engine.lean_decoder()
        self.prompts = prompts
        # Shared-prompt layout: each prompt's keys/values once per group of its n samples.
        # Only with the lean forward pass and eager decode steps (not with CUDA graphs).
        self.shared = (
            n > 1
            and self.lean is not None
            and not engine.uses_graphs
            and share_prompts(engine.config.shared_prompt_cache, prompts, kept)
        )
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
        self.outputs: list[RawOutput | None] = [None] * self.num_requests
        self.prefill_forwards = 0
        self.decode_steps = 0
        self.peak_running = 0

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> list[RawOutput | None]:
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
        remap = np.full(len(unique_prompts), -1, dtype=np.int64)
        remap[chunk_arr] = np.arange(len(chunk_arr))
        selected = remap[which] >= 0  # a lookup: np.isin sorts, slow on small arrays
        rows, requests = rows[selected], requests[selected]
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
            self.row_slot[rows] = row_slots(src)
        else:
            store.reserve(left=width, right=0, pending_left=pending, max_right=max_right)
            store.open_rows(rows, store.hi - lengths[src])
        rows_t = torch.from_numpy(rows).to(device)
        identity = len(src) == len(prompt_ids) and bool((src == np.arange(len(src))).all())
        src_t = None if identity else torch.from_numpy(src).to(device)
        plan = PrefillPlan(
            rows=rows_t,
            src=src_t,
            pad=None if valid.all() else ~valid_t[:, None, :, None],
            groups=groups_t,
        )
        with store.prefilling(plan):
            if self.lean is not None:
                mask = None if bool(valid_t.all()) else prefill_mask(valid_t)
                logits = self.lean.forward(ids_t, positions, mask, store.write_layer)
            else:
                logits = self.engine.forward_logits(ids_t, valid_t, positions, store.cache)
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
        logits = self.engine.graph_step(store)
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
            logits = self.engine.forward_logits(input_ids, mask, positions, store.cache)
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
                    (int(self.req_prompt[q]), int(q % self.n), int(t), float(v))
                    for q, t, v in zip(
                        requests.tolist(), token_np.tolist(), host[1].tolist(), strict=True
                    )
                ]
            )
        counts = self.row_count[rows]
        self.history_tokens[rows, counts] = token_np
        self.history_logprobs[rows, counts] = host[1]
        counts += 1
        self.row_count[rows] = counts
        stopped = (token_np[:, None] == self.stop_ids[None, :]).any(axis=1)  # few stop ids
        done = stopped | (counts >= self.max_new)
        finished = rows[done]
        if self.shared and len(finished):
            self.store.prefix.release(self.row_group[finished])
        for row, stop in zip(finished.tolist(), stopped[done].tolist(), strict=True):
            count = int(self.row_count[row])
            self.outputs[int(self.row_request[row])] = RawOutput(
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


def row_slots(src: np.ndarray) -> np.ndarray:
    """Each entry's place among the earlier entries with the same value ([0, 1, 0, 2] for
    [4, 4, 7, 4])."""
    order = np.argsort(src, kind="stable")
    ranked = src[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(src)]))
    slots = np.empty(len(src), dtype=np.int64)
    slots[order] = np.arange(len(src)) - run_start
    return slots

"""Decode steps replayed from captured CUDA graphs (used by the native rollout engine).

One decode step of a transformers model launches hundreds of small kernels; at small batch
sizes launching them costs more than running them. A CUDA graph records the kernels of one
step once and replays them with a single launch. Graphs need fixed shapes and fixed memory
addresses, so the engine runs captured steps on a *static* view of its KV cache: a batch of
``bucket`` rows (the running rows plus idle padding rows) attending over every column of the
cache buffer, with the live window ``[lo, hi]`` and each row's padding applied through a mask.
Everything that changes from step to step lives in device tensors the graph reads (the rows'
next tokens and positions, the mask, and three scalars ``lo``, ``hi``, ``n``).

:class:`DecodeGraphs` is the bookkeeping: which batch sizes get a graph (:func:`bucket_sizes`,
:func:`bucket_for`), capturing lazily the first time a size is needed, replaying, and
dropping every graph when the buffers or the weights they point at are reallocated (the
``key`` changes). With ``capture=False`` the same static step runs eagerly, which is how the
bookkeeping and the static step are tested on a CPU; ``--eager-decode`` turns graphs off.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import torch

from areno_core.log import get_logger

logger = get_logger(__name__)

# Batch sizes that get a graph (plus the engine's own row capacity when it is smaller than the
# largest): dense where decode batches usually are, sparser above. Running rows are padded up
# to the next size, so at most ~25% of a captured step above 32 rows is padding.
DEFAULT_BUCKETS: tuple[int, ...] = (
    1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 448, 512,
)  # fmt: skip
WARMUP_STEPS = 2


def bucket_sizes(capacity: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """Batch sizes graphs may be captured for when the cache has ``capacity`` rows: the
    standard sizes below ``capacity``, and ``capacity`` itself unless it is above the largest
    standard size (batches larger than that run eagerly)."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    sizes = [b for b in sorted(buckets) if b < capacity]
    if capacity <= max(buckets):
        sizes.append(capacity)
    return tuple(sizes)


def bucket_for(
    running: int, capacity: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS
) -> int | None:
    """The smallest graph batch size that holds ``running`` rows; None when none does."""
    if running < 1 or running > capacity:
        raise ValueError(f"running rows must be in [1, {capacity}], got {running}")
    sizes = bucket_sizes(capacity, buckets)
    index = bisect.bisect_left(sizes, running)
    return sizes[index] if index < len(sizes) else None


@attrs.define
class GraphStats:
    captures: int = 0  # graphs recorded (or static steps prepared, without capture)
    replays: int = 0  # decode steps served by a graph (or by the static step)
    resets: int = 0  # times every graph was dropped because buffers or weights moved


class _Eager:
    """The static step run eagerly (``capture=False``)."""

    def __init__(self, forward: Callable[[int], torch.Tensor], bucket: int) -> None:
        self.forward = forward
        self.bucket = bucket

    def replay(self) -> torch.Tensor:
        return self.forward(self.bucket)


class _Captured:
    """One recorded CUDA graph and the output tensor its replays overwrite."""

    def __init__(self, graph: Any, output: torch.Tensor) -> None:
        self.graph = graph
        self.output = output

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class DecodeGraphs:
    """Captured decode steps per batch size, valid for one ``key`` (see the module docstring).

    ``step(key, running, capacity, forward)`` returns the logits ``[bucket, vocab]`` of one
    decode step, or None when ``running`` rows fit no bucket (the caller then runs its eager
    step). ``forward(bucket)`` must compute the step from device tensors only, without reading
    any value back to the host, and must be idempotent (warm-up runs and the capture call it
    more than once for the same step).
    """

    def __init__(
        self,
        *,
        capture: bool,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        warmup_steps: int = WARMUP_STEPS,
    ) -> None:
        if not buckets or min(buckets) < 1:
            raise ValueError(f"buckets must be positive batch sizes, got {buckets!r}")
        self.capture = capture
        self.buckets = tuple(sorted(set(buckets)))
        self.warmup_steps = warmup_steps
        self.stats = GraphStats()
        self._key: Hashable | None = None
        self._entries: dict[int, _Eager | _Captured] = {}
        self._pool: Any = None

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._entries))

    def bucket(self, running: int, capacity: int) -> int | None:
        return bucket_for(running, capacity, self.buckets)

    def step(
        self,
        key: Hashable,
        running: int,
        capacity: int,
        forward: Callable[[int], torch.Tensor],
    ) -> torch.Tensor | None:
        bucket = self.bucket(running, capacity)
        if bucket is None:
            return None
        if key != self._key:
            if self._entries:
                self.stats.resets += 1
            self.reset()
            self._key = key
        entry = self._entries.get(bucket)
        if entry is None:
            entry = self._record(bucket, forward)
            self._entries[bucket] = entry
            self.stats.captures += 1
        self.stats.replays += 1
        return entry.replay()

    def reset(self) -> None:
        """Drop every graph (and its memory pool)."""
        self._entries.clear()
        self._pool = None
        self._key = None

    def _record(self, bucket: int, forward: Callable[[int], torch.Tensor]) -> _Eager | _Captured:
        if not self.capture:
            return _Eager(forward, bucket)
        # Warm up on a side stream (lazy initialisations must not happen during capture), then
        # record; every graph shares one memory pool.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_steps):
                forward(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = forward(bucket)
        self._pool = graph.pool()
        logger.debug("captured a decode CUDA graph for %d rows", bucket)
        return _Captured(graph, output)


__all__ = ["DEFAULT_BUCKETS", "DecodeGraphs", "GraphStats", "bucket_for", "bucket_sizes"]

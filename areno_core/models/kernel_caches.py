"""Small caches for torch's oneDNN CPU kernels, so bfloat16 training does not grow in memory.

On a CPU with bfloat16 instructions (AVX512-BF16 or AMX), torch runs bfloat16 matrix products
through oneDNN. Two caches keep each product's prepared kernel for reuse, keyed by its shapes:
oneDNN's own primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and the one of ideep,
torch's wrapper around it (``LRU_CACHE_CAPACITY``). Each holds up to 1,024 entries by default,
and an entry holds memory beside its kernel.

A training step of areno meets new shapes all the time: the packed forward runs a microbatch's
real tokens, and microbatches are cut into pieces of similar length, so the row count of every
product changes from one piece to the next. The caches then fill with kernels that are never
used again. Measured on a 2-core AMD EPYC with AVX512-BF16 (docs/performance.md): one SFT
step's peak RSS on ``random:qwen3-small`` grew from 1.4 GiB to 2.7 GiB over 14 steps with the
default capacities, while float32 (whose products go through MKL) stayed at 1.6 GiB. With 32
entries, bfloat16 stayed at 1.3-1.4 GiB, for less CPU time. Workloads with few shapes
(decoding a fixed batch, fixed-length packed sequences) reuse their kernels with 32 entries
as well.

:func:`bound_kernel_caches` sets both capacities unless the user has set them. The variables
are read once, when torch first builds such a kernel, so it runs before any model is loaded:
the ``areno`` command calls it at start, and :func:`areno_core.models.load_model` (through
which every model of a run is loaded) calls it again for the Python API. A process that has
already run a bfloat16 product keeps the capacities it started with.
"""

from __future__ import annotations

import os

# Entries in each cache: enough for the products of a decode step or a training piece (about
# 3 kernels per linear shape) to be reused, few enough that their memory stays small.
CACHE_CAPACITY = 32
CAPACITY_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(capacity: int = CACHE_CAPACITY) -> dict[str, str]:
    """Set each of :data:`CAPACITY_VARIABLES` to ``capacity`` unless it is already set;
    return the values now in the environment (the user's own where they set one)."""
    if capacity < 1:
        raise ValueError(f"kernel cache capacity must be at least 1, got {capacity}")
    return {name: os.environ.setdefault(name, str(capacity)) for name in CAPACITY_VARIABLES}


__all__ = ["CACHE_CAPACITY", "CAPACITY_VARIABLES", "bound_kernel_caches"]

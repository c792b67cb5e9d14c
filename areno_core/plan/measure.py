"""Counting the bytes of tensor memory a block of code allocates, on any device (CPU too).

A torch dispatch mode sees every tensor an operation returns; each new storage is counted
until it is freed (a weak reference on the storage says when). ``peak`` is the largest total
of storages allocated inside the block and alive at the same time: on a CPU, where torch has
no allocator statistics, the figure a GPU's ``max_memory_allocated`` would give for the block
above what was allocated before it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as m: ...`` then ``m.peak``: see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._seen: dict[int, Any] = {}

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.current -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0 or key in self._seen:
                continue
            nbytes = storage.nbytes()
            self._seen[key] = weakref.finalize(storage, self._free, key, nbytes)
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        return out

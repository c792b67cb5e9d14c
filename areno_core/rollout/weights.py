"""Policy weights packed for another process: one shared-memory buffer per dtype.

    packed = pack_weights(model.policy)         # trainer: copy the parameters out
    connection.send(packed)                     # through a torch.multiprocessing pipe
    engine.sync_weights(packed.state_dict(), version=v)   # worker: a state dict of views

:func:`pack_weights` copies every parameter into a flat buffer allocated in shared memory, so
sending it through a ``torch.multiprocessing`` connection passes a file descriptor, not the
bytes. Each call allocates fresh buffers: the receiver may hold an older set while the trainer
updates its parameters, and never sees a half-written update. The buffers are freed when both
sides drop them.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import torch


@attrs.frozen
class PackedWeights:
    """A policy's parameters as views into flat shared buffers (one per dtype)."""

    buffers: dict[str, torch.Tensor]
    """Flat buffer per dtype name (``"float32"``, ``"bfloat16"``, ...)."""
    entries: tuple[tuple[str, str, tuple[int, ...], int], ...]
    """``(name, dtype name, shape, offset)`` of each parameter in its dtype's buffer."""

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameter name -> tensor (views into the buffers, no copy)."""
        out = {}
        for name, dtype, shape, offset in self.entries:
            size = 1
            for dim in shape:
                size *= dim
            out[name] = self.buffers[dtype][offset : offset + size].view(shape)
        return out


def pack_weights(module: torch.nn.Module) -> PackedWeights:
    """Copy ``module``'s parameters (each shared parameter once) into new shared-memory
    buffers on the CPU."""
    return pack_tensors(module.named_parameters())


def pack_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> PackedWeights:
    """Copy named tensors into new shared-memory buffers on the CPU (see :func:`pack_weights`)."""
    tensors = [(name, t.detach()) for name, t in named]
    sizes: dict[str, int] = {}
    entries = []
    for name, tensor in tensors:
        dtype = str(tensor.dtype).removeprefix("torch.")
        entries.append((name, dtype, tuple(tensor.shape), sizes.get(dtype, 0)))
        sizes[dtype] = sizes.get(dtype, 0) + tensor.numel()
    dtypes = {str(t.dtype).removeprefix("torch."): t.dtype for _, t in tensors}
    buffers = {
        name: torch.empty(size, dtype=dtypes[name]).share_memory_() for name, size in sizes.items()
    }
    with torch.no_grad():
        for (_, tensor), (_, dtype, _, offset) in zip(tensors, entries, strict=True):
            buffers[dtype][offset : offset + tensor.numel()].copy_(tensor.reshape(-1))
    return PackedWeights(buffers, tuple(entries))


__all__ = ["PackedWeights", "pack_tensors", "pack_weights"]

"""How much memory a phase of a run needs, and moving optimizer state out of the way.

:class:`MemoryMeter` measures the peak memory of a block of code on the run's device:

* on a CUDA GPU, the memory in use on the whole device: what other processes (and this
  process's CUDA context) held when the block started, plus the peak of torch's caching
  allocator during the block (``max_memory_reserved``), so it is what ``nvidia-smi`` would
  show at the worst moment;
* on a CPU, the peak resident set size (RSS) of this process during the block. Linux lets a
  process reset its recorded peak (``/proc/self/clear_refs``); where that is not allowed the
  meter falls back to the lifetime peak when the block raised it, else to the larger of the
  RSS before and after the block (a lower bound).

Measurements must not nest: starting one resets the peak the outer one is tracking.

:class:`PhaseMemory` turns measurements into the run's ``memory/*`` metrics
(``memory/rollout_peak_mib``, ``memory/train_peak_mib``). :func:`move_optimizer_state` moves
an optimizer's state tensors (and float32 master weights) between devices, for
``--offload-optimizer``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
import torch

from areno_core.accel.master_weights import MasterWeightOptimizer
from areno_core.log import get_logger

logger = get_logger(__name__)

MIB = 1024 * 1024
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_MEMINFO = Path("/proc/meminfo")


@attrs.define
class Measurement:
    """Filled in when the ``with meter.measure()`` block ends."""

    peak_bytes: int = 0
    exact: bool = True  # False: a lower bound (the CPU fallback without a peak reset)


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_rss_bytes() -> int:
    """Resident memory of this process now."""
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    return _lifetime_peak_rss_bytes()  # no /proc: the best figure getrusage gives


def _lifetime_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS: bytes


def _reset_peak_rss() -> bool:
    """Reset this process's recorded peak RSS (Linux >= 4.0); False where not allowed."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _meminfo_bytes(field: str) -> int | None:
    """One ``/proc/meminfo`` field in bytes (None where the kernel does not report it)."""
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def system_memory_bytes() -> int:
    """Total physical memory of this machine."""
    total = _meminfo_bytes("MemTotal")
    if total is not None:
        return total
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError, AttributeError):
        raise RuntimeError("cannot tell how much memory this machine has") from None


def available_memory_bytes(device: str | torch.device) -> int:
    """Memory a new allocation can still get on ``device``: the free memory of a CUDA GPU
    (``torch.cuda.mem_get_info``), else the system's available RAM (``MemAvailable``, which
    counts reclaimable caches; the total memory where the kernel does not report it)."""
    where = torch.device(device)
    if where.type == "cuda":
        return int(torch.cuda.mem_get_info(where)[0])
    available = _meminfo_bytes("MemAvailable")
    return system_memory_bytes() if available is None else available


class MemoryMeter:
    """Peak memory of blocks of code on ``device`` (see the module docstring)."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def what(self) -> str:
        return "GPU memory" if self.on_gpu else "process memory (RSS) against system RAM"

    def capacity_bytes(self) -> int:
        """All the memory of the device: the GPU's, or the machine's RAM."""
        if self.on_gpu:
            return int(torch.cuda.mem_get_info(self.device)[1])
        return system_memory_bytes()

    def current_bytes(self) -> int:
        """Memory in use now (the whole GPU; this process's RSS on a CPU)."""
        if self.on_gpu:
            free, total = torch.cuda.mem_get_info(self.device)
            return int(total - free)
        return process_rss_bytes()

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measurement]:
        result = Measurement()
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            others = int(total - free) - int(torch.cuda.memory_reserved(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
            try:
                yield result
            finally:
                torch.cuda.synchronize(self.device)
                peak = int(torch.cuda.max_memory_reserved(self.device))
                result.peak_bytes = max(0, others) + peak
            return
        before = process_rss_bytes()
        reset = _reset_peak_rss()
        lifetime_before = _lifetime_peak_rss_bytes()
        try:
            yield result
        finally:
            after = process_rss_bytes()
            hwm = _status_kib("VmHWM") if reset else None
            if hwm is not None:
                result.peak_bytes = max(hwm * 1024, after)
            else:
                lifetime = _lifetime_peak_rss_bytes()
                if lifetime > lifetime_before:  # the block set a new lifetime peak
                    result.peak_bytes = lifetime
                else:
                    result.peak_bytes = max(before, after)
                    result.exact = False


class PhaseMemory:
    """Per-phase peak memory of a run, as ``memory/<phase>_peak_mib`` metrics.

    ::

        phases = PhaseMemory(MemoryMeter("cuda"))
        with phases("rollout"):
            ...
        phases.pop()   # {"memory/rollout_peak_mib": 10523.0}
    """

    def __init__(self, meter: MemoryMeter) -> None:
        self.meter = meter
        self._peaks: dict[str, int] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        with self.meter.measure() as measured:
            yield
        self._peaks[phase] = max(self._peaks.get(phase, 0), measured.peak_bytes)

    def pop(self) -> dict[str, float]:
        out = {f"memory/{phase}_peak_mib": bytes_ / MIB for phase, bytes_ in self._peaks.items()}
        self._peaks.clear()
        return out


# -- optimizer state off the device ----------------------------------------------------------


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict, str]]:
    """(container, key) of every tensor an optimizer keeps besides the model's weights: its
    per-parameter state, and the float32 master weights of a master-weight optimizer."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                yield state, key


def move_optimizer_state(
    optimizers: Iterable[torch.optim.Optimizer | None], device: str | torch.device
) -> int:
    """Move every state tensor (and master weight) of ``optimizers`` to ``device``; returns the
    bytes that changed device. Parameters are untouched, so the optimizer keeps working after
    its state is moved back (``torch.optim`` keeps state beside its parameter)."""

    device = torch.device(device)
    pin = device.type == "cpu" and torch.cuda.is_available()
    moved = 0
    for optimizer in optimizers:
        if optimizer is None:
            continue
        for state, key in optimizer_tensors(optimizer):
            tensor = state[key]
            if tensor.device != device:
                moved += tensor.numel() * tensor.element_size()
                state[key] = _to(tensor, device, pin)
        if isinstance(optimizer, MasterWeightOptimizer):
            for _, master in optimizer.low_precision_pairs:
                if master.device != device:
                    moved += master.numel() * master.element_size()
                    master.data = _to(master.data, device, pin)
    if moved:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return moved


def _to(tensor: torch.Tensor, device: torch.device, pin: bool) -> torch.Tensor:
    if pin:
        out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        out.copy_(tensor)
        return out
    return tensor.to(device)


__all__ = [
    "MIB",
    "Measurement",
    "MemoryMeter",
    "PhaseMemory",
    "move_optimizer_state",
    "optimizer_tensors",
    "process_rss_bytes",
    "system_memory_bytes",
]

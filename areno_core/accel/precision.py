"""The floating-point type of a run's models (``--dtype``).

``auto`` is bfloat16 on a CUDA GPU that computes in it natively (compute capability 8.0 or
newer: A100, H100, L4, RTX 30xx and later) and float32 everywhere else, the CPU included.
Trainable models in a 16-bit type are updated through float32 master weights (see
:mod:`areno_core.accel.master_weights`), so small learning rates are not rounded away.

::

    resolve_run_dtype("auto", "cpu")          # torch.float32
    resolve_run_dtype("auto", "cuda")         # torch.bfloat16 on an H100
    resolve_run_dtype("bfloat16", "cpu")      # torch.bfloat16 (fast with AVX512-BF16 / AMX)

On a CPU ``--dtype bfloat16`` is opt-in: its matrix products run several times faster than
float32 where the CPU has bfloat16 instructions (:func:`cpu_has_bf16`; measured in
docs/performance.md) and slower where it lacks them, which the run then says in its log.
"""

from __future__ import annotations

import torch

from areno_core.config import DTYPE_CHOICES
from areno_core.errors import NotAvailableError
from areno_core.log import get_logger, warn_once

logger = get_logger(__name__)

_BY_NAME: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# bfloat16 matmuls run natively from compute capability 8.0 (Ampere) on.
BF16_MIN_CAPABILITY = (8, 0)


def gpu_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def cpu_has_bf16() -> bool:
    """Whether this CPU has the bfloat16 instructions (AVX512-BF16 or AMX) that torch's CPU
    kernels (oneDNN) use for bfloat16 matrix products."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def supports_bf16(device: str | torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively (any CPU does, through torch)."""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    return gpu_capability(device) >= BF16_MIN_CAPABILITY


def resolve_run_dtype(choice: str, device: str | torch.device) -> torch.dtype:
    """The dtype for ``--dtype choice`` on ``device``; a clear error for a type it lacks."""
    device = torch.device(device)
    if choice not in DTYPE_CHOICES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {choice!r}")
    if choice == "auto":
        if device.type != "cuda":
            return torch.float32
        if supports_bf16(device):
            return torch.bfloat16
        major, minor = gpu_capability(device)
        logger.info(
            "--dtype auto: this GPU (compute capability %d.%d) has no native bfloat16, so the "
            "models stay in float32; --dtype float16 is faster there but trains without loss "
            "scaling",
            major,
            minor,
        )
        return torch.float32
    dtype = _BY_NAME[choice]
    if dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_bf16():
        warn_once(
            logger,
            "dtype.cpu_bf16",
            "--dtype bfloat16: this CPU has no bfloat16 instructions (AVX512-BF16 or AMX), so "
            "bfloat16 matrix products run slower than float32 here",
        )
    if dtype == torch.bfloat16 and not supports_bf16(device):
        major, minor = gpu_capability(device)
        raise NotAvailableError(
            f"--dtype bfloat16: this GPU (compute capability {major}.{minor}) has no native "
            "bfloat16 (it needs 8.0 or newer); use --dtype float16 or float32"
        )
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


__all__ = [
    "BF16_MIN_CAPABILITY",
    "DTYPE_CHOICES",
    "cpu_has_bf16",
    "dtype_name",
    "resolve_run_dtype",
    "supports_bf16",
]

"""Which attention kernels a run uses (``--attn-backend``).

``flash`` means flash-attn 2 (transformers' ``flash_attention_2``). It needs the ``flash_attn``
package, a CUDA GPU of compute capability 8.0 or newer (Ampere and later; a Tesla T4 or V100
is older), and a model in float16 or bfloat16. When any of these is missing, areno uses the
``native`` path, torch's scaled-dot-product attention (SDPA), and logs one warning saying
which requirement failed. ``native`` is always SDPA. The policy, reference and critic are
loaded with the chosen kernels, and the native rollout engine uses the same choice.

With flash-attn, training microbatches are packed: the rows' tokens are laid end to end in
one row, with position ids restarting at each row, so no compute is spent on padding (see
:func:`areno_core.train.forward.policy_outputs`).

On a CUDA GPU, :func:`sdpa_without_cudnn` keeps torch's SDPA off its cuDNN kernels while areno
trains, scores or samples. torch 2.11 picks cuDNN's attention first on Hopper GPUs, and each
call of it spent 1.5 to 12 ms of host time (building or looking up cuDNN's plan for the
shapes) for 50 to 130 us of GPU work, measured on an H200 with a Qwen3-0.6B-shaped model,
where it made the GRPO update wait on the CPU (docs/gpu.md). Training microbatches change
shape at every step, so those plans are rarely reused. torch's other SDPA kernels (flash,
memory-efficient, math) stay as the user has set them.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import torch

from areno_core.accel.precision import dtype_name, gpu_capability
from areno_core.log import get_logger, warn_once

logger = get_logger(__name__)

FLASH = "flash_attention_2"
NATIVE = "sdpa"
FLASH_MIN_CAPABILITY = (8, 0)
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FALLBACK_WARNING_KEY = "attn.flash_fallback"


def flash_unavailable_reason(device: str | torch.device, dtype: torch.dtype) -> str | None:
    """Why flash-attn cannot run a model in ``dtype`` on ``device``; None when it can."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "the model is not on a CUDA GPU"
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed (pip install flash-attn)"
    major, minor = gpu_capability(device)
    if (major, minor) < FLASH_MIN_CAPABILITY:
        return (
            f"this GPU (compute capability {major}.{minor}) is older than Ampere (8.0), "
            "which flash-attn 2 needs"
        )
    if dtype not in FLASH_DTYPES:
        return f"the model is in {dtype_name(dtype)}; flash-attn needs float16 or bfloat16"
    return None


def choose_attention(backend: str, device: str | torch.device, dtype: torch.dtype) -> str:
    """The transformers attention implementation for ``--attn-backend backend``:
    ``flash_attention_2`` when flash-attn can run, else ``sdpa`` (warning once per process
    when flash was asked for)."""
    if backend not in ("flash", "native"):
        raise ValueError(f"--attn-backend must be one of flash, native, got {backend!r}")
    if backend == "flash":
        reason = flash_unavailable_reason(device, dtype)
        if reason is None:
            return FLASH
        warn_once(
            logger,
            FALLBACK_WARNING_KEY,
            "--attn-backend flash is unavailable (%s); using the native attention path "
            "(torch SDPA), which is slower than flash-attn on GPUs that support it",
            reason,
        )
    return NATIVE


def attention_of(model: Any) -> str | None:
    """The attention implementation a transformers model (or a value model) runs."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)


def uses_flash(model: Any) -> bool:
    return attention_of(model) == FLASH


@contextlib.contextmanager
def sdpa_without_cudnn(device: str | torch.device) -> Iterator[None]:
    """Inside, torch's SDPA does not choose its cuDNN kernels when ``device`` is a CUDA device
    (the module docstring says why); the setting before is restored on exit. On other devices
    it changes nothing."""
    if torch.device(device).type != "cuda":
        yield
        return
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


__all__ = [
    "FLASH",
    "FLASH_MIN_CAPABILITY",
    "NATIVE",
    "attention_of",
    "choose_attention",
    "flash_unavailable_reason",
    "sdpa_without_cudnn",
    "uses_flash",
]

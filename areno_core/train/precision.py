"""Mixed precision for training forwards: bfloat16 autocast with float32 master weights.

Under :func:`bf16_autocast` the matrix products and attention of a forward pass run in
bfloat16 while the parameters, their gradients and the optimizer state stay float32, and
reductions such as log-softmax run in float32 (torch's autocast lists; areno's scoring also
casts logits to float32 before its log-softmax). On CPUs with bfloat16 instructions
(AVX512-BF16, AMX) the matrix products run several times faster than in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from areno_core.log import get_logger, warn_once

logger = get_logger(__name__)


def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions that oneDNN uses."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@contextlib.contextmanager
def bf16_autocast(enabled: bool, device: torch.device | str) -> Iterator[None]:
    """Run the enclosed forward pass under bfloat16 autocast when ``enabled``."""
    if not enabled:
        yield
        return
    device_type = torch.device(device).type
    if device_type == "cpu" and not cpu_has_bf16():
        warn_once(
            logger,
            "train.bf16_slow",
            "train_bf16: this CPU has no bfloat16 instructions (AVX512-BF16 or AMX); "
            "bfloat16 matrix products will be slower than float32 here",
        )
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
        yield


__all__ = ["bf16_autocast", "cpu_has_bf16"]

"""Optimizer, learning-rate schedule and gradient clipping for the trainer.

::

    optimizer = build_optimizer(model.parameters(), lr=1e-6, betas=(0.9, 0.999),
                                weight_decay=0.01, adam_8bit=False)
    scheduler = build_scheduler(optimizer, lr=1e-6, min_lr=1e-7, decay_steps=1000,
                                style="cosine")
    ...
    grad_norm = clip_grad_norm(model.parameters(), max_norm=1.0)
    optimizer.step(); scheduler.step()
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable
from typing import Literal

import torch

from areno_core.accel.master_weights import MasterWeightOptimizer, needs_master_weights
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.log import get_logger

logger = get_logger(__name__)

DecayStyle = Literal["cosine", "linear", "constant"]
DECAY_STYLES: tuple[str, ...] = ("cosine", "linear", "constant")


def check_adam_8bit_available() -> None:
    """Raise :class:`NotAvailableError` unless 8-bit AdamW can run here.

    8-bit Adam needs both the ``bitsandbytes`` package and a CUDA device; the message names
    whichever is missing, so the CLI can reject ``--adam-8bit`` before loading any model.
    """
    missing = []
    if importlib.util.find_spec("bitsandbytes") is None:
        missing.append("the bitsandbytes package (pip install bitsandbytes)")
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU (none is visible to torch)")
    if missing:
        raise NotAvailableError("--adam-8bit needs " + " and ".join(missing))


def param_groups(params: Iterable[torch.Tensor], weight_decay: float) -> list[dict[str, object]]:
    """Split trainable ``params`` into a decayed group (matrices) and an undecayed one.

    Tensors with fewer than two dimensions (biases, norm weights, scalars) get no weight
    decay. Parameters that do not require gradients are left out; empty groups are dropped.
    """
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    for p in params:
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups: list[dict[str, object]] = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(
    params: Iterable[torch.Tensor],
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    adam_8bit: bool,
) -> torch.optim.Optimizer:
    """AdamW over ``params`` with no weight decay on tensors of fewer than two dimensions.

    Uses torch's fused kernel where the parameters' devices and dtypes allow it, otherwise the
    multi-tensor (foreach) path. With ``adam_8bit`` the moments are kept in 8 bits by
    bitsandbytes, which needs the package and a CUDA device (checked first). Parameters in
    bfloat16 or float16 are optimized through float32 master copies
    (:class:`~areno_core.accel.master_weights.MasterWeightOptimizer`).
    """
    groups = param_groups(params, weight_decay)
    if not groups:
        raise ValueError("build_optimizer: no trainable parameters (none requires grad)")
    if adam_8bit:
        check_adam_8bit_available()

    def make(groups: list[dict[str, object]]) -> torch.optim.Optimizer:
        if adam_8bit:
            import bitsandbytes as bnb  # optional: --adam-8bit only

            return bnb.optim.AdamW8bit(groups, lr=lr, betas=betas, weight_decay=weight_decay)
        try:
            return torch.optim.AdamW(
                groups, lr=lr, betas=betas, weight_decay=weight_decay, fused=True
            )
        except (RuntimeError, ValueError) as exc:
            # Fused kernels need every parameter on a supported device with a float dtype.
            logger.debug("fused AdamW unavailable (%s); using the foreach implementation", exc)
            return torch.optim.AdamW(
                groups, lr=lr, betas=betas, weight_decay=weight_decay, foreach=True
            )

    trainable = [p for g in groups for p in g["params"]]  # type: ignore[attr-defined]
    if needs_master_weights(trainable):
        return MasterWeightOptimizer(groups, make)
    return make(groups)


def gradient_tensors(
    optimizer: torch.optim.Optimizer | None, params: Iterable[torch.Tensor]
) -> list[torch.Tensor]:
    """The tensors whose ``.grad`` holds the gradients of ``params``: the float32 master
    copies under a :class:`MasterWeightOptimizer`, else the parameters themselves (what
    gradient clipping must look at)."""
    if isinstance(optimizer, MasterWeightOptimizer):
        return list(optimizer.masters)
    return list(params)


def lr_at(
    step: int,
    *,
    lr: float,
    min_lr: float,
    decay_steps: int,
    style: str,
    warmup_steps: int = 0,
) -> float:
    """The learning rate after ``step`` optimizer steps (step 0 is the first update).

    During warm-up (steps ``0 .. warmup_steps - 1``) the rate rises linearly to ``lr``:
    ``lr * (step + 1) / warmup_steps``. Then it decays from ``lr`` to ``min_lr`` over
    ``decay_steps`` steps (cosine or linear) and stays at ``min_lr``; ``constant`` stays at
    ``lr``.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if style == "constant":
        return lr
    progress = min(step - warmup_steps, decay_steps) / decay_steps
    if style == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if style == "linear":
        return lr - (lr - min_lr) * progress
    raise ConfigError(f"--lr-decay-style must be one of {', '.join(DECAY_STYLES)}; got {style!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    lr: float,
    min_lr: float,
    decay_steps: int,
    style: str,
    warmup_steps: int = 0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step schedule following :func:`lr_at`; call ``scheduler.step()`` after each update.

    ``lr`` must be the learning rate the optimizer was built with: the schedule multiplies
    each group's initial rate by ``lr_at(step) / lr``.
    """
    if style not in DECAY_STYLES:
        raise ConfigError(
            f"--lr-decay-style must be one of {', '.join(DECAY_STYLES)}; got {style!r}"
        )
    if lr <= 0:
        raise ConfigError(f"--lr must be positive, got {lr!r}")
    if decay_steps <= 0:
        raise ConfigError(f"--lr-decay-steps must be positive, got {decay_steps!r}")
    if warmup_steps < 0:
        raise ConfigError(f"warm-up steps must be zero or more, got {warmup_steps!r}")
    if not 0 <= min_lr <= lr:
        raise ConfigError(f"--min-lr {min_lr:g} must be between 0 and --lr {lr:g}")

    def factor(step: int) -> float:
        shape = lr_at(
            step,
            lr=lr,
            min_lr=min_lr,
            decay_steps=decay_steps,
            style=style,
            warmup_steps=warmup_steps,
        )
        return shape / lr

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip the global L2 norm of the gradients to ``max_norm``; return the norm before clipping.

    Parameters without a gradient are ignored. The result is a 0-dim tensor (no host sync).
    """
    grads_of = [p for p in params if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(grads_of, max_norm)

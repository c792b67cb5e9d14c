"""Whether a run recomputes its activations: ``--activation-checkpointing`` on, off or ``auto``.

Checkpointing trades compute for memory: the backward pass runs every decoder layer's forward
again instead of keeping its activations. On a small model that fits with room to spare it is
pure cost (about 1.6x the training CPU time of a GRPO step on the tiny shape, docs/performance.md);
on a large model it is what lets a micro-batch fit at all.

``auto`` (the default, ``None`` in the Python API) decides once, before the first step, from
an estimate of one micro-batch's activations without checkpointing (the memory planner's
formula, :func:`areno_core.plan.estimate.estimate`, for ``--mini-bs`` rows of
``--max-prompt-tokens + --max-new-tokens`` tokens, the longest row a step can train) against
the memory still free on the training device (a GPU's free memory, or the available RAM).
It turns checkpointing on when those activations would take more than half of that memory,
and off otherwise, and logs the decision with both numbers. A model whose shape the planner
cannot read keeps checkpointing on (the safe side), and the log says why.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from areno_core.accel.memory import available_memory_bytes
from areno_core.errors import ConfigError
from areno_core.log import get_logger
from areno_core.plan.estimate import GIB, Setup, estimate
from areno_core.plan.shapes import shape_from_config

logger = get_logger(__name__)

AUTO_SHARE = 0.5
"""``auto`` checkpoints when one micro-batch's activations would exceed this share of the
memory free on the device."""

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@attrs.frozen
class CheckpointingChoice:
    """What ``auto`` decided and why (``activations`` and ``available`` in bytes; ``None``
    where the estimate could not be made)."""

    enabled: bool
    reason: str
    activations: int | None = None
    available: int | None = None


def choose_activation_checkpointing(
    policy: Any,
    *,
    rows: int,
    seq_len: int,
    device: str | torch.device,
    world_size: int = 1,
    tp_size: int = 1,
    available: int | None = None,
) -> CheckpointingChoice:
    """Decide ``auto`` for ``policy`` training micro-batches of ``rows`` rows of at most
    ``seq_len`` tokens on ``device`` (``available``: the free bytes, measured when not given)."""
    config = getattr(policy, "config", None)
    try:
        shape = shape_from_config(config)
    except (AttributeError, TypeError, ValueError) as exc:
        return CheckpointingChoice(
            True, f"on: the activation estimate cannot read this model's config ({exc})"
        )
    dtype = _DTYPE_NAMES.get(_parameter_dtype(policy), "float32")
    try:
        setup = Setup(
            shape=shape,
            seq_len=max(1, seq_len),
            micro_batch=max(1, rows),
            dtype=dtype,
            device=torch.device(device).type,
            world_size=world_size,
            tp_size=tp_size,
        )
    except ConfigError as exc:
        return CheckpointingChoice(True, f"on: the activation estimate does not apply ({exc})")
    full = next(i.bytes for i in estimate(setup).activation_items if i.name == "activations")
    free = available_memory_bytes(device) if available is None else available
    share = full / max(free, 1)
    where = torch.device(device).type
    numbers = (
        f"a micro-batch of {setup.micro_batch} rows x {setup.seq_len} tokens keeps about "
        f"{full / GIB:.2f} GiB of activations, {share:.0%} of the {free / GIB:.1f} GiB free "
        f"on the {where}"
    )
    if full > AUTO_SHARE * free:
        return CheckpointingChoice(True, f"on: {numbers} (over {AUTO_SHARE:.0%})", full, free)
    return CheckpointingChoice(False, f"off: {numbers} (within {AUTO_SHARE:.0%})", full, free)


def resolve_activation_checkpointing(
    setting: bool | None,
    policy: Any,
    *,
    rows: int,
    seq_len: int,
    device: str | torch.device,
    world_size: int = 1,
    tp_size: int = 1,
) -> bool:
    """``setting`` as given (``True``/``False``), or the ``auto`` decision for ``None``,
    logged once per process."""
    if setting is not None:
        return bool(setting)
    choice = choose_activation_checkpointing(
        policy,
        rows=rows,
        seq_len=seq_len,
        device=device,
        world_size=world_size,
        tp_size=tp_size,
    )
    logger.info("activation checkpointing auto: %s", choice.reason)
    return choice.enabled


def _parameter_dtype(policy: Any) -> torch.dtype | None:
    try:
        return next(p.dtype for p in policy.parameters() if p.is_floating_point())
    except (StopIteration, AttributeError, TypeError):
        return None

"""The ``distributed`` training backend as the registry sees it: options, checks, launcher and
factory. The backend itself (:mod:`areno_core.train.distributed.backend`) loads the training
stack; this module does not, so that building the registry and resolving a run stay light.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from areno_core.contracts.backend import BackendSpec
from areno_core.options import option
from areno_core.train.distributed.context import check_mesh_shape
from areno_core.validators import number

if TYPE_CHECKING:
    from areno_core.registry import Registry


@attrs.frozen
class DistributedBackendConfig:
    """The distributed backend's own options (``--backend distributed``)."""

    dist_timeout_s: float = option(
        1800.0,
        "Distributed backend: seconds a process waits for the others in one collective "
        "operation (gradient reduction, gathering samples) before the run fails. Bounds how "
        "long a run can hang when a process stops responding.",
        validator=number(min=1.0),
    )
    fsdp_mixed_precision: bool = option(
        True,
        "Distributed backend, GPUs only: run forward and backward passes in bfloat16 from "
        "float32 parameters and reduce gradients in float32. No effect on CPUs.",
        negatable=True,
    )
    dp_replicate: int = option(
        1,
        "Distributed backend: hybrid sharding (HSDP). The data-parallel ranks form this many "
        "groups of neighbouring ranks (one per node, typically); each group holds one whole "
        "sharded copy of the model, parameters are sharded within a group and gradients are "
        "summed across the groups. Must divide --world-size / --tp-size; 1 shards over every "
        "data-parallel rank.",
        validator=number(min=1, integer=True),
        resume_may_change=True,
    )


def _distributed_backend(config: Any, options: DistributedBackendConfig, registry: Registry) -> Any:
    from areno_core.train.distributed import backend  # heavy: the training stack, for a run

    return backend.create_backend(config, options, registry)


def _check(config: Any) -> str | None:
    replicate = config.plugin.get("dp_replicate", 1)
    shape = check_mesh_shape(config.world_size, config.tp_size or 1, replicate)
    if shape is not None:
        return shape
    if config.adam_8bit:
        return "8-bit Adam (--adam-8bit) keeps state FSDP2 cannot shard; drop --adam-8bit"
    if getattr(config, "dtype", "auto") not in ("auto", "float32"):
        return (
            f"--dtype {config.dtype}: parameters stay float32 under FSDP2, which computes in "
            "bfloat16 on GPUs itself (--fsdp-mixed-precision); use --dtype auto or float32"
        )
    lora = getattr(config, "lora_rank", None) is not None
    if lora and (config.tp_size or 1) > 1 and config.lora_dropout > 0:
        return (
            f"--lora-dropout {config.lora_dropout:g} with --tp-size {config.tp_size}: dropout "
            "on the adapters' input is not coordinated across tensor-parallel ranks (each would "
            "draw its own masks); use --lora-dropout 0 or --tp-size 1"
        )
    if getattr(config, "tune_params", False):
        return (
            "--tune-params probes one process's memory; give --max-running-prompts, "
            "--batch-size and --mini-bs instead"
        )
    return None


def _launch(config: Any, argv: Sequence[str]) -> bool:
    from areno_core.train.distributed.launch import launch_workers  # heavy: starts torchrun

    return launch_workers(config, argv)


DISTRIBUTED_BACKEND = BackendSpec(
    name="distributed",
    summary="Trains over several processes with torch.distributed: FSDP2 data parallel "
    "(--world-size) and tensor parallel (--tp-size), gloo on CPUs, NCCL on GPUs.",
    factory=_distributed_backend,
    config_cls=DistributedBackendConfig,
    check=_check,
    launch=_launch,
)


__all__ = ["DISTRIBUTED_BACKEND", "DistributedBackendConfig"]

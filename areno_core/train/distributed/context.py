"""The process group and the device mesh of a distributed run, and the collectives it uses.

Every worker process (started by ``areno train --world-size N`` or by ``torchrun``) reads its
place from the environment torch's launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), joins the process group (gloo on CPUs, NCCL for CUDA tensors
with gloo beside it for CPU tensors) and builds a 2-D device mesh ``(dp, tp)``: ranks
``dp * tp_size + t``; the ``tp`` dimension holds the ranks that split each layer, the ``dp``
dimension the ranks that split the batch.

With hybrid sharding (``--dp-replicate R`` > 1, HSDP) the ``dp`` dimension is itself laid out
as ``(replicate, shard)``: ``R`` groups of ``dp / R`` neighbouring data-parallel ranks (one
group per node, typically). FSDP2 shards the parameters within a group and keeps one copy per
group; the batch is still split over all ``dp`` ranks, which the mesh keeps as the flattened
``dp`` dimension.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Sequence
from typing import Any

import attrs
import torch
import torch.distributed as dist

from areno_core.errors import ConfigError
from areno_core.log import get_logger

logger = get_logger(__name__)

# What torch's launchers (torchrun, elastic_launch) set in every worker's environment.
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_world_size() -> int | None:
    """``WORLD_SIZE`` when this process was started by torch's launcher, else None."""
    if all(name in os.environ for name in LAUNCH_ENV):
        try:
            return int(os.environ["WORLD_SIZE"])
        except ValueError:
            return None
    return None


@attrs.define
class DistContext:
    """This process's place in a distributed run."""

    rank: int
    world_size: int
    local_rank: int
    tp_size: int
    device: torch.device
    # torch.distributed.device_mesh.DeviceMesh with dims ("dp", "tp"), or, with hybrid
    # sharding, ("replicate", "shard", "tp") plus "dp" flattened from the first two.
    mesh: Any
    replicate_size: int = 1

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def dp_mesh(self) -> Any:
        """The mesh FSDP2 shards over: 1-D ``dp``, or 2-D ``(replicate, shard)`` (HSDP)."""
        if self.replicate_size > 1:
            return self.mesh["replicate", "shard"]
        return self.mesh["dp"]

    @property
    def tp_mesh(self) -> Any:
        return self.mesh["tp"]

    @property
    def dp_group(self) -> Any:
        return self.mesh.get_group("dp")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- collectives ---------------------------------------------------------------------

    def all_gather_objects(self, obj: Any, *, group: Any = None) -> list[Any]:
        """Every rank's ``obj`` (in rank order within ``group``; default: all ranks)."""
        size = dist.get_world_size(group)
        if size == 1:
            return [obj]
        out: list[Any] = [None] * size
        dist.all_gather_object(out, obj, group=group)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_sum_dp(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the data-parallel ranks (in place; also returned)."""
        if self.dp_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.dp_group)
        return tensor

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any process (a collective: every process calls it)."""
        if self.world_size == 1:
            return flag
        box = torch.tensor([1 if flag else 0], device=self.device)
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return bool(box.item())

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def check_mesh_shape(world_size: int, tp_size: int, replicate: int = 1) -> str | None:
    """Why ``world_size`` processes cannot form this mesh, or None."""
    if tp_size < 1 or world_size % tp_size:
        return f"--world-size {world_size} is not divisible by --tp-size {tp_size}"
    dp = world_size // tp_size
    if replicate < 1 or dp % replicate:
        return (
            f"--dp-replicate {replicate} does not divide the {dp} data-parallel ranks "
            f"(--world-size {world_size} / --tp-size {tp_size}); give a divisor of {dp}, "
            "such as the number of nodes"
        )
    return None


def build_mesh(device_type: str, world_size: int, tp_size: int, replicate: int = 1) -> Any:
    """The device mesh of :class:`DistContext` (a collective: every process calls it)."""
    from torch.distributed.device_mesh import (
        init_device_mesh,  # heavy: distributed work only
    )

    dp = world_size // tp_size
    if replicate == 1:
        return init_device_mesh(device_type, (dp, tp_size), mesh_dim_names=("dp", "tp"))
    mesh = init_device_mesh(
        device_type,
        (replicate, dp // replicate, tp_size),
        mesh_dim_names=("replicate", "shard", "tp"),
    )
    mesh["replicate", "shard"]._flatten("dp")  # the batch is split over both
    return mesh


def init_distributed(
    *, world_size: int, tp_size: int, timeout_s: float, replicate: int = 1
) -> DistContext:
    """Join (or, alone, start) the process group and build the ``(dp, tp)`` mesh (with
    ``replicate`` > 1, ``dp`` laid out as ``(replicate, shard)``: hybrid sharding).

    A process started by torch's launcher takes its rank from the environment; ``world_size``
    (``--world-size``) must match the launcher's. A process started without a launcher can run
    a world of one only.
    """
    launched = launched_world_size()
    init_method = None
    if launched is None:
        if world_size != 1:
            raise ConfigError(
                f"--world-size {world_size}: this process was not started by torch's launcher "
                "(no RANK/WORLD_SIZE/LOCAL_RANK in the environment); run `areno train "
                f"--world-size {world_size} ...`, which starts the workers, or start them with "
                "torchrun (see docs/distributed.md)"
            )
        init_method = f"tcp://127.0.0.1:{_free_port()}"  # a world of one, on its own
    elif launched != world_size:
        raise ConfigError(
            f"--world-size {world_size} does not match the {launched} processes the launcher "
            "started (WORLD_SIZE); give torchrun --nnodes x --nproc-per-node = --world-size, "
            "or leave --world-size out under torchrun"
        )
    why = check_mesh_shape(world_size, tp_size, replicate)
    if why is not None:
        raise ConfigError(why)
    rank = int(os.environ["RANK"]) if launched else 0
    local_rank = int(os.environ["LOCAL_RANK"]) if launched else 0
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"rank {rank} has local rank {local_rank} but this node has only "
                f"{torch.cuda.device_count()} GPU(s); start at most that many processes per node"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=dt.timedelta(seconds=timeout_s),
        )
    mesh = build_mesh(device.type, world_size, tp_size, replicate)
    logger.info(
        "rank %d of %d (dp %d of %d in %d replica group(s), tp %d of %d) on %s",
        rank,
        world_size,
        rank // tp_size,
        world_size // tp_size,
        replicate,
        rank % tp_size,
        tp_size,
        device,
    )
    return DistContext(rank, world_size, local_rank, tp_size, device, mesh, replicate)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def combine_rank_stats(
    per_rank: Sequence[tuple[dict[str, float], dict[str, float], dict[str, float], list[float]]],
) -> tuple[dict[str, float], dict[str, float], dict[str, float], list[float]]:
    """Sums, minima, maxima and per-step losses of several ranks combined, in rank order."""
    totals: dict[str, float] = {}
    mins: dict[str, float] = {}
    maxs: dict[str, float] = {}
    losses: list[float] = []
    for rank_totals, rank_mins, rank_maxs, rank_losses in per_rank:
        for key, value in rank_totals.items():
            totals[key] = totals.get(key, 0.0) + value
        for key, value in rank_mins.items():
            mins[key] = min(mins.get(key, value), value)
        for key, value in rank_maxs.items():
            maxs[key] = max(maxs.get(key, value), value)
        if not losses:
            losses = [0.0] * len(rank_losses)
        losses = [a + b for a, b in zip(losses, rank_losses, strict=True)]
    return totals, mins, maxs, losses

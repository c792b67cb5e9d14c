"""Training over several processes with torch.distributed (``--world-size``, ``--tp-size``).

See ``docs/distributed.md``. The rest of areno uses this package only through the names below
(an import-linter contract in pyproject.toml holds the modules inside it private):

* :data:`DISTRIBUTED_BACKEND`: the ``distributed`` training backend (FSDP2, tensor parallel);
* :func:`launched_world_size`: the process count when started by torchrun, else None;
* :func:`check_tp_support`: whether a model family has a tensor-parallel plan;
* :func:`log_worker_traceback`, :func:`record_worker_error`: how a failed worker reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areno_core.train.distributed.context import launched_world_size
from areno_core.train.distributed.launch import log_worker_traceback, record_worker_error
from areno_core.train.distributed.parallelize import TP_FAMILIES, check_tp_support
from areno_core.train.distributed.spec import DISTRIBUTED_BACKEND

if TYPE_CHECKING:
    from areno_core.train.distributed.backend import DistributedBackend


def __getattr__(name: str) -> Any:
    # The backend class loads the training stack: imported when first asked for (PEP 562),
    # so that the registry and option checks, which need only the names above, stay light.
    if name == "DistributedBackend":
        from areno_core.train.distributed.backend import DistributedBackend  # heavy, as said

        return DistributedBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DISTRIBUTED_BACKEND",
    "TP_FAMILIES",
    "DistributedBackend",
    "check_tp_support",
    "launched_world_size",
    "log_worker_traceback",
    "record_worker_error",
]

"""The backend-first training API.

    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    backend = LocalBackend()
    result = backend.train(model, rows, algorithm="sft", learning_rate=1e-4)
    model.log(metrics=result.metrics, step=result.step)

A backend owns how training runs (devices, processes, microbatching, optimizer, checkpoints);
:class:`TrainingBackend` is the contract every backend meets and the only thing ``areno train``
calls. ``LocalBackend`` trains in this process; other backends register a
:class:`BackendSpec` through the ``register_backends`` hook. ``train`` takes typed keyword
arguments whose defaults are the ``areno train`` defaults; anything it does not support is a
``TypeError`` at the call site, never silently ignored.
"""

from __future__ import annotations

from areno_core.contracts.backend import BackendSpec, TrainingBackend
from areno_core.model import TrainableModel
from areno_core.train.local import LocalBackend
from areno_core.train.local_spec import LocalBackendConfig
from areno_core.types import TrainResult

__all__ = [
    "BackendSpec",
    "LocalBackend",
    "LocalBackendConfig",
    "TrainResult",
    "TrainableModel",
    "TrainingBackend",
]

"""What areno-core registers itself, through the same hooks as any plugin.

This module stands on top of the core's layers (it names the native engine and both training
backends), so nothing in the core imports it: :mod:`areno_core.plugins` loads it through
areno-core's own ``areno`` entry point, ``core``, before any other plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_core.hookspecs import hookimpl
from areno_core.metrics.sinks import JSONL_SINK, TENSORBOARD_SINK
from areno_core.rollout.native_spec import NATIVE_ENGINE
from areno_core.train.distributed import DISTRIBUTED_BACKEND
from areno_core.train.local_spec import LOCAL_BACKEND


@hookimpl
def register_rollout_engines(register: Callable[[Any], None]) -> None:
    register(NATIVE_ENGINE)


@hookimpl
def register_backends(register: Callable[[Any], None]) -> None:
    # Order matters: without --backend a run takes the first that accepts it, so one process
    # stays on the local backend unless --backend distributed is given.
    register(LOCAL_BACKEND)
    register(DISTRIBUTED_BACKEND)


@hookimpl
def register_metric_sinks(register: Callable[[Any], None]) -> None:
    register(JSONL_SINK)
    register(TENSORBOARD_SINK)

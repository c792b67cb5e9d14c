"""What areno-core registers itself, through the same hooks as any plugin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_core.hookspecs import hookimpl


@hookimpl
def register_rollout_engines(register: Callable[[Any], None]) -> None:
    from areno_core.rollout.native import NATIVE_ENGINE

    register(NATIVE_ENGINE)


@hookimpl
def register_backends(register: Callable[[Any], None]) -> None:
    from areno_core.train.distributed.backend import DISTRIBUTED_BACKEND
    from areno_core.train.local import LOCAL_BACKEND

    # Order matters: without --backend a run takes the first that accepts it, so one process
    # stays on the local backend unless --backend distributed is given.
    register(LOCAL_BACKEND)
    register(DISTRIBUTED_BACKEND)


@hookimpl
def register_metric_sinks(register: Callable[[Any], None]) -> None:
    from areno_core.train.sinks import JSONL_SINK, TENSORBOARD_SINK

    register(JSONL_SINK)
    register(TENSORBOARD_SINK)

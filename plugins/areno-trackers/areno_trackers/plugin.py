"""Entry point of areno-trackers: registers the wandb, mlflow and trackio metric sinks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_core import hookimpl
from areno_trackers.mlflow_sink import MLFLOW_SINK
from areno_trackers.trackio_sink import TRACKIO_SINK
from areno_trackers.wandb_sink import WANDB_SINK


@hookimpl
def register_metric_sinks(register: Callable[[Any], None]) -> None:
    register(WANDB_SINK)
    register(MLFLOW_SINK)
    register(TRACKIO_SINK)

"""The metric-sink contract: what ``--report-to`` names and what a sink does.

A sink is registered by a plugin through ``register_metric_sinks`` as a :class:`SinkSpec`;
the built-in ones and the run's handling of sinks live in :mod:`areno_core.metrics.sinks`.

The life of a sink::

    sink = spec.create(run)        # RunInfo: name, output dir, metrics dir, config, purge step
    sink.log({"train/loss": 0.5}, step=1)   # every logged step
    sink.finish(checkpoint_path)   # the run ended normally; the last checkpoint (or None)
    sink.close()                   # always, also after an error
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs


@attrs.frozen
class RunInfo:
    """What a sink knows of the run it reports."""

    name: str  # the output directory's name
    output_dir: Path
    metrics_dir: Path
    config: Mapping[str, Any] = attrs.Factory(dict)  # resolved options, by section
    purge_step: int | None = None  # a resumed run re-logs steps from here on


class MetricSink(Protocol):
    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        """Record one step's metrics (numbers only; keys are namespaced)."""

    def finish(self, checkpoint_path: str | None) -> None:
        """The run ended normally; ``checkpoint_path`` is its last checkpoint (or None)."""

    def close(self) -> None:
        """Flush and release files or connections; safe to call twice."""


@attrs.frozen
class SinkSpec:
    """A named metric sink: ``create(run)`` opens it, ``check()`` says why it cannot run
    (not installed, not logged in) or returns None when it can."""

    name: str
    summary: str
    create: Callable[[RunInfo], MetricSink]
    check: Callable[[], str | None] = attrs.field(default=lambda: None)


__all__ = ["MetricSink", "RunInfo", "SinkSpec"]

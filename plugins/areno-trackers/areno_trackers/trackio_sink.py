"""``--report-to trackio``: a trackio run per ``areno train``, stored locally.

Configured by environment variables: ``TRACKIO_PROJECT`` (default ``areno``) and trackio's own
``TRACKIO_DIR`` (where its local database lives). The run is named after the output directory;
its config is the run's options (flattened, ``train.lr``), every metric is logged at its step,
and the final checkpoint path is logged as ``checkpoint_path`` at the last step. trackio's
own CPU/GPU system metrics are left off. ``trackio show --project areno`` opens the dashboard.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from areno_core.contracts.sink import RunInfo, SinkSpec
from areno_core.metrics.sinks import flat_config
from areno_trackers.common import missing


def check_trackio() -> str | None:
    return missing("trackio", "trackio")


class TrackioSink:
    def __init__(self, run: RunInfo) -> None:
        import trackio  # optional: the [trackio] extra

        self._run: Any = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT", "areno"),
            name=run.name,
            config=flat_config(run.config),
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )
        self._step = 0

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        self._run.log(dict(metrics), step=step)
        self._step = step

    def finish(self, checkpoint_path: str | None) -> None:
        if checkpoint_path is not None:
            self._run.log({"checkpoint_path": checkpoint_path}, step=self._step)
        self._run.finish()
        self._run = None

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


TRACKIO_SINK = SinkSpec(
    "trackio", "trackio, stored locally (TRACKIO_PROJECT, TRACKIO_DIR)", TrackioSink, check_trackio
)

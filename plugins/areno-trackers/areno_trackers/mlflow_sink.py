"""``--report-to mlflow``: an MLflow run per ``areno train``.

Configured by MLflow's own environment variables: ``MLFLOW_TRACKING_URI`` (default
``file:./mlruns``, a local file store) and ``MLFLOW_EXPERIMENT_NAME`` (default ``areno``). The
run is named after the output directory; the resolved options are its parameters (flattened,
``train.lr``), every metric is logged at its step, and the final checkpoint path is the tag
``areno.checkpoint_path``. MLflow 3 keeps file stores in maintenance mode and refuses them
unless ``MLFLOW_ALLOW_FILE_STORE=true``; this sink sets that for a ``file:`` URI it was given.
A database URI (``sqlite:///mlflow.db``) needs the full ``mlflow`` package (SQLAlchemy).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from areno_core.contracts.sink import RunInfo, SinkSpec
from areno_core.metrics.sinks import flat_config
from areno_trackers.common import missing

DEFAULT_URI = "file:./mlruns"
# MLflow refuses longer parameter values.
MAX_PARAM_CHARS = 6000
# Metrics per log_batch request (MLflow's limit is 1000).
BATCH = 1000
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def _is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri


def check_mlflow() -> str | None:
    why = missing("mlflow", "mlflow")
    if why is not None:
        return why
    uri = tracking_uri()
    database = uri.split(":", 1)[0].split("+", 1)[0] in DATABASES
    if database and importlib.util.find_spec("sqlalchemy") is None:
        return (
            f"MLFLOW_TRACKING_URI {uri!r} is a database, which needs the full MLflow package "
            "(pip install mlflow); or use a file store (file:./mlruns) or a tracking server "
            "(http://...)"
        )
    return None


class MlflowSink:
    def __init__(self, run: RunInfo) -> None:
        from mlflow.entities import Param  # optional: the [mlflow] extra
        from mlflow.tracking import MlflowClient

        uri = tracking_uri()
        if _is_file_store(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            # MLflow misreads file:/abs and file:rel; file:///abs is what it expects.
            path = urlparse(uri).path if uri.startswith("file:") else uri
            uri = Path(path).resolve().as_uri()
        self._client: Any = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "areno")
        experiment = self._client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self._client.create_experiment(name)
        )
        self._run_id: str | None = self._client.create_run(
            experiment_id, run_name=run.name
        ).info.run_id
        params = [
            Param(key, str(value)[:MAX_PARAM_CHARS])
            for key, value in flat_config(run.config).items()
        ]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self._client.log_batch(self._run_id, params=params[start : start + 100])

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        rows = [Metric(key, float(value), stamp, step) for key, value in metrics.items()]
        for start in range(0, len(rows), BATCH):
            self._client.log_batch(self._run_id, metrics=rows[start : start + BATCH])

    def finish(self, checkpoint_path: str | None) -> None:
        if checkpoint_path is not None:
            self._client.set_tag(self._run_id, "areno.checkpoint_path", checkpoint_path)
        self._client.set_terminated(self._run_id, "FINISHED")
        self._run_id = None

    def close(self) -> None:
        if self._run_id is not None:  # the run did not finish normally
            self._client.set_terminated(self._run_id, "FAILED")
            self._run_id = None


MLFLOW_SINK = SinkSpec(
    "mlflow",
    "MLflow (MLFLOW_TRACKING_URI, default file:./mlruns; MLFLOW_EXPERIMENT_NAME)",
    MlflowSink,
    check_mlflow,
)

"""Metric sinks: where a run's metrics go (TensorBoard, ``metrics.jsonl``, trackers).

A sink is registered by a plugin through ``register_metric_sinks`` as a :class:`SinkSpec`;
``--report-to`` names the sinks of a run. ``metrics.jsonl`` is always written (gates, plots and
``--resume`` read it); ``tensorboard`` is on by default. Each chosen sink's ``check`` runs
before anything is loaded, so a tracker that is not installed or not logged in stops the
command at once. Only the main process of a distributed run opens sinks.

What a sink is and does: :mod:`areno_core.contracts.sink`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from areno_core.contracts.sink import MetricSink, RunInfo, SinkSpec
from areno_core.errors import ConfigError

JSONL_FILE = "metrics.jsonl"
JSONL = "jsonl"
TENSORBOARD = "tensorboard"
NONE = "none"


def parse_report_to(value: str | None) -> list[str]:
    """The sink names of ``--report-to`` (comma-separated; ``none`` for jsonl only), jsonl
    first, each once."""
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    if NONE in names and len(names) > 1:
        raise ConfigError(f"--report-to {value!r}: 'none' cannot be combined with other sinks")
    names = [n for n in names if n != NONE]
    return list(dict.fromkeys([JSONL, *names]))


def check_sinks(names: Sequence[str], lookup: Callable[[str], SinkSpec]) -> list[SinkSpec]:
    """The specs of ``names``, each checked; a missing or unready sink is a ConfigError."""
    specs = []
    for name in names:
        try:
            spec = lookup(name)
        except ConfigError as exc:
            raise ConfigError(
                f"--report-to {name!r}: {exc} The W&B, MLflow and trackio sinks come with "
                "the areno-trackers package (pip install 'areno-trackers[wandb]', "
                "'[mlflow]' or '[trackio]')."
            ) from None
        why = spec.check()
        if why is not None:
            raise ConfigError(f"--report-to {name}: {why}")
        specs.append(spec)
    return specs


def open_sinks(specs: Sequence[SinkSpec], run: RunInfo) -> list[MetricSink]:
    """Create every sink; if one fails, close those already open and raise."""
    opened: list[MetricSink] = []
    try:
        for spec in specs:
            opened.append(spec.create(run))
    except Exception:
        for sink in opened:
            sink.close()
        raise
    return opened


# -- built-in sinks --------------------------------------------------------------------------


class _WriterSink:
    """A sink that writes through one handle (``self._out``, with ``flush`` and ``close``):
    flushed on ``flush`` and ``finish``, closed once."""

    _out: Any

    def flush(self) -> None:
        if self._out is not None:
            self._out.flush()

    def finish(self, checkpoint_path: str | None) -> None:
        self.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


class JsonlSink(_WriterSink):
    """One JSON line per step in ``<metrics dir>/metrics.jsonl``, flushed as written. When
    resuming, lines from ``purge_step`` on are dropped first."""

    def __init__(self, run: RunInfo) -> None:
        run.metrics_dir.mkdir(parents=True, exist_ok=True)
        path = run.metrics_dir / JSONL_FILE
        if run.purge_step is not None and path.is_file():
            _truncate_jsonl(path, run.purge_step)
        self._out = open(path, "a")  # noqa: SIM115 - kept open until close()

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        self._out.write(json.dumps({"step": int(step), **metrics}) + "\n")
        self._out.flush()


class TensorBoardSink(_WriterSink):
    """TensorBoard event files in the metrics directory; points of a resumed run's re-run
    steps are hidden from ``purge_step`` on."""

    def __init__(self, run: RunInfo, *, flush_secs: float = 10.0) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # heavy: only when the TensorBoard sink opens
        )

        run.metrics_dir.mkdir(parents=True, exist_ok=True)
        self._out = SummaryWriter(
            log_dir=str(run.metrics_dir),
            flush_secs=max(1, round(flush_secs)),
            purge_step=run.purge_step,
        )

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        for key, value in metrics.items():
            self._out.add_scalar(key, value, global_step=step)


def _check_tensorboard() -> str | None:
    try:
        import tensorboard  # noqa: F401 - only whether it imports
    except ImportError:
        return "TensorBoard is not installed: pip install tensorboard (or --report-to none)"
    return None


JSONL_SINK = SinkSpec(JSONL, "metrics.jsonl in the metrics directory (always on)", JsonlSink)
TENSORBOARD_SINK = SinkSpec(
    TENSORBOARD, "TensorBoard event files in the metrics directory", TensorBoardSink,
    _check_tensorboard,
)  # fmt: skip


def _truncate_jsonl(path: Path, purge_step: int) -> None:
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", math.inf) < purge_step:
                kept.append(line)
        except ValueError:
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-4}}`` -> ``{"train.lr": 1e-4}``: the form trackers that take
    flat parameters want (values kept as they are)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_config(value, f"{name}."))
        else:
            out[name] = value
    return out

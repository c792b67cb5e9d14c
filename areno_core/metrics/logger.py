"""Scalar metrics: TensorBoard event files plus a ``metrics.jsonl`` copy, and a section timer.

::

    metrics = MetricsLogger("runs/x/tensorboard")
    timer = Timer()
    with timer("rollout"):
        ...
    metrics.log({"train/loss": 0.52, "train/lr": 1e-6, **timer.pop()}, step=1)
    metrics.close()

    read_scalars("runs/x/tensorboard")  # {"train/loss": [(1, 0.52)], ...}

Every key is namespaced: ``train/*`` (optimisation), ``rollout/*`` (generation and rewards),
``time/*`` (wall-clock seconds and throughput), ``eval/*`` (evaluations) or ``memory/*``
(peak memory per phase, see :mod:`areno_core.accel.memory`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from areno_core.contracts.sink import MetricSink, RunInfo
from areno_core.log import get_logger
from areno_core.metrics.sinks import JSONL_FILE, JsonlSink, TensorBoardSink

logger = get_logger(__name__)

NAMESPACES: tuple[str, ...] = ("train", "rollout", "time", "eval", "memory")
__all__ = ["JSONL_FILE", "MetricsLogger", "Timer", "moving_average", "read_jsonl", "read_scalars"]


class MetricsLogger:
    """Write scalar metrics to the run's metric sinks (:mod:`areno_core.metrics.sinks`).

    With ``log_dir=None`` and no ``sinks`` nothing is written and only :attr:`history` is
    kept. Given a ``log_dir`` alone, the sinks are TensorBoard and ``metrics.jsonl`` there
    (event files flushed every ``flush_secs`` seconds and on :meth:`close`; each jsonl line as
    it is written). When resuming, pass ``purge_step`` (the first step the new run will log):
    TensorBoard then hides the old run's points from that step on, and the jsonl file drops
    its lines from that step on, so re-run steps are not recorded twice. ``sinks`` (already
    opened, e.g. by ``--report-to``) replace those defaults.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None,
        *,
        flush_secs: float = 10.0,
        purge_step: int | None = None,
        sinks: Sequence[MetricSink] | None = None,
    ) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.history: list[dict[str, float | int]] = []
        if sinks is None and self.log_dir is not None:
            run = RunInfo(self.log_dir.name, self.log_dir, self.log_dir, purge_step=purge_step)
            sinks = [TensorBoardSink(run, flush_secs=flush_secs), JsonlSink(run)]
        self.sinks: list[MetricSink] = list(sinks or ())

    def log(self, metrics: Mapping[str, float | int | torch.Tensor], step: int) -> None:
        """Record ``metrics`` at ``step`` in every sink (one jsonl line, one TensorBoard
        scalar per key, ...).

        Keys must start with one of ``train/``, ``rollout/``, ``time/``, ``eval/``,
        ``memory/``. Values may
        be numbers or one-element tensors; non-finite values are recorded as they are.
        """
        row: dict[str, float | int] = {}
        for key, value in metrics.items():
            namespace, sep, name = key.partition("/")
            if not sep or not name or namespace not in NAMESPACES:
                raise ValueError(
                    f"metric key {key!r} must start with one of "
                    + ", ".join(f"{n}/" for n in NAMESPACES)
                )
            row[key] = _to_number(key, value)
        self.history.append({"step": int(step), **row})
        for sink in self.sinks:
            sink.log(row, int(step))

    def finish(self, checkpoint_path: str | None) -> None:
        """Tell every sink the run ended normally, with its last checkpoint."""
        for sink in self.sinks:
            sink.finish(checkpoint_path)

    def flush(self) -> None:
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if flush is not None:
                flush()

    def close(self) -> None:
        """Close every sink; safe to call twice."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _to_number(key: str, value: Any) -> float | int:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric {key!r} is a tensor of {value.numel()} elements, not one")
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metric {key!r} is not a number: {value!r}") from exc


def read_jsonl(log_dir: str | os.PathLike[str]) -> list[dict[str, float | int]]:
    """The rows of ``metrics.jsonl`` in ``log_dir``, in order."""
    path = Path(log_dir) / JSONL_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_scalars(log_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Read every scalar series back from the TensorBoard event files in ``log_dir``.

    Uses TensorBoard's own reader, so the result is what TensorBoard shows: for each tag the
    ``(step, value)`` points in the order written (values are stored as float32).
    """
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )  # heavy: only when TensorBoard files are read

    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {
        tag: [(int(e.step), float(e.value)) for e in acc.Scalars(tag)]
        for tag in sorted(acc.Tags()[SCALARS])
    }


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean of a metric series over the last ``window`` values (fewer at the start),
    as a reward curve is smoothed for a plot."""
    out: list[float] = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


class Timer:
    """Accumulate wall-clock seconds per named section and report them as ``time/*`` metrics.

    ::

        timer = Timer()
        with timer("rollout"):
            ...
        timer.pop()  # {"time/rollout": 1.93}, and the totals start again from zero

    A section entered several times before :meth:`pop` adds up. With ``cuda_sync`` the timer
    waits for queued GPU work at both ends of a section, so GPU time is counted where it runs.
    """

    def __init__(self, *, cuda_sync: bool = False) -> None:
        self.cuda_sync = cuda_sync and torch.cuda.is_available()
        self._totals: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.cuda_sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda_sync:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            name = name.removeprefix("time/")
            self._totals[name] = self._totals.get(name, 0.0) + elapsed

    def totals(self) -> dict[str, float]:
        """Seconds per section since the last :meth:`pop`, keyed ``time/<name>``."""
        return {f"time/{name}": secs for name, secs in self._totals.items()}

    def pop(self) -> dict[str, float]:
        """:meth:`totals`, then reset."""
        out = self.totals()
        self._totals.clear()
        return out

"""The training loop, on one screen.

for each step:
    rows  = next batch of dataset rows
    data  = rows                       (sft, dpo)
          | rollout(rows) -> groups    (online RL: sample, score, group)
    result = backend.train(model, data, ...)
    log metrics, update the progress bar, save a checkpoint every --save-interval steps
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.train.datastream import DataStream
from areno_core.train.metrics import MetricsLogger
from areno_core.train.progress import TrainProgress


@attrs.define
class LoopResult:
    steps: int
    elapsed_s: float
    final_metrics: dict[str, float]
    checkpoint_path: str | None


def train_loop(
    *,
    model: TrainableModel,
    backend: LocalBackend,
    stream: DataStream,
    train_kwargs: dict[str, Any],
    max_steps: int,
    rollout: Callable[[list[Any], int], tuple[list[Any], dict[str, float]]] | None,
    metrics: MetricsLogger,
    progress: TrainProgress,
    save: Callable[[int], str] | None,
    save_interval: int,
) -> LoopResult:
    started = time.perf_counter()
    final: dict[str, float] = {}
    checkpoint: str | None = None
    saved_step = -1
    while model.step < max_steps:
        step_start = time.perf_counter()
        rows = stream.next_batch()
        if rows is None:
            break
        step_metrics: dict[str, float] = {}
        data: list[Any] = rows
        if rollout is not None:
            data, step_metrics = rollout(rows, model.step)
        result = backend.train(model, data, **train_kwargs)
        step_metrics.update(result.metrics)
        step_metrics["time/step"] = time.perf_counter() - step_start
        metrics.log(step_metrics, result.step)
        progress.update(result.step, step_metrics)
        final = step_metrics
        if save is not None and (result.step % save_interval == 0 or result.step == max_steps):
            checkpoint, saved_step = save(result.step), result.step
    if save is not None and saved_step != model.step and model.step > 0:
        checkpoint = save(model.step)
    return LoopResult(model.step, time.perf_counter() - started, final, checkpoint)

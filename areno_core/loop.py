"""The training loop, on one screen.

rollout.sync_weights()                 (online RL: the engine samples from the policy)
for each step:
    rows  = next batch of dataset rows
    data  = rows                       (sft, dpo)
          | rollout(rows) -> groups    (online RL: sample, score, group; peak memory)
    result = backend.train(model, data, ...)                         (peak memory)
    rollout.sync_weights()             (the new policy version, if the step changed it)
    every --eval-interval steps (and after the last): held-out evaluation (eval/*)
    log metrics, update the progress bar, save a checkpoint every --save-interval steps
    stop early, between steps, when stop_requested() (Ctrl-C); the last step is saved either way
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from areno_core.accel.memory import PhaseMemory
from areno_core.contracts.backend import TrainingBackend
from areno_core.data.stream import DataStream
from areno_core.metrics.logger import MetricsLogger
from areno_core.model import TrainableModel
from areno_core.train.progress import TrainProgress


def _no_measurement(phase: str) -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


class Rollout(Protocol):
    """What the loop needs of the rollout side (see :class:`areno_core.runner.rollout`)."""

    def sync_weights(self) -> None:
        """Hand the engine the current policy if it changed since the last call."""

    def __call__(self, rows: list[Any], step: int) -> tuple[list[Any], dict[str, float]]:
        """The trajectory groups for ``rows`` and the step's ``rollout/*`` metrics."""


@attrs.define
class LoopResult:
    steps: int
    elapsed_s: float
    final_metrics: dict[str, float]
    checkpoint_path: str | None
    first_eval: dict[str, float] = attrs.Factory(dict)
    last_eval: dict[str, float] = attrs.Factory(dict)
    interrupted: bool = False


def train_loop(
    *,
    model: TrainableModel,
    backend: TrainingBackend,
    stream: DataStream,
    train_kwargs: dict[str, Any],
    max_steps: int,
    rollout: Rollout | None,
    metrics: MetricsLogger,
    progress: TrainProgress,
    save: Callable[[int], str] | None,
    save_interval: int,
    evaluate: Callable[[], dict[str, float]] | None = None,
    eval_interval: int | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
    memory: PhaseMemory | None = None,
) -> LoopResult:
    """Run the steps (see the module docstring); ``memory`` adds each step's peak memory of
    the rollout and train phases (``memory/*``)."""
    started = time.perf_counter()
    final: dict[str, float] = {}
    checkpoint: str | None = None
    saved_step = -1
    evals: list[dict[str, float]] = []
    if rollout is not None:
        rollout.sync_weights()
    if evaluate is not None and model.step == 0:  # the starting point, logged as step 0
        evals.append(evaluate())
        metrics.log(evals[-1], 0)
    interrupted = False
    while model.step < max_steps:
        if stop_requested():  # only ever between steps, so what is saved is a whole step
            interrupted = True
            break
        step_start = time.perf_counter()
        rows = stream.next_batch()
        if rows is None:
            break
        step_metrics: dict[str, float] = {}
        data: list[Any] = rows
        phase = memory if memory is not None else _no_measurement
        if rollout is not None:
            with phase("rollout"):
                data, step_metrics = rollout(rows, model.step)
        with phase("train"):
            result = backend.train(model, data, **train_kwargs)
        if rollout is not None:
            rollout.sync_weights()
        step_metrics.update(result.metrics)
        if memory is not None:
            step_metrics.update(memory.pop())
        step_metrics["time/step"] = time.perf_counter() - step_start
        last = result.step == max_steps
        if evaluate is not None and (last or result.step % (eval_interval or save_interval) == 0):
            evals.append(evaluate())
            step_metrics.update(evals[-1])
        metrics.log(step_metrics, result.step)
        progress.update(result.step, step_metrics)
        final = step_metrics
        if save is not None and (result.step % save_interval == 0 or result.step == max_steps):
            checkpoint, saved_step = save(result.step), result.step
    if save is not None and saved_step != model.step and model.step > 0:
        checkpoint = save(model.step)
    return LoopResult(
        model.step,
        time.perf_counter() - started,
        final,
        checkpoint,
        first_eval=evals[0] if evals else {},
        last_eval=evals[-1] if evals else {},
        interrupted=interrupted,
    )

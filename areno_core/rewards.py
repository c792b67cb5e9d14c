"""Calling reward functions: files or registered names, sync or async, failures counted.

A reward function takes one :class:`~areno_core.types.RewardRecord` and returns an int, float or
bool (or an awaitable of one). One that raises, or returns anything else (a string such as
``"0.5"``, None, a tensor, NaN), scores 0.0 and is counted in ``rollout/reward_errors``;
the first traceback is logged once. When most rewards of a step fail, the run stops with that
traceback, since training on zeros would be meaningless.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from areno_core.errors import ArenoError
from areno_core.log import get_logger
from areno_core.pyfile import resolve_function
from areno_core.types import RewardRecord

logger = get_logger(__name__)

RewardFn = Callable[[RewardRecord], Any]


class RewardError(ArenoError):
    """Most rewards of a step failed."""


def resolve_reward_fn(spec: str, registry: Any) -> RewardFn:
    """``file.py`` / ``file.py:function`` (default ``reward_fn``) or a registered reward name."""

    return resolve_function(
        spec,
        lookup=lambda name: registry.get("rewards", name),
        default_name="reward_fn",
        what="reward function",
    )


@attrs.define
class RewardScorer:
    """Scores records and keeps the error bookkeeping of a run."""

    fn: RewardFn
    fail_fraction: float = 0.5
    errors_total: int = 0
    _shown: bool = False

    def score(self, records: Sequence[RewardRecord]) -> tuple[list[float], int]:
        """Rewards for ``records`` and how many of them failed."""
        results: list[Any] = [None] * len(records)
        failures: list[BaseException] = []
        pending: list[tuple[int, Any]] = []
        for i, record in enumerate(records):
            try:
                value = self.fn(record)
            except Exception as exc:
                failures.append(exc)
                results[i] = 0.0
                continue
            if inspect.isawaitable(value):
                pending.append((i, value))
            else:
                results[i] = value
        if pending:
            awaited = _run_async([aw for _, aw in pending])
            for (i, _), value in zip(pending, awaited, strict=True):
                if isinstance(value, BaseException):
                    failures.append(value)
                    results[i] = 0.0
                else:
                    results[i] = value
        rewards = []
        for i, value in enumerate(results):
            number = _as_float(value)
            if number is None:
                failures.append(TypeError(_bad_value_message(value, i)))
                number = 0.0
            rewards.append(number)
        self._report(failures, len(records))
        return rewards, len(failures)

    def _report(self, failures: list[BaseException], total: int) -> None:
        if not failures:
            return
        self.errors_total += len(failures)
        first = "".join(traceback.format_exception(failures[0]))
        if total and len(failures) / total > self.fail_fraction:
            raise RewardError(
                f"{len(failures)} of {total} rewards in this step failed; stopping. First error:"
                f"\n{first}"
            )
        if not self._shown:
            self._shown = True
            logger.warning(
                "a reward function call failed and was scored 0 (counted in "
                "rollout/reward_errors; shown once):\n%s",
                first,
            )


def _as_float(value: Any) -> float | None:
    """The reward as a float: an int, float or bool (or another real-number type, such as a
    NumPy scalar) that is finite. Anything else, a string like ``"0.5"`` included, is None."""
    if not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _bad_value_message(value: Any, sample: int) -> str:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    if isinstance(value, numbers.Real):
        return f"reward function returned {shown} for sample {sample}; expected a finite number"
    return (
        f"reward function returned a {type(value).__name__} ({shown}) for sample {sample}; "
        "expected an int, float or bool"
    )


def _run_async(awaitables: list[Any]) -> list[Any]:
    async def gather() -> list[Any]:
        return await asyncio.gather(*awaitables, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    raise RuntimeError("async reward functions cannot be scored from inside a running event loop")

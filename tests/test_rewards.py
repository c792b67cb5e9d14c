from __future__ import annotations

import asyncio

import pytest

from areno_core.rewards import RewardError, RewardScorer
from areno_core.types import RewardRecord


def records(*completions: str) -> list[RewardRecord]:
    return [RewardRecord(prompt="p", completion=c) for c in completions]


def test_scorer_sync_and_async_functions_give_floats():
    async def async_fn(record):
        await asyncio.sleep(0)
        return len(record.completion)

    assert RewardScorer(lambda r: r.completion == "a").score(records("a", "b")) == ([1.0, 0.0], 0)
    assert RewardScorer(async_fn).score(records("ab", "")) == ([2.0, 0.0], 0)


def test_scorer_failures_score_zero_and_are_counted_and_logged_once(caplog):
    def fn(record):
        if record.completion == "bad":
            raise KeyError("missing")
        return 1.0

    scorer = RewardScorer(fn)
    with caplog.at_level("WARNING", logger="areno.rewards"):
        assert scorer.score(records("ok", "bad", "ok")) == ([1.0, 0.0, 1.0], 1)
        assert scorer.score(records("bad", "ok", "ok")) == ([0.0, 1.0, 1.0], 1)
    assert scorer.errors_total == 2
    assert sum("KeyError" in r.getMessage() for r in caplog.records) == 1


def test_scorer_non_numeric_result_counts_as_error():
    scorer = RewardScorer(lambda r: float("nan") if r.completion == "x" else 2)
    assert scorer.score(records("x", "y", "z")) == ([0.0, 2.0, 2.0], 1)
    with pytest.raises(RewardError, match="returned 'high' for sample 0; expected a finite"):
        RewardScorer(lambda r: "high").score(records("a", "b"))


def test_scorer_most_failing_stops_run_with_first_traceback():
    def fn(record):
        raise ValueError("reward exploded")

    with pytest.raises(RewardError, match="3 of 3 rewards in this step failed") as info:
        RewardScorer(fn).score(records("a", "b", "c"))
    assert "ValueError: reward exploded" in str(info.value)

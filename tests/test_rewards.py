from __future__ import annotations

import asyncio

import pytest
import torch

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


def test_scorer_non_finite_result_counts_as_error():
    scorer = RewardScorer(lambda r: float("nan") if r.completion == "x" else 2)
    assert scorer.score(records("x", "y", "z")) == ([0.0, 2.0, 2.0], 1)
    with pytest.raises(RewardError, match=r"returned inf for sample 0; expected a finite number"):
        RewardScorer(lambda r: float("inf")).score(records("a", "b"))


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("0.5", r"a str \('0\.5'\)"),
        (None, r"a NoneType \(None\)"),
        (b"1", r"a bytes \(b'1'\)"),
        ([1.0], r"a list \(\[1\.0\]\)"),
        (torch.tensor(0.5), r"a Tensor \(tensor\(0\.5000\)\)"),
    ],
)
def test_scorer_result_of_other_type_is_an_error_naming_the_type(value, shown):
    scorer = RewardScorer(lambda r: value if r.completion == "x" else 1)
    assert scorer.score(records("x", "y", "z")) == ([0.0, 1.0, 1.0], 1)
    assert scorer.errors_total == 1
    with pytest.raises(
        RewardError,
        match=rf"returned {shown} for sample 0; expected an int, float or bool",
    ):
        RewardScorer(lambda r: value).score(records("a", "b"))


def test_scorer_int_float_bool_and_numpy_scalars_accepted():
    import numpy as np

    values = iter([3, 0.25, True, np.float32(0.5), np.int64(2)])
    scorer = RewardScorer(lambda r: next(values))
    assert scorer.score(records(*"abcde")) == ([3.0, 0.25, 1.0, 0.5, 2.0], 0)


def test_scorer_most_failing_stops_run_with_first_traceback():
    def fn(record):
        raise ValueError("reward exploded")

    with pytest.raises(RewardError, match="3 of 3 rewards in this step failed") as info:
        RewardScorer(fn).score(records("a", "b", "c"))
    assert "ValueError: reward exploded" in str(info.value)

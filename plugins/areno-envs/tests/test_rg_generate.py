"""Rows from reasoning-gym: reproducible, disjoint splits, and the task's own scorer."""

from __future__ import annotations

import json

import pytest
import reasoning_gym
from areno_envs.rg.loader import rg_loader, rg_sft_loader, task_loader
from areno_envs.rg.reward import rg_reward_fn

from areno_core.data import apply_loader
from areno_core.errors import DatasetError
from areno_core.types import RewardRecord

CHAIN = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def record(row: dict, completion: str) -> RewardRecord:
    return RewardRecord(prompt="", completion=completion, answer=row.get("answer"), row=row)


def test_rows_are_reasoning_gyms_problems_and_reproducible() -> None:
    spec = {"seed": 7, "size": 6, "range": [2, 5], "config": CHAIN, "format": "text"}
    rows = task_loader("chain_sum")(spec)
    assert rows == task_loader("chain_sum")(dict(spec))
    reference = reasoning_gym.create_dataset("chain_sum", seed=7, size=6, **CHAIN)
    assert [r["answer"] for r in rows] == [reference[i]["answer"] for i in range(2, 5)]
    assert [r["prompt"] for r in rows] == [reference[i]["question"] + " " for i in range(2, 5)]
    assert [r["rg"]["index"] for r in rows] == [2, 3, 4]
    json.dumps(rows)  # plain JSON, whatever the task's metadata holds


def test_chat_prompt_is_reasoning_gyms_system_prompt_and_question() -> None:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    (row,) = rg_loader({"task": "gcd", "size": 1})
    assert row["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPTS["default"]}
    assert row["prompt"][1]["role"] == "user" and "GCD" in row["prompt"][1]["content"]


def test_eval_range_shares_no_question_with_the_excluded_range() -> None:
    # Two one-digit terms: 200 possible questions, so 300 training problems repeat many.
    base = {"seed": 0, "size": 400, "config": CHAIN, "format": "text"}
    train = task_loader("chain_sum")({**base, "range": [0, 300]})
    held = task_loader("chain_sum")({**base, "range": [300, 400], "exclude": [[0, 300]]})
    seen = {r["prompt"] for r in train}
    assert 0 < len(held) < 100
    assert not seen & {r["prompt"] for r in held}


def test_reward_is_the_tasks_score_answer() -> None:
    rows = task_loader("chain_sum")({"size": 3, "config": CHAIN, "format": "text"})
    for row in rows:
        assert rg_reward_fn(record(row, f" {row['answer']}\n")) == 1.0
        assert rg_reward_fn(record(row, "zzz")) == 0.0
    (row,) = task_loader("basic_arithmetic")({"size": 1})
    assert rg_reward_fn(record(row, f"think... <answer>{row['answer']}</answer>")) == 1.0
    assert rg_reward_fn(record(row, row["answer"])) == 0.0  # chat format: no tags, no answer
    # Partial credit is reasoning-gym's: the answer inside a longer one scores len ratio.
    (row,) = task_loader("chain_sum")({"size": 1, "config": CHAIN, "format": "text"})
    dataset = reasoning_gym.create_dataset("chain_sum", seed=0, size=1, **CHAIN)
    padded = row["answer"] + "xx"
    assert rg_reward_fn(record(row, padded)) == dataset.score_answer(padded, dataset[0])


def test_reward_without_rg_rows_says_so() -> None:
    with pytest.raises(ValueError, match="needs rows made by an rg loader"):
        rg_reward_fn(RewardRecord(prompt="p", completion="c", row={"prompt": "p"}))


def test_sft_rows_answer_as_response() -> None:
    rows = rg_sft_loader({"task": "chain_sum", "size": 2, "config": CHAIN, "format": "text"})
    reference = reasoning_gym.create_dataset("chain_sum", seed=0, size=2, **CHAIN)
    assert rows == [
        {"prompt": reference[i]["question"] + " ", "response": reference[i]["answer"]}
        for i in range(2)
    ]


def test_task_that_rejects_its_config_is_named() -> None:
    with pytest.raises(DatasetError, match=r"task 'chain_sum' rejects config.*max_terms"):
        apply_loader(
            [{"size": 2, "config": {"min_terms": 5, "max_terms": 2}}], task_loader("chain_sum")
        )

"""GSM8K / NuminaMath loaders and the math-verify reward, on real GSM8K rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from areno_recipes_math.loaders import (
    INSTRUCTION,
    gsm8k_final_answer,
    gsm8k_loader,
    last_boxed,
    numina_loader,
)
from areno_recipes_math.reward import math_verify_reward_fn

from areno_core.errors import DatasetError
from areno_core.types import RewardRecord

GSM8K_TRAIN = Path(__file__).resolve().parents[3] / "data" / "gsm8k" / "train.jsonl"


@pytest.fixture(scope="module")
def gsm8k_rows() -> list[dict]:
    if not GSM8K_TRAIN.is_file():
        pytest.fail(
            f"GSM8K rows are missing at {GSM8K_TRAIN}; they ship in the repository's data/gsm8k"
        )
    with GSM8K_TRAIN.open() as f:
        return [json.loads(next(f)) for _ in range(200)]


def record(completion: str, answer: str, solutions: tuple[str, ...] | None = None) -> RewardRecord:
    return RewardRecord(
        prompt="q", completion=completion, answer=answer, solutions=solutions or (answer,)
    )


def test_gsm8k_loader_real_rows_prompt_asks_for_boxed_answer(gsm8k_rows) -> None:
    first = gsm8k_loader(gsm8k_rows[0])
    assert first["answer"] == "72" and first["solutions"] == ["72"]
    assert first["prompt"] == [
        {"role": "user", "content": gsm8k_rows[0]["question"] + "\n\n" + INSTRUCTION}
    ]
    assert gsm8k_loader(gsm8k_rows[1])["answer"] == "10"
    for raw in gsm8k_rows:
        row = gsm8k_loader(raw)
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].startswith(raw["question"])
        assert "\\boxed{" in message["content"]
        final = raw["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert row["answer"] == final and row["solutions"] == [final]
        assert "," not in row["answer"] and "####" not in row["answer"]
        float(row["answer"])  # every GSM8K final answer is a plain number


def test_gsm8k_final_answer_thousands_separator_removed() -> None:
    assert gsm8k_final_answer("so 1,200 + 34 = 1,234\n#### 1,234") == "1234"


def test_gsm8k_loader_missing_marker_raises_dataset_error() -> None:
    with pytest.raises(DatasetError, match="####"):
        gsm8k_loader({"question": "1+1?", "answer": "it is 2"})
    with pytest.raises(DatasetError, match="'question'"):
        gsm8k_loader({"problem": "1+1?", "answer": "#### 2"})


def test_numina_loader_boxed_solution_gives_answer_and_reference() -> None:
    row = {"problem": "Find x.", "solution": "We get $x=\\boxed{\\frac{1}{2}}$ at the end."}
    out = numina_loader(row)
    assert out["answer"] == "\\frac{1}{2}"
    assert out["solutions"] == [row["solution"]]
    assert out["prompt"][0]["content"].startswith("Find x.")
    assert numina_loader({"problem": "p", "solution": "no boxed answer here"}) is None
    assert last_boxed("\\boxed{1} then \\boxed{{2}+{3}}") == "{2}+{3}"
    assert last_boxed("\\boxed{unclosed") is None


@pytest.mark.parametrize(
    "completion",
    ["\\boxed{18}", "The answer is \\boxed{18}.", "\\boxed{18.0}", "18", "so it is 18.0", "$18$",
     "\\boxed{\\frac{36}{2}}"],
)  # fmt: skip
def test_math_verify_reward_equivalent_answer_scores_one(completion: str) -> None:
    assert math_verify_reward_fn(record(completion, "18")) == 1.0


@pytest.mark.parametrize("completion", ["\\boxed{17}", "\\boxed{1,8}", "18 apples, 20 pears"])
def test_math_verify_reward_wrong_answer_scores_zero(completion: str) -> None:
    assert math_verify_reward_fn(record(completion, "18")) == 0.0


@pytest.mark.parametrize(
    "completion",
    ["", "   ", "\\boxed{", "}}}{{\\frac{", "\\boxed{\\frac{1}{", "x" * 20000, "\x00\xff<|im_end|>",
     "\\begin{array} & \\end{matrix}"],
)  # fmt: skip
def test_math_verify_reward_malformed_completion_scores_zero(completion: str) -> None:
    assert math_verify_reward_fn(record(completion, "18")) == 0.0


def test_math_verify_reward_record_without_fields_scores_zero() -> None:
    assert math_verify_reward_fn(object()) == 0.0
    assert math_verify_reward_fn(RewardRecord(prompt="q", completion="\\boxed{3}")) == 0.0


def test_math_verify_reward_real_gsm8k_references_match_boxed_final(gsm8k_rows) -> None:
    for raw in gsm8k_rows[:40]:
        row = gsm8k_loader(raw)
        work = raw["answer"].rsplit("####", 1)[0]
        right = f"{work}\nSo the answer is \\boxed{{{row['answer']}}}."
        wrong = f"{work}\nSo the answer is \\boxed{{{float(row['answer']) + 1:g}}}."
        solutions = tuple(row["solutions"])
        assert math_verify_reward_fn(record(right, row["answer"], solutions)) == 1.0, raw
        assert math_verify_reward_fn(record(wrong, row["answer"], solutions)) == 0.0, raw


def test_math_verify_reward_numina_solution_reference_scores_equivalent_form() -> None:
    solution = "Half of it: $\\boxed{\\frac{1}{2}}$."
    rec = record("\\boxed{0.5}", "\\frac{1}{2}", (solution,))
    assert math_verify_reward_fn(rec) == 1.0

"""The arithmetic task: generator, shipped data, loaders and the exact-match reward."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from areno_recipes_math.arith import (
    EVAL_FILE,
    TRAIN_FILE,
    ArithProblem,
    count_problems,
    main,
    make_splits,
    sample_problems,
)
from areno_recipes_math.loaders import arith_loader, arith_sft_loader
from areno_recipes_math.reward import exact_match_reward_fn

from areno_core.errors import DatasetError
from areno_core.types import RewardRecord

DATA = resources.files("areno_recipes_math") / "data"


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_make_splits_same_seed_identical_other_seed_differs() -> None:
    first = make_splits(seed=3, n_train=300, n_eval=50)
    assert first == make_splits(seed=3, n_train=300, n_eval=50)
    assert first != make_splits(seed=4, n_train=300, n_eval=50)


def test_make_splits_eval_disjoint_from_train_and_unique() -> None:
    train, held_out = make_splits(seed=0, n_train=2000, n_eval=200)
    assert len(train) == 2000 and len(held_out) == 200
    assert len(set(train)) == 2000 and len(set(held_out)) == 200
    assert not set(train) & set(held_out)


def test_sample_problems_answers_correct_and_operands_in_range() -> None:
    stream = sample_problems(1, min_digits=2, max_digits=3)
    for _ in range(500):
        p = next(stream)
        assert 10 <= p.a <= 999 and 10 <= p.b <= 999
        value = p.a + p.b if p.op == "+" else p.a - p.b
        assert p.answer == str(value) and value >= 0
        assert p.question == f"{p.a}{p.op}{p.b}"


def test_make_splits_more_than_available_raises_value_error() -> None:
    assert count_problems(min_digits=1, max_digits=1) == 100 + 55
    with pytest.raises(ValueError, match="only 155 distinct"):
        make_splits(n_train=150, n_eval=10, min_digits=1, max_digits=1)


def test_shipped_data_regenerates_byte_identical(tmp_path) -> None:
    main(["--out", str(tmp_path)])
    for name in (TRAIN_FILE, EVAL_FILE):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_shipped_data_eval_rows_never_in_train() -> None:
    train = {r["question"] for r in read_jsonl(DATA / TRAIN_FILE)}
    held_out = [r["question"] for r in read_jsonl(DATA / EVAL_FILE)]
    assert len(train) == 10000 and len(held_out) == 500 == len(set(held_out))
    assert not train.intersection(held_out)


def test_arith_loaders_plain_text_prompt_and_answer() -> None:
    row = ArithProblem(47, "+", 89).row()
    assert row == {"question": "47+89", "answer": "136"}
    assert arith_loader(row) == {"prompt": "47+89=", "answer": "136", "solutions": ["136"]}
    assert arith_sft_loader(row) == {"prompt": "47+89=", "response": "136"}
    with pytest.raises(DatasetError, match="'question' and 'answer'"):
        arith_loader({"question": "1+2", "answer": 3})


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [("136", "136", 1.0), (" 136\n", "136", 1.0), ("137", "136", 0.0), ("1360", "136", 0.0),
     ("136 ", " 136", 1.0), ("", "136", 0.0), ("13 6", "136", 0.0), ("136", None, 0.0)],
)  # fmt: skip
def test_exact_match_reward_completion_vs_answer_scores(completion, answer, expected) -> None:
    rec = RewardRecord(prompt="47+89=", completion=completion, answer=answer)
    assert exact_match_reward_fn(rec) == expected

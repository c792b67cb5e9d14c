"""Tests for areno_core.data.schema: row validation messages and the standard schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from areno_core.algorithm import RowSchema
from areno_core.data.schema import (
    AGENTIC_SCHEMA,
    DPO_SCHEMA,
    RL_SCHEMA,
    SFT_SCHEMA,
    is_chat_preference_row,
    split_chat_preference,
    split_preference_rows,
    validate_rows,
)
from areno_core.errors import DatasetError

USER = {"role": "user", "content": "What is 2+2?"}
GOOD = {"role": "assistant", "content": "4"}
BAD = {"role": "assistant", "content": "5"}


@pytest.fixture
def gsm8k_rows(gsm8k_dir: Path) -> list[dict[str, Any]]:
    """The first 20 real GSM8K training rows (keys question, answer)."""
    with (gsm8k_dir / "train.jsonl").open(encoding="utf-8") as handle:
        return [json.loads(line) for _, line in zip(range(20), handle, strict=False)]


# --- rows that pass ----------------------------------------------------------------------------


def test_validate_rows_rl_rows_from_gsm8k_pass(gsm8k_rows: list[dict[str, Any]]) -> None:
    rows = [
        {"prompt": r["question"], "answer": r["answer"].split("####")[-1].strip()}
        for r in gsm8k_rows
    ]
    validate_rows(rows, RL_SCHEMA, algo="grpo")


def test_validate_rows_rl_chat_prompt_and_solutions_pass() -> None:
    rows = [
        {"prompt": [USER], "solutions": ["4", "four"], "answer": 4},
        {"prompt": "2+2?", "solutions": "4", "answer": 4.0},
        {"prompt": "2+2?", "answer": None, "extra": object()},
    ]
    validate_rows(rows, RL_SCHEMA, algo="gspo")


def test_validate_rows_sft_text_and_chat_pass(gsm8k_rows: list[dict[str, Any]]) -> None:
    rows = [{"prompt": r["question"], "response": r["answer"]} for r in gsm8k_rows]
    rows.append({"prompt": [USER], "response": [GOOD]})
    parts = [{"type": "text", "text": "hi"}]
    tool_turn = {"role": "assistant", "content": None, "tool_calls": []}
    rows.append({"prompt": [{"role": "user", "content": parts}], "response": [tool_turn]})
    validate_rows(rows, SFT_SCHEMA, algo="sft")


def test_validate_rows_dpo_text_rows_pass() -> None:
    validate_rows([{"prompt": "2+2?", "chosen": "4", "rejected": "5"}], DPO_SCHEMA, algo="dpo")


def test_validate_rows_dpo_chat_pair_without_prompt_passes() -> None:
    row = {"chosen": [USER, GOOD], "rejected": [USER, BAD]}
    assert is_chat_preference_row(row)
    validate_rows([row], DPO_SCHEMA, algo="dpo")


def test_validate_rows_agentic_any_dict_passes() -> None:
    validate_rows([{"task": "tictactoe", "seed": 3}, {}], AGENTIC_SCHEMA, algo="gspo")


# --- missing and mistyped keys -----------------------------------------------------------------


def test_validate_rows_raw_gsm8k_for_rl_names_missing_prompt(
    gsm8k_rows: list[dict[str, Any]],
) -> None:
    with pytest.raises(
        DatasetError,
        match=r"^grpo: dataset row 0 is missing the required key 'prompt' \(expected str or "
        r"list \(a list means chat messages\)\)\. The row has keys: 'question', 'answer'\. "
        r"Rows must have required: prompt \(str\|list\); optional: solutions \(list\|str\), "
        r"answer \(str\|int\|float\); use --dataset-loader-fn to map raw rows to this schema$",
    ):
        validate_rows(gsm8k_rows, RL_SCHEMA, algo="grpo")


@pytest.mark.parametrize(
    ("rows", "schema", "algo", "message"),
    [
        pytest.param(
            [{"prompt": "a", "response": "b"}] * 3 + [{"prompt": "a", "answer": "b"}],
            SFT_SCHEMA,
            "sft",
            r"^sft: dataset row 3 is missing the required key 'response' .* The row has keys: "
            r"'prompt', 'answer'\. Rows must have required: prompt \(str\|list\), response "
            r"\(str\|list\);",
            id="sft-missing-response-names-row-index",
        ),
        pytest.param(
            [{"prompt": "ok"}, {"prompt": 1}, {"nothing": True}],
            RL_SCHEMA,
            "gspo",
            r"^gspo: dataset row 1: ",
            id="stops-at-first-bad-row",
        ),
        pytest.param(
            [{"prompt": "ok"}, {"prompt": "ok"}, {"prompt": "ok"}, {"prompt": 42, "answer": "x"}],
            RL_SCHEMA,
            "gspo",
            r"^gspo: dataset row 3: key 'prompt' has type int, expected str or list \(a list "
            r"means chat messages\)\. The row has keys: 'prompt', 'answer'$",
            id="mistyped-prompt-names-found-and-expected",
        ),
        pytest.param(
            [{"prompt": "p", "chosen": "c", "rejected": None}],
            DPO_SCHEMA,
            "dpo",
            r"^dpo: dataset row 0: key 'rejected' has type None, expected str or",
            id="required-none-reports-none-type",
        ),
        pytest.param(
            [{"prompt": "p", "answer": True}],
            RL_SCHEMA,
            "grpo",
            r"^grpo: dataset row 0: key 'answer' has type bool, expected str or int or float\. "
            r"The row has keys: 'prompt', 'answer'$",
            id="bool-answer-is-not-an-int",
        ),
        pytest.param(
            [{"prompt": "p", "solutions": ["4", {"v": 4}]}],
            RL_SCHEMA,
            "grpo",
            r"^grpo: dataset row 0: key 'solutions' item 1 has type dict, expected str or int "
            r"or float\. The row has keys: 'prompt', 'solutions'$",
            id="solutions-item-type-is-checked",
        ),
        pytest.param(
            [{}, ["prompt", "x"]],
            AGENTIC_SCHEMA,
            "gspo",
            r"^gspo: dataset row 1 is of type list, not a dict; a loader must return dicts$",
            id="non-dict-row-is-rejected",
        ),
        pytest.param(
            [{"prompt": 7, "task": "x"}],
            AGENTIC_SCHEMA,
            "gspo",
            r"^gspo: dataset row 0: key 'prompt' has type int, expected str or list",
            id="agentic-mistyped-prompt-is-rejected",
        ),
        pytest.param(
            [],
            RL_SCHEMA,
            "ppo",
            r"^ppo: the dataset has no rows after loading$",
            id="empty-dataset-is-an-error",
        ),
    ],
)
def test_validate_rows_bad_rows_are_an_error_naming_row_key_and_types(
    rows: list[Any], schema: RowSchema, algo: str, message: str
) -> None:
    with pytest.raises(DatasetError, match=message):
        validate_rows(rows, schema, algo=algo)


def test_validate_rows_custom_schema_uses_its_types() -> None:
    schema = RowSchema(required={"image": (bytes,)}, optional={"caption": (str,)})
    validate_rows([{"image": b"\x89PNG"}], schema, algo="toy")
    with pytest.raises(
        DatasetError,
        match=r"^toy: dataset row 0: key 'caption' has type int, expected str\. The row has "
        r"keys: 'image', 'caption'$",
    ):
        validate_rows([{"image": b"", "caption": 3}], schema, algo="toy")


# --- chat lists --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        ([], r"the list is empty"),
        (["hello"], r"message 0 is of type str, not a dict"),
        ([USER, {"content": "x"}], r"message 1 has no 'role' \(its keys: 'content'\)"),
        ([{"role": "", "content": "x"}], r"message 0 has role '', expected a non-empty string"),
        ([{"role": 1, "content": "x"}], r"message 0 has role 1, expected a non-empty string"),
        (
            [{"role": "user", "text": "x"}],
            r"message 0 has no 'content' \(its keys: 'role', 'text'\)",
        ),
        (
            [{"role": "user", "content": 5}],
            r"message 0 has content of type int, expected str, list or None",
        ),
    ],
)
def test_validate_rows_bad_chat_prompt_explains_problem(prompt: list[Any], problem: str) -> None:
    with pytest.raises(
        DatasetError,
        match=rf"^sft: dataset row 0: key 'prompt' is a list, so it must be a chat message list, "
        rf"but {problem}\. Each message must be a dict with a 'role' string and a 'content'\. "
        rf"The row has keys: 'prompt', 'response'$",
    ):
        validate_rows([{"prompt": prompt, "response": "r"}], SFT_SCHEMA, algo="sft")


def test_validate_rows_bad_chat_response_names_response_key() -> None:
    with pytest.raises(DatasetError, match=r"key 'response' is a list, so it must be a chat"):
        validate_rows([{"prompt": "p", "response": ["just text"]}], SFT_SCHEMA, algo="sft")


def test_validate_rows_solutions_list_is_not_a_chat_list() -> None:
    validate_rows([{"prompt": "p", "solutions": ["a", "b"]}], RL_SCHEMA, algo="grpo")


# --- DPO chat pairs ----------------------------------------------------------------------------


def test_split_chat_preference_shared_prefix_becomes_prompt() -> None:
    system = {"role": "system", "content": "Be brief."}
    follow = {"role": "user", "content": "Sure?"}
    row = {
        "chosen": [system, USER, GOOD, follow, {"role": "assistant", "content": "Yes, 4."}],
        "rejected": [system, USER, GOOD, follow, {"role": "assistant", "content": "No, 5."}],
        "id": 17,
    }
    out = split_chat_preference(row)
    assert out == {
        "prompt": [system, USER, GOOD, follow],
        "chosen": [{"role": "assistant", "content": "Yes, 4."}],
        "rejected": [{"role": "assistant", "content": "No, 5."}],
        "id": 17,
    }
    assert "prompt" not in row  # the input row is not changed


def test_split_chat_preference_different_lengths_split_at_divergence() -> None:
    extra = {"role": "user", "content": "and 3+3?"}
    out = split_chat_preference({"chosen": [USER, GOOD, extra, GOOD], "rejected": [USER, BAD]})
    assert out["prompt"] == [USER]
    assert out["chosen"] == [GOOD, extra, GOOD]
    assert out["rejected"] == [BAD]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        pytest.param(
            {
                "chosen": [USER, GOOD],
                "rejected": [{"role": "user", "content": "What is 3+3?"}, BAD],
            },
            r"^'chosen' and 'rejected' share no opening messages, so there is no prompt to "
            r"split off; give the row a 'prompt' key$",
            id="no-shared-messages",
        ),
        pytest.param(
            {"chosen": [USER, GOOD], "rejected": [USER, GOOD]},
            r"^'chosen' \(2 messages\) and 'rejected' \(2 messages\) do not differ after "
            r"their shared opening messages; each needs its own reply$",
            id="identical-lists",
        ),
        pytest.param(
            {"chosen": [USER, {"role": "user", "content": "x"}], "rejected": [USER, BAD]},
            r"^after the 1 shared prompt messages, 'chosen' continues with a 'user' message; "
            r"the first message after the prompt must have role 'assistant'$",
            id="non-assistant-continuation",
        ),
        pytest.param(
            {"chosen": "4", "rejected": [USER, BAD]},
            r"^split_chat_preference needs 'chosen' and 'rejected' to be chat lists, got str "
            r"and list$",
            id="text-values",
        ),
        pytest.param(
            {"chosen": [USER, GOOD], "rejected": [USER, {"role": "assistant"}]},
            r"^'rejected' is not a chat list: message 1 has no 'content'",
            id="malformed-message",
        ),
    ],
)
def test_split_chat_preference_bad_pair_is_an_error_saying_why(
    row: dict[str, Any], message: str
) -> None:
    with pytest.raises(DatasetError, match=message):
        split_chat_preference(row)


def test_validate_rows_dpo_unsplittable_chat_pair_names_row() -> None:
    rows = [
        {"prompt": "p", "chosen": "c", "rejected": "r"},
        {"chosen": [USER, GOOD], "rejected": [GOOD, BAD]},
    ]
    with pytest.raises(
        DatasetError,
        match=r"^dpo: dataset row 1 has no 'prompt' and its chosen/rejected chat lists cannot be "
        r"split into one: 'chosen' and 'rejected' share no opening messages, .*\. The row has "
        r"keys: 'chosen', 'rejected'$",
    ):
        validate_rows(rows, DPO_SCHEMA, algo="dpo")


def test_validate_rows_dpo_text_pair_without_prompt_is_missing_prompt() -> None:
    assert not is_chat_preference_row({"chosen": "4", "rejected": "5"})
    with pytest.raises(
        DatasetError,
        match=r"^dpo: dataset row 0 is missing the required key 'prompt' .* The row has keys: "
        r"'chosen', 'rejected'\. Rows must have required: prompt \(str\|list\), chosen "
        r"\(str\|list\), rejected \(str\|list\);",
    ):
        validate_rows([{"chosen": "4", "rejected": "5"}], DPO_SCHEMA, algo="dpo")


# --- replies that are several messages ---------------------------------------------------------


def test_validate_rows_dpo_multi_message_continuation_names_row_and_file() -> None:
    follow = {"role": "user", "content": "Sure?"}
    rows = [
        {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]},
        {"prompt": [USER], "chosen": [GOOD, follow, GOOD], "rejected": [BAD]},
    ]
    with pytest.raises(
        DatasetError,
        match=r"^dpo: dataset row 1 of pairs\.jsonl: key 'chosen' holds 3 message\(s\) with roles "
        r"'assistant', 'user', 'assistant'; as a chat list, 'chosen' must be exactly one "
        r"assistant message \(training on several turns after the prompt is not supported\)\.",
    ):
        validate_rows(rows, DPO_SCHEMA, algo="dpo", source="pairs.jsonl")


def test_validate_rows_sft_reply_with_user_role_is_refused() -> None:
    with pytest.raises(DatasetError, match=r"^sft: dataset row 0: key 'response' holds 1 message"):
        validate_rows([{"prompt": "p", "response": [USER]}], SFT_SCHEMA, algo="sft")
    validate_rows([{"prompt": "p", "response": [GOOD]}], SFT_SCHEMA, algo="sft")


def test_split_preference_rows_whole_conversations_split_others_kept() -> None:
    text_row = {"prompt": "p", "chosen": "c", "rejected": "r"}
    rows = split_preference_rows(
        [text_row, {"chosen": [USER, GOOD], "rejected": [USER, BAD]}], algo="dpo"
    )
    assert rows == [text_row, {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]}]


def test_split_preference_rows_diverging_early_fails_validation_with_row_and_file() -> None:
    # A transcript pair that differs before its last turn splits into several-message replies,
    # which the encoder cannot train on: refused at validation, not at the step that meets it.
    follow = {"role": "user", "content": "Sure?"}
    rows = [
        {"chosen": [USER, GOOD], "rejected": [USER, BAD]},
        {"chosen": [USER, GOOD, follow, GOOD], "rejected": [USER, BAD, follow, BAD]},
    ]
    split = split_preference_rows(rows, algo="dpo", source="hh.jsonl")
    with pytest.raises(DatasetError, match=r"^dpo: dataset row 1 of hh\.jsonl: key 'chosen' holds"):
        validate_rows(split, DPO_SCHEMA, algo="dpo", source="hh.jsonl")


def test_split_preference_rows_unsplittable_names_row_and_file() -> None:
    with pytest.raises(
        DatasetError,
        match=r"^dpo: dataset row 0 of hh\.jsonl has no 'prompt' and its chosen/rejected chat "
        r"lists cannot be split into one: 'chosen' and 'rejected' share no opening messages",
    ):
        split_preference_rows(
            [{"chosen": [USER, GOOD], "rejected": [GOOD, BAD]}], algo="dpo", source="hh.jsonl"
        )

"""Loaders turning the arithmetic fixture (``question``, ``answer``) into each algorithm's rows.

One raw fixture serves every smoke recipe: the smoke pack tests plumbing, not a task, so one
toy task is enough here (public recipes pick the task that suits each algorithm).
"""

from __future__ import annotations

from typing import Any


def _fields(row: dict[str, Any]) -> tuple[str, str]:
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise ValueError(f"smoke rows need text 'question' and 'answer'; got keys {sorted(row)}")
    return question, answer


def sft_loader(row: dict[str, Any]) -> dict[str, Any]:
    question, answer = _fields(row)
    return {"prompt": question, "response": f"The answer is {answer}."}


def preference_loader(row: dict[str, Any]) -> dict[str, Any]:
    question, answer = _fields(row)
    return {
        "prompt": question,
        "chosen": f"The answer is {answer}.",
        "rejected": "I cannot do sums, sorry!",
    }


def prompt_loader(row: dict[str, Any]) -> dict[str, Any]:
    question, answer = _fields(row)
    return {"prompt": question, "answer": answer}

"""Dataset loaders for math problems.

``gsm8k_loader`` and ``numina_loader`` return RL rows for word problems: ``prompt`` (a
one-message chat list asking for a boxed answer), ``answer`` (the reference final answer as
text) and ``solutions`` (reference texts to verify against). ``arith_loader`` and
``arith_sft_loader`` turn the arithmetic rows of :mod:`areno_recipes_math.arith`
(``question``, ``answer``) into plain-text RL and SFT rows.
"""

from __future__ import annotations

import re
from typing import Any

from areno_core.errors import DatasetError

INSTRUCTION = "Solve the problem step by step, then give the final answer as \\boxed{answer}."
_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)


def math_prompt(problem: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{problem.strip()}\n\n{INSTRUCTION}"}]


def gsm8k_final_answer(answer_text: str) -> str:
    """The value after ``####`` in a GSM8K answer, without thousands separators."""
    match = _GSM8K_FINAL.search(answer_text)
    if match is None:
        raise DatasetError(f"GSM8K answer has no '#### <value>' line: {answer_text[-80:]!r}")
    return match.group(1).replace(",", "").strip()


def gsm8k_loader(row: dict[str, Any]) -> dict[str, Any]:
    """Turn a GSM8K row (question, answer ending in ``#### value``) into an RL row."""
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str):
            raise DatasetError(f"GSM8K rows need a text {key!r} field; got keys {sorted(row)}")
    final = gsm8k_final_answer(row["answer"])
    return {"prompt": math_prompt(row["question"]), "answer": final, "solutions": [final]}


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (balanced braces), if any."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def numina_loader(row: dict[str, Any]) -> dict[str, Any] | None:
    """Turn a NuminaMath-style row (problem, solution with a boxed answer) into an RL row.

    Rows whose solution has no boxed answer are dropped (there is nothing to verify against).
    """
    problem, solution = row.get("problem"), row.get("solution")
    if not isinstance(problem, str) or not isinstance(solution, str):
        raise DatasetError(
            f"NuminaMath rows need text 'problem' and 'solution'; got keys {sorted(row)}"
        )
    final = last_boxed(solution)
    if final is None:
        return None
    return {"prompt": math_prompt(problem), "answer": final, "solutions": [solution]}


def _arith_fields(row: dict[str, Any]) -> tuple[str, str]:
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise DatasetError(f"arithmetic rows need text 'question' and 'answer'; got {row!r:.120}")
    return question.strip(), answer.strip()


def arith_prompt(question: str) -> str:
    """The plain-text prompt of an arithmetic question: ``"347+589"`` -> ``"347+589="``."""
    return f"{question}="


def arith_loader(row: dict[str, Any]) -> dict[str, Any]:
    """An arithmetic row as an RL row: plain-text prompt, the answer to match exactly."""
    question, answer = _arith_fields(row)
    return {"prompt": arith_prompt(question), "answer": answer, "solutions": [answer]}


def arith_sft_loader(row: dict[str, Any]) -> dict[str, Any]:
    """An arithmetic row as an SFT row: the answer's digits are the response (then EOS)."""
    question, answer = _arith_fields(row)
    return {"prompt": arith_prompt(question), "response": answer}

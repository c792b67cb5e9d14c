"""The echo task: the prompt asks the model to repeat a short text, and the reward says how
close the completion comes to doing that."""

from __future__ import annotations

from typing import Any

from areno_core.errors import DatasetError
from areno_core.types import RewardRecord

INSTRUCTION = "Repeat exactly: "


def echo_loader(row: dict[str, Any]) -> dict[str, Any]:
    """``{"text": ...}`` -> the online RL row schema: ``prompt`` and ``answer``."""
    text = row.get("text")
    if not isinstance(text, str) or not text:
        raise DatasetError(f"echo rows need a non-empty text 'text' field; got keys {sorted(row)}")
    return {"prompt": INSTRUCTION + text, "answer": text}


def echo_reward_fn(record: RewardRecord) -> float:
    """Half for covering the text's characters, half for repeating it from the first character.

    ``coverage`` is the share of the text's distinct characters that occur anywhere in the
    completion (a dense signal even a random model gets some of); ``prefix`` is the length of
    the common prefix of completion and text over the text's length. A completion that starts
    with the whole text scores 1.0; an empty one scores 0.0.
    """
    answer = record.answer or ""
    if not answer:
        return 0.0
    completion = record.completion
    coverage = len(set(answer) & set(completion)) / len(set(answer))
    matched = 0
    for expected, got in zip(answer, completion, strict=False):
        if expected != got:
            break
        matched += 1
    prefix = matched / len(answer)
    return 0.5 * coverage + 0.5 * prefix

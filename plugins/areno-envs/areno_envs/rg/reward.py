"""The ``rg`` reward: reasoning-gym's own ``score_answer`` of the row's task.

The row's ``"rg"`` metadata (written by the ``rg`` loaders) names the problem; the reward
regenerates that exact entry and asks the task's dataset to score the answer. With the
``chat`` format the answer is the last ``<answer>...</answer>`` of the completion (none
scores 0, as reasoning-gym's own evaluation does); with ``text`` it is the whole completion,
stripped.
"""

from __future__ import annotations

from typing import Any

from areno_envs.rg.generate import ROW_KEY, entry_for


def extract(completion: str, fmt: str) -> str | None:
    """The answer text reasoning-gym should score."""
    if fmt == "text":
        return completion.strip()
    from reasoning_gym.utils import extract_answer  # imported with reasoning-gym itself

    return extract_answer(completion)


def rg_reward_fn(record: Any) -> float:
    """Score one sample with its task's ``score_answer`` (0.0 to 1.0; some tasks give partial
    credit)."""
    meta = (getattr(record, "row", None) or {}).get(ROW_KEY)
    if not meta:
        raise ValueError(
            "the 'rg' reward needs rows made by an rg loader (they carry an 'rg' key); this "
            "row has keys " + ", ".join(sorted(getattr(record, "row", None) or {}))
        )
    dataset, entry = entry_for(meta)
    answer = extract(getattr(record, "completion", "") or "", str(meta.get("format", "chat")))
    return float(dataset.score_answer(answer, entry))

"""The ``vf`` reward: the verifiers task's own rubric on the conversation areno served.

Single-turn runs score the prompt and the sampled reply; multi-turn runs (the ``vf`` agent)
score the sample's whole conversation as the endpoint recorded it (``record.messages``), so
the rubric sees exactly what is trained.
"""

from __future__ import annotations

from typing import Any

from areno_envs.vf.episode import score
from areno_envs.vf.library import rebuild_task, verifiers
from areno_envs.vf.loader import ROW_KEY


def task_of(row: Any) -> Any:
    """The verifiers task a ``vf`` row carries."""
    meta = (row or {}).get(ROW_KEY)
    if not meta:
        raise ValueError(
            "the 'vf' reward and agent need rows made by the 'vf' loader (they carry a 'vf' "
            "key); this row has keys " + ", ".join(sorted(row or {}))
        )
    verifiers()
    return rebuild_task(meta["taskset"], meta["config"], meta["data"])


async def vf_reward_fn(record: Any) -> float:
    """The weighted sum of the task's rewards on the sample's conversation."""
    row = getattr(record, "row", None) or {}
    task = task_of(row)
    messages = list(record.messages)
    prompt_len = len(row.get("prompt") or ())
    if len(messages) <= prompt_len:  # no reply recorded: the completion is the reply
        messages.append({"role": "assistant", "content": record.completion})
    return await score(task, messages, prompt_len)

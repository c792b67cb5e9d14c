"""A task's prompt as chat messages, and a finished conversation scored by the task's rubric.

The conversation areno scores is the one its endpoint served (single-turn: the prompt and the
sampled reply; multi-turn: every request and reply of the sample). It becomes a
``vf.Trace`` whose nodes are those messages in order, the replies marked as sampled, and
``Task.score`` runs the task's ``@vf.reward`` functions (and its configured rewards and judges)
on it, as verifiers does after a rollout. The reward is ``trace.reward``: the weighted sum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from areno_core.errors import DatasetError


def prompt_messages(task: Any) -> list[dict[str, Any]]:
    """The chat messages an episode of ``task`` starts from: its system prompt, then its prompt
    (a text as one user message, or its own messages), as verifiers' chat loop sends them."""
    from verifiers.v1.dialects.chat import message_to_wire  # with verifiers itself

    data = task.data
    if data.prompt is None:
        raise DatasetError(
            f"verifiers task {data.idx} of {type(task).__name__} has no prompt; tasks whose "
            "user opens the conversation are not supported"
        )
    messages: list[dict[str, Any]] = []
    if data.system_prompt:
        messages.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        messages.extend(message_to_wire(m) for m in data.prompt)
    return messages


def build_trace(task: Any, messages: Sequence[Mapping[str, Any]], prompt_len: int) -> Any:
    """A ``vf.Trace`` of ``task`` holding ``messages`` as one branch; the assistant messages
    after the first ``prompt_len`` are the sampled ones."""
    import verifiers.v1 as vf  # optional dependency, imported by the caller's loader first
    from verifiers.v1.dialects.chat import parse_message  # with verifiers itself

    nodes = []
    for i, raw in enumerate(messages):
        message = parse_message(dict(raw))
        nodes.append(
            vf.MessageNode(
                parent=i - 1 if i else None,
                message=message,
                sampled=i >= prompt_len and message.role == "assistant",
            )
        )
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
    )
    trace.is_completed = True
    trace.ok = True
    return trace


async def score(task: Any, messages: Sequence[Mapping[str, Any]], prompt_len: int) -> float:
    """The task's rubric on the conversation: ``Task.score`` then the weighted sum of its
    rewards. A reward function that fails raises (areno counts it as a reward error)."""
    trace = build_trace(task, messages, prompt_len)
    await task.score(trace)
    missing = [name for name, value in trace.rewards.items() if value is None]
    if missing:
        raise DatasetError(f"verifiers rewards {missing} of {type(task).__name__} gave no score")
    return float(trace.reward)

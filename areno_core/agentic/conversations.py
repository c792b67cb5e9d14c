"""Split what one sample's endpoint served into linear conversations, one training row each.

An agent that reaches the policy through its sample's own URL (``item.base_url``) needs to
return no turns: the endpoint knows every choice it served to that sample, in order. Most
agents hold one conversation and send it back whole each turn, so every request's prompt starts
with the tokens of the choice before it (the endpoint reuses them exactly). Some branch: a
sub-agent with a prompt of its own, two requests sent in parallel from the same state, a retry
that edits the history. The rule:

* every served choice is a node; its parent is the earlier choice of the same sample whose
  prompt and sampled tokens are the longest exact token prefix of this request's prompt (none:
  the choice starts a conversation of its own);
* every leaf (a choice no later request continued) closes one linear conversation: the path
  from its root to it, which :func:`~areno_core.agentic.trajectory.build_trajectory` turns
  into one row (the row is the leaf's prompt followed by its sampled tokens);
* a choice on several paths (the point where a conversation branched) is trained in the
  first of them only, in the order the endpoint served the leaves; in the others its tokens
  are context (mask 0), so every sampled token is trained once, in the context it was sampled
  in.

A request that rewrote the history (its prompt continues no earlier choice exactly) therefore
starts a new row instead of cutting the old one back: both rows stay exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from areno_core.agentic.records import ServedCompletion


@attrs.frozen
class ServedNode:
    """One served choice: ``(response id, choice index)`` and its place in the tree."""

    response_id: str
    choice_index: int
    prompt_len: int
    length: int
    """Prompt plus sampled tokens."""
    parent: int | None


def conversation_paths(records: Sequence[ServedCompletion]) -> list[list[ServedNode]]:
    """The linear conversations of one sample's records (in the order served): one path of
    nodes per leaf, root first, leaves in the order they were served."""
    nodes: list[ServedNode] = []
    rows: list[tuple[int, ...]] = []
    for record in records:
        for choice in record.choices:
            prompt = choice.prompt_token_ids
            parent: int | None = None
            best = -1
            for k, row in enumerate(rows):
                if len(row) <= len(prompt) and len(row) > best and prompt[: len(row)] == row:
                    parent, best = k, len(row)
            nodes.append(
                ServedNode(
                    response_id=record.id,
                    choice_index=choice.index,
                    prompt_len=len(prompt),
                    length=len(prompt) + len(choice.token_ids),
                    parent=parent,
                )
            )
            rows.append(tuple(prompt) + tuple(choice.token_ids))
    continued = {node.parent for node in nodes if node.parent is not None}
    paths: list[list[ServedNode]] = []
    for k, node in enumerate(nodes):
        if k in continued:
            continue
        path = [node]
        while path[-1].parent is not None:
            path.append(nodes[path[-1].parent])
        paths.append(path[::-1])
    return paths


def untrained_spans(
    paths: Sequence[Sequence[ServedNode]],
) -> list[list[tuple[int, int]]]:
    """For each path, the ``[start, end)`` row positions of choices already trained in an
    earlier path (their mask becomes 0 there)."""
    seen: set[tuple[str, int]] = set()
    out: list[list[tuple[int, int]]] = []
    for path in paths:
        spans = []
        for node in path:
            key = (node.response_id, node.choice_index)
            if key in seen:
                spans.append((node.prompt_len, node.length))
            seen.add(key)
        out.append(spans)
    return out


__all__ = ["ServedNode", "conversation_paths", "untrained_spans"]
